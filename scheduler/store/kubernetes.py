"""A store in the cluster: one ConfigMap per group, one for the agents, in the scheduler's
namespace. A restarted (or newly elected) scheduler reloads holder, queue order, parked set
and epochs from them (invariant 6).

Why ConfigMaps and not the TimeSliceGroup status: the state holds lease-secret hashes and
the switch in flight, which belong with the scheduler's namespace-scoped RBAC, not in an
object every cluster reader sees; groups also exist without a TimeSliceGroup (PutGroup from
a config file or a CLI); and the status has one writer already, the operator.

Writes never block the event loop: `save_group` records the newest state per group and a
background task writes it (the latest call wins; a failed write is retried). `flush()`
returns once everything recorded is written.

When the API server refuses or does not answer (409 from a create race, 429 or 503 with
Retry-After, 500, a timeout), the write is retried with a backoff (at least the server's
Retry-After, at most 5 s) and `error` says why until a write succeeds again (the
scheduler's `rlslice_scheduler_store_healthy` gauge reads it).

A grant, or a switch that starts moving state, must be stored before it takes effect: the
engine awaits `commit(name)` (`commit_now` answers False: no write is at once), which writes that group's newest state at once (a 409
from a create race is retried on the object the other writer made; 429, 500 and timeouts
fail it) and raises `StoreError` naming the store when the write fails. Writes of one group
are serialized (a lock per group), so a slower background write never lands after, and
over, a commit's newer state.

One group cannot hold up the rest: the background writer takes the dirty groups (and the
agents' ConfigMap) in turn, and a group whose write fails waits out its own backoff while
the others are written. A refusal that names the object itself (400, 413, 422: too large
for a ConfigMap, invalid) can never succeed on a retry of that state: the group is
*poisoned*, logged at ERROR with its name and the API's reason, `error` (the health gauge)
names it, and its `commit` fails at once, so the engine gives back what it held for
that group. Its newest state is still tried every POISON_RETRY_SECONDS once it changed (a
job left, say); the first that lands clears the poison. `flush` does not wait for a
poisoned group.

`fence` (set by leader election through `fence_with`) is asked before every write: a replica that lost the
Lease writes nothing more (its unwritten states are dropped with an error in the log), so
a deposed leader's late flush can never overwrite what the new leader stored. `KubeAPI` (from the shared kernel,
`rlslice.adapters.kube`, on `kubernetes_asyncio`) is the client this store, the leader
election and the agent's Kubernetes mode share; it is re-exported here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from rlslice.adapters.kube import KubeAPI, KubeError, namespace_in_cluster
from rlslice.scheduler.core import GroupState
from rlslice.scheduler.store.base import AgentRecord, Loaded, StoreError
from rlslice.scheduler.store.codec import decode_group, encode_group

log = logging.getLogger(__name__)

STORE_LABEL = "rlslice.dev/store"

__all__ = ["KubeAPI", "KubeError", "KubernetesStore", "namespace_in_cluster"]

PERMANENT_STATUSES = frozenset({400, 413, 422})
"""Refusals of the object itself (invalid, too large): retrying the same state cannot help.
409, 429, 5xx and no answer are retried; 401/403 (credentials, RBAC) concern every object
alike and are retried too, so a fixed Role heals the store without a restart."""
POISON_RETRY_SECONDS = 30.0
"""How often a poisoned group's newest state is tried again, once it changed."""
_AGENTS = ""  # the agents' ConfigMap among the writer's keys (no group is named "")


@dataclass(slots=True)
class _Poison:
    """A key whose write the API server refused for good."""

    reason: str
    refused: object  # the state (or the agents' version) it refused
    retry_at: float


class KubernetesStore:
    """Group states and agents in ConfigMaps named `<prefix>-group-<group>` and
    `<prefix>-agents`, labelled `rlslice.dev/store=<prefix>`."""

    def __init__(self, api: KubeAPI, namespace: str, prefix: str = "rlslice-scheduler") -> None:
        self.api = api
        self.namespace = namespace
        self.prefix = prefix
        self._dirty: dict[str, GroupState | None] = {}  # None: delete
        self._agents: dict[str, AgentRecord] = {}
        self._agents_dirty = False
        self._agents_version = object()  # replaced on every agent change
        self._retry_at: dict[str, float] = {}  # per key: no attempt before (loop time)
        self._backoff: dict[str, float] = {}  # per key: the next transient failure's wait
        self._poisoned: dict[str, _Poison] = {}
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._writer: asyncio.Task[None] | None = None
        self._locks: dict[str, asyncio.Lock] = {}  # per group: one write at a time
        self._closed = False
        self.error: str | None = None
        """Why the last write failed; None once a write succeeded and no group is poisoned."""
        self.fence: Callable[[], bool] | None = None
        """Asked before every write; False: this replica may no longer write."""
        self.precondition: Callable[[], Awaitable[None]] | None = None
        """Awaited right before each API write (set by leader election: the Lease is still
        ours); raises KubeError (409) when it is not, so a deposed leader's write never lands."""

    @classmethod
    def from_spec(cls, spec: str) -> KubernetesStore:
        """`kubernetes` or `kubernetes:<prefix>`, in this pod's namespace (outside a pod:
        the kubeconfig's cluster, namespace `RLSLICE_NAMESPACE` or `default`)."""
        _, _, prefix = spec.partition(":")
        api = KubeAPI.from_environment()
        return cls(api, namespace_in_cluster(), prefix or "rlslice-scheduler")

    # --- names -------------------------------------------------------------------------

    def _path(self, name: str | None = None) -> str:
        base = f"/api/v1/namespaces/{self.namespace}/configmaps"
        return f"{base}/{name}" if name else base

    def _group_object(self, group: str) -> str:
        return f"{self.prefix}-group-{group}"

    @property
    def _agents_object(self) -> str:
        return f"{self.prefix}-agents"

    def _configmap(self, name: str, data: dict[str, str]) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": {
                    STORE_LABEL: self.prefix,
                    "app.kubernetes.io/name": "rlslice",
                    "app.kubernetes.io/component": "scheduler-state",
                },
            },
            "data": data,
        }

    # --- Store protocol ----------------------------------------------------------------

    async def load(self) -> Loaded:
        listing = await self.api.request(
            "GET", self._path() + f"?labelSelector={STORE_LABEL}%3D{self.prefix}"
        )
        groups: dict[str, GroupState] = {}
        agents: dict[str, AgentRecord] = {}
        group_prefix = f"{self.prefix}-group-"
        for item in listing.get("items") or []:
            meta = item.get("metadata") or {}
            if (meta.get("labels") or {}).get(STORE_LABEL) != self.prefix:
                continue  # an API server without label selectors (or a stranger)
            name = str(meta.get("name", ""))
            data = item.get("data") or {}
            if name.startswith(group_prefix) and "state" in data:
                state = decode_group(json.loads(data["state"]))
                groups[state.name] = state
            elif name == self._agents_object:
                for node, text in data.items():
                    record = json.loads(text)
                    record["backends"] = tuple(record["backends"])
                    record["device_total_bytes"] = tuple(record["device_total_bytes"])
                    agents[node] = AgentRecord(**record)
        self._agents = dict(agents)
        return Loaded(groups, agents)

    def save_group(self, state: GroupState) -> None:
        self._dirty[state.name] = state
        self._kick()

    def delete_group(self, name: str) -> None:
        self._dirty[name] = None
        self._kick()

    def save_agent(self, agent: AgentRecord) -> None:
        self._agents[agent.node] = agent
        self._agents_dirty = True
        self._agents_version = object()
        self._kick()

    def delete_agent(self, node: str) -> None:
        self._agents.pop(node, None)
        self._agents_dirty = True
        self._agents_version = object()
        self._kick()

    @property
    def healthy(self) -> bool:
        return self.error is None

    def fence_with(
        self, leading: Callable[[], bool], confirm: Callable[[], Awaitable[None]]
    ) -> None:
        """Write only while `leading()`; `confirm()` is awaited before each API write."""
        self.fence = leading
        self.precondition = confirm

    def commit_now(self, group: str) -> bool:
        return False  # every write is an HTTP call: await `commit`

    async def commit(self, name: str) -> None:
        """Write group `name`'s newest saved state now (nothing to do when the background
        writer has written it already). Raises `StoreError` when the API server refuses or
        does not answer; the state stays queued for the background writer."""
        async with self._lock(name):
            if name not in self._dirty:
                return
            if self.fence is not None and not self.fence():
                raise StoreError(f"{self._describe(name)}: not leading any more")
            poison = self._poisoned.get(name)
            if poison is not None:
                raise StoreError(f"{self._describe(name)}: refused for good: {poison.reason}")
            state = self._dirty[name]
            try:
                await self._write_group_once_more_on_conflict(name, state)
            except KubeError as error:
                self._refused(name, state, error, quiet=True)  # the engine logs it
                raise StoreError(f"{self._describe(name)}: {error}") from None
            if self._dirty.get(name) is state:  # not replaced meanwhile
                del self._dirty[name]
            self._landed(name)

    @property
    def poisoned(self) -> dict[str, str]:
        """Groups (and "" for the agents' ConfigMap) refused for good, with the reason."""
        return {key: poison.reason for key, poison in self._poisoned.items()}

    def _describe(self, name: str) -> str:
        return f"kubernetes store (ConfigMap {self.namespace}/{self._group_object(name)})"

    def _lock(self, name: str) -> asyncio.Lock:
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = asyncio.Lock()
        return lock

    async def _write_group_once_more_on_conflict(self, name: str, state: GroupState | None) -> None:
        try:
            await self._write_group(name, state)
        except KubeError as error:
            if error.status != 409:
                raise
            # A create race: the other writer's object exists now; patch that one.
            await self._write_group(name, state)

    async def flush(self) -> None:
        """Return once everything recorded is written, but for poisoned groups' states."""
        while self._pending() or not self._idle.is_set():
            self._kick()
            await self._idle.wait()

    async def close(self, timeout: float = 10.0) -> None:
        """Flush (for at most `timeout` seconds: the API may be gone) and stop writing."""
        try:
            await asyncio.wait_for(self.flush(), timeout)
        except TimeoutError:
            log.error("kubernetes store: unwritten state left after %.0fs", timeout)
        self._closed = True
        if self._writer is not None:
            self._writer.cancel()
            try:
                await self._writer
            except asyncio.CancelledError:
                pass
        await self.api.close()

    # --- the background writer ---------------------------------------------------------

    def _kick(self) -> None:
        if self._closed:
            return
        self._idle.clear()
        self._wake.set()
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(
                self._write_loop(), name="kubernetes-store-writer"
            )

    async def _write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self.fence is not None and not self.fence() and (self._dirty or self._agents_dirty):
                self._drop_unwritten()
            due, wait = self._schedule(loop.time())
            if not due:
                if not self._pending():
                    self._idle.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)
                self._wake.clear()
                continue
            for key in due:  # each due key once per round: a failing one blocks no other
                if self.fence is not None and not self.fence():
                    break
                if key == _AGENTS:
                    await self._write_agents()
                else:
                    await self._write_dirty_group(key)

    def _keys(self) -> list[str]:
        return [*self._dirty, *([_AGENTS] if self._agents_dirty else [])]

    def _current(self, key: str) -> object:
        return self._agents_version if key == _AGENTS else self._dirty.get(key)

    def _next_attempt(self, key: str) -> float | None:
        """Loop time of `key`'s next write; None: its state was refused for good."""
        poison = self._poisoned.get(key)
        if poison is None:
            return self._retry_at.get(key, 0.0)
        current = self._current(key)
        if current is poison.refused:
            return None
        return 0.0 if current is None else poison.retry_at  # a deletion goes at once

    def _schedule(self, now: float) -> tuple[list[str], float | None]:
        """The keys due now, and the seconds until the next one is (None: none waits)."""
        due: list[str] = []
        soonest: float | None = None
        for key in self._keys():
            at = self._next_attempt(key)
            if at is None:
                continue
            if at <= now:
                due.append(key)
            elif soonest is None or at < soonest:
                soonest = at
        return due, None if soonest is None else soonest - now

    def _pending(self) -> bool:
        """Whether something recorded is still to be written (poisoned groups aside)."""
        return any(key not in self._poisoned or self._current(key) is None for key in self._keys())

    def _refused(
        self, key: str, attempted: object, error: KubeError, *, quiet: bool = False
    ) -> None:
        now = asyncio.get_running_loop().time()
        name = self._agents_object if key == _AGENTS else self._group_object(key)
        what = (
            f"{'agents' if key == _AGENTS else 'group ' + key} (ConfigMap {self.namespace}/{name})"
        )
        if error.status in PERMANENT_STATUSES:
            self._poisoned[key] = _Poison(str(error), attempted, now + POISON_RETRY_SECONDS)
            self._retry_at.pop(key, None)
            self._backoff.pop(key, None)
            log.error(
                "kubernetes store: %s refused for good: %s; its commits fail until a "
                "newer state lands (tried every %gs); other groups are written on",
                what,
                error,
                POISON_RETRY_SECONDS,
            )
        else:
            backoff = self._backoff.get(key, 0.1)
            wait = min(max(backoff, error.retry_after or 0.0), 30.0)
            self._backoff[key] = min(backoff * 2, 5.0)
            poison = self._poisoned.get(key)
            if poison is not None:
                poison.retry_at = now + wait
            else:
                self._retry_at[key] = now + wait
            if not quiet:
                log.warning("kubernetes store: %s: %s; retrying in %.1fs", what, error, wait)
        self.error = str(error)

    def _landed(self, key: str) -> None:
        self._retry_at.pop(key, None)
        self._backoff.pop(key, None)
        if self._poisoned.pop(key, None) is not None:
            log.warning("kubernetes store: %s written again: no longer poisoned", key or "agents")
        self.error = self._poison_summary()

    def _poison_summary(self) -> str | None:
        if not self._poisoned:
            return None
        names = ", ".join(key or "(agents)" for key in list(self._poisoned)[:5])
        first = next(iter(self._poisoned.values())).reason
        return f"{len(self._poisoned)} refused for good ({names}): {first}"

    def _drop_unwritten(self) -> None:
        lost = len(self._dirty) + int(self._agents_dirty)
        self._dirty.clear()
        self._agents_dirty = False
        self._retry_at.clear()
        self._backoff.clear()
        self._poisoned.clear()
        self.error = f"not leading any more: {lost} unwritten state(s) dropped"
        log.error("kubernetes store: %s (the new leader has the store)", self.error)

    async def _write_dirty_group(self, name: str) -> None:
        async with self._lock(name):
            if name not in self._dirty:
                return  # a commit wrote it while this waited
            state = self._dirty[name]
            try:
                await self._write_group(name, state)
            except KubeError as error:
                self._refused(name, state, error)
                return
            if self._dirty.get(name) is state:  # not replaced meanwhile
                del self._dirty[name]
            self._landed(name)

    async def _write_agents(self) -> None:
        self._agents_dirty = False
        version = self._agents_version
        data = {
            node: json.dumps(asdict(a), separators=(",", ":")) for node, a in self._agents.items()
        }
        try:
            await self._put(self._agents_object, data)
        except KubeError as error:
            self._agents_dirty = True
            self._refused(_AGENTS, version, error)
            return
        self._landed(_AGENTS)

    async def _write_group(self, name: str, state: GroupState | None) -> None:
        if state is None:
            try:
                await self._check_precondition()
                await self.api.request("DELETE", self._path(self._group_object(name)))
            except KubeError as error:
                if error.status != 404:
                    raise
            return
        text = json.dumps(encode_group(state), separators=(",", ":"))
        await self._put(self._group_object(name), {"state": text})

    async def _check_precondition(self) -> None:
        """The leader's precondition (a deposed leader's late write is refused here)."""
        if self.precondition is not None:
            await self.precondition()

    async def _put(self, name: str, data: dict[str, str]) -> None:
        """Replace the ConfigMap's data (create it when missing)."""
        await self._check_precondition()
        body = self._configmap(name, data)
        try:
            # A JSON patch sets `data` wholly (a merge patch would keep deleted keys); "add"
            # also works where the API server dropped an empty `data`.
            await self.api.request(
                "PATCH",
                self._path(name),
                [{"op": "add", "path": "/data", "value": data}],
                content_type="application/json-patch+json",
            )
        except KubeError as error:
            if error.status != 404:
                raise
            await self.api.request("POST", self._path(), body)

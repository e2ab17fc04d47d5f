"""Leader election with a coordination.k8s.io/v1 Lease, so two scheduler replicas never
both act.

`decide()` is the pure rule (time passed in): take a missing or expired lease, renew our
own, otherwise wait. `LeaseElector` is the thin adapter: it reads the Lease and writes its
decision with a compare-and-swap (a JSON patch whose `test` operations pin the holder and
renew time it read), so of two replicas racing for an expired lease exactly one wins.

No replica compares another's wall clock with its own (as client-go does): the renewTime
in the Lease is only a change marker. A candidate judges someone else's lease expired once
it has seen the same record (`observe`: holder, renewTime, resourceVersion) unchanged for
the lease duration on its own monotonic clock (`expired`). A leader believes it leads only
until its last successful renewal plus the renew deadline (two thirds of the lease) on its
own monotonic clock, so it stops before any candidate can see its lease lapse, whatever the
wall clocks say.

`ElectedScheduler` runs `start_scheduler` only while this replica leads. The standby keeps
the gRPC port with a health service that says SERVING overall and NOT_SERVING for
`rlslice.v1alpha1.Scheduler`, and the metrics port with `rlslice_scheduler_leader 0`. A
replica that loses the lease stops its scheduler at once and stands by; the new leader
loads the state the old one stored (KubernetesStore).

Routing: every healthy replica is Ready (the chart's readiness probe asks for the overall
health, so `helm --wait`, kstatus and Argo CD see a finished rollout, and a budget can
count the standby); traffic reaches only the leader because the leader labels its own pod
`rlslice.dev/leader=true` once its scheduler serves, and sets it to `false` when it stands
by (at start, after losing the lease, on a clean stop). The chart's gRPC Service selects
that label; the metrics Service selects every replica. A leader that crashes cannot clear
its label, but its pod is then not Ready and leaves the endpoints until it restarts, and a
restarted replica clears the label before anything else. Why not a forwarding standby: it
would add a hop and a second failure mode to every Acquire, and split streams (Watch)
across two processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from rlslice.adapters.kube import KubeAPI, KubeError
from rlslice.scheduler.clock import LoopClock
from rlslice.scheduler.store import FencedStore

log = logging.getLogger(__name__)

LEADER_LABEL = "rlslice.dev/leader"
"""The pod label the leader sets to "true" (and every standby to "false")."""


@dataclass(frozen=True)
class LeaseRecord:
    """The fields of a Lease that election reads and writes (times in Unix seconds)."""

    holder: str
    duration: float
    acquired: float
    renewed: float
    transitions: int = 0

    @property
    def free(self) -> bool:
        """Released: no holder, anyone may take it at once. (Whether a held lease lapsed is
        judged on the reader's own clock, see `expired`, never from `renewed`.)"""
        return not self.holder


@dataclass(frozen=True)
class Decision:
    """What to write, and whether this replica leads once the write succeeds."""

    write: LeaseRecord | None
    """The record to write; None when there is nothing to write (someone else leads)."""
    create: bool = False
    """The Lease does not exist yet: create it instead of updating it."""

    @property
    def leading(self) -> bool:
        return self.write is not None


@dataclass(frozen=True)
class Observation:
    """A Lease record as this replica saw it, and since when (its own monotonic clock)."""

    key: tuple[object, ...]
    """What identifies the record: holder, renewTime, resourceVersion (any change resets)."""
    since: float


def observe(previous: Observation | None, key: tuple[object, ...], now: float) -> Observation:
    """The observation after reading a record identified by `key` at monotonic `now`: the
    old one when the record is unchanged, else a fresh one starting now."""
    if previous is not None and previous.key == key:
        return previous
    return Observation(key, now)


def expired(observation: Observation | None, now: float, lease_duration: float) -> bool:
    """Whether a record seen unchanged since `observation.since` has lapsed at monotonic
    `now` (never, without an observation)."""
    return observation is not None and now >= observation.since + lease_duration


def decide(
    current: LeaseRecord | None,
    me: str,
    now: float,
    duration: float,
    lapsed: bool = False,
) -> Decision:
    """The election rule, pure. `now` (wall time) only stamps what we write; `lapsed`
    says whether someone else's record has been seen unchanged for its lease duration on
    our monotonic clock (`expired`). A released record (no holder) is free at once."""
    if current is None:
        return Decision(LeaseRecord(me, duration, now, now, 0), create=True)
    if current.holder == me:
        return Decision(replace(current, renewed=now, duration=duration))
    if current.free or lapsed:
        return Decision(LeaseRecord(me, duration, now, now, current.transitions + 1))
    return Decision(None)


def released(current: LeaseRecord, me: str, now: float) -> LeaseRecord | None:
    """The record that hands the lease over at once (empty holder), if we hold it."""
    if current.holder != me:
        return None
    return replace(current, holder="", renewed=now)


# --- Lease objects <-> records (pure) -------------------------------------------------------


def format_time(seconds: float) -> str:
    """A Kubernetes MicroTime: RFC 3339 with microseconds, UTC."""
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str | None) -> float:
    """Unix seconds from a MicroTime (0 for none)."""
    if not text:
        return 0.0
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def record_from_lease(lease: dict[str, Any]) -> LeaseRecord:
    spec = lease.get("spec") or {}
    return LeaseRecord(
        holder=str(spec.get("holderIdentity") or ""),
        duration=float(spec.get("leaseDurationSeconds") or 0),
        acquired=parse_time(spec.get("acquireTime")),
        renewed=parse_time(spec.get("renewTime")),
        transitions=int(spec.get("leaseTransitions") or 0),
    )


def lease_spec(record: LeaseRecord) -> dict[str, Any]:
    return {
        "holderIdentity": record.holder,
        # The API wants whole seconds; round up so nobody reads a shorter lease.
        "leaseDurationSeconds": max(1, int(-(-record.duration // 1))),
        "acquireTime": format_time(record.acquired),
        "renewTime": format_time(record.renewed),
        "leaseTransitions": record.transitions,
    }


# --- the adapter ----------------------------------------------------------------------------


class LeaseElector:
    """Campaigns for one Lease; `leading` says whether this replica may act now."""

    def __init__(
        self,
        api: KubeAPI,
        namespace: str,
        name: str,
        identity: str,
        *,
        duration: float = 15.0,
        retry_period: float = 2.0,
        clock: Callable[[], float] | None = None,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        """`clock`: wall time, only stamped into the Lease; `monotonic`: this replica's own
        clock for every expiry judgement (default: the running loop's time)."""
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.duration = duration
        self.retry_period = retry_period
        # The loop's clock as Unix time, like the engine's; Lease times are Unix times
        # other replicas compare with theirs (the renew margin covers skew).
        self._clock: Callable[[], float] = clock if clock is not None else LoopClock()
        self._monotonic: Callable[[], float] = (
            monotonic if monotonic is not None else lambda: asyncio.get_running_loop().time()
        )
        self._valid_until = 0.0  # monotonic
        self._seen: dict[str, Any] | None = None  # the Lease's spec as last read
        self._version: str | None = None  # the Lease's resourceVersion as last read
        self._observation: Observation | None = None

    @property
    def renew_deadline(self) -> float:
        """How long after a successful renewal we still lead (our monotonic clock)."""
        return self.duration * 2 / 3

    @property
    def path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{self.name}"

    @property
    def leading(self) -> bool:
        """True until the renew deadline after our last successful write (monotonic)."""
        return self._monotonic() < self._valid_until

    def step_down(self) -> None:
        """Stop leading at once (a store write found the state no longer ours)."""
        self._valid_until = 0.0

    async def confirm(self) -> None:
        """The store's write precondition: we lead by our own clock and the Lease, read
        now, still names us. Otherwise step down and raise KubeError 409 (Conflict), so a
        deposed leader's late write does not land."""
        if self.leading:
            lease = await self.api.request("GET", self.path)
            holder = str((lease.get("spec") or {}).get("holderIdentity") or "")
            if holder == self.identity and self.leading:
                return
            detail = f"held by {holder or 'nobody'}"
        else:
            detail = "renew deadline passed"
        self.step_down()
        raise KubeError(409, f"lease {self.namespace}/{self.name} is not ours any more: {detail}")

    async def step(self) -> bool:
        """Read, decide, write once; whether we lead afterwards. API errors: not leading
        (once the renew deadline after our last renewal has passed)."""
        started = self._monotonic()
        try:
            current = await self._read()
            lapsed = False
            if current is not None and current.holder not in ("", self.identity):
                seen = self._seen or {}
                key = (current.holder, seen.get("renewTime"), self._version)
                seen_at = self._monotonic()
                self._observation = observe(self._observation, key, seen_at)
                lapsed = expired(self._observation, seen_at, current.duration)
            else:
                self._observation = None
            decision = decide(current, self.identity, self._clock(), self.duration, lapsed)
            if decision.write is not None:
                await self._write(decision.write, create=decision.create)
                self._valid_until = started + self.renew_deadline
                self._observation = None
        except KubeError as error:
            if error.status not in (409, 422, 500):  # 409/422/500: lost a race, not a fault
                log.warning("leader election: %s", error)
        return self.leading

    async def release(self) -> None:
        """Hand the lease over at once (on a clean shutdown)."""
        self._valid_until = 0.0
        try:
            current = await self._read()
            if current is not None:
                record = released(current, self.identity, self._clock())
                if record is not None:
                    await self._write(record, create=False)
        except KubeError as error:
            log.warning("leader election: releasing: %s", error)

    async def _read(self) -> LeaseRecord | None:
        try:
            lease = await self.api.request("GET", self.path)
        except KubeError as error:
            if error.status == 404:
                self._seen = None
                self._version = None
                return None
            raise
        self._seen = dict(lease.get("spec") or {})
        self._version = (lease.get("metadata") or {}).get("resourceVersion")
        return record_from_lease(lease)

    async def _write(self, record: LeaseRecord, *, create: bool) -> None:
        if create:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": lease_spec(record),
            }
            await self.api.request("POST", self.path.rsplit("/", 1)[0], body)
            return
        # Compare-and-swap: the write applies only if the Lease is still as we read it.
        seen = self._seen or {}
        ops: list[dict[str, Any]] = [
            {"op": "test", "path": f"/spec/{field}", "value": seen[field]}
            for field in ("holderIdentity", "renewTime")
            if field in seen
        ]
        ops.append({"op": "add", "path": "/spec", "value": lease_spec(record)})
        await self.api.request("PATCH", self.path, ops, content_type="application/json-patch+json")


class PodLabel:
    """Keeps `rlslice.dev/leader` on this replica's own pod in step with its role."""

    def __init__(self, api: KubeAPI, namespace: str, pod: str) -> None:
        self.api = api
        self.namespace = namespace
        self.pod = pod
        self.written: bool | None = None
        """The value last written successfully (None: not yet)."""

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods/{self.pod}"

    async def set(self, leading: bool) -> bool:
        """Write the label when it differs from what we last wrote; whether it is in step.
        API errors are logged and leave it out of step (the next campaign step retries)."""
        if self.written is leading:
            return True
        patch = {"metadata": {"labels": {LEADER_LABEL: "true" if leading else "false"}}}
        try:
            await self.api.request(
                "PATCH", self.path, patch, content_type="application/merge-patch+json"
            )
        except KubeError as error:
            log.warning("leader label on pod %s: %s", self.pod, error)
            return False
        self.written = leading
        return True


class _LeaderCollector:
    """`rlslice_scheduler_leader`: 1 on the replica that leads, 0 on a standby."""

    def __init__(self, value: float) -> None:
        self._value = value

    def collect(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        family = GaugeMetricFamily(
            "rlslice_scheduler_leader", "1 while this replica holds the scheduler Lease"
        )
        family.add_metric([], self._value)
        yield family


class ElectedScheduler:
    """A scheduler replica that serves only while it holds the Lease."""

    def __init__(self, settings: Any, elector: LeaseElector, *, pod: str | None = None) -> None:
        """`pod`: this replica's pod (in the elector's namespace), labelled with its role;
        None labels nothing."""
        self.settings = settings
        self.elector = elector
        self.running: Any = None  # RunningScheduler while leading
        self._standby: Any = None  # grpc.aio.Server while standing by
        self._standby_metrics: Any = None  # the standby's /metrics HTTP server
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self.address: str = settings.address
        self.metrics_port: int | None = settings.metrics_port
        self.label = PodLabel(elector.api, elector.namespace, pod) if pod else None

    async def start(self) -> None:
        """Bind the port as a standby and start campaigning."""
        from rlslice.scheduler.settings import check_exposure

        check_exposure(self.settings)  # a standby's port is as reachable as a leader's
        await self._stand_by()
        if self.label is not None:
            await self.label.set(False)  # a restarted leader's stale label goes first
        self._task = asyncio.get_running_loop().create_task(self._campaign(), name="election")

    @property
    def leading(self) -> bool:
        return self.running is not None

    async def wait_changed(self) -> None:
        """Return at the next change of leadership."""
        self._changed.clear()
        await self._changed.wait()

    async def _campaign(self) -> None:
        while True:
            leading = await self.elector.step()
            if leading and self.running is None:
                try:
                    await self._lead()
                except Exception:  # the store or the port: stand by, hand over, retry
                    log.exception("could not start leading %s", self.elector.name)
                    if self._standby is None:
                        await self._stand_by()
                    await self.elector.release()
            elif not leading and self.running is not None:
                log.warning("lost the lease %s: stopping the scheduler", self.elector.name)
                await self._step_down()
            if self.label is not None:
                await self.label.set(self.running is not None)
            await asyncio.sleep(self.elector.retry_period)

    async def _lead(self) -> None:
        from rlslice.scheduler.server import start_scheduler

        await self._stop_standby()
        self.running = await start_scheduler(
            self.settings.model_copy(
                update={"address": self.address, "metrics_port": self.metrics_port}
            )
        )
        self.running.metrics.registry.register(_LeaderCollector(1.0))
        store = self.running.engine.store
        if isinstance(store, FencedStore):  # shared by the replicas: none once the Lease is lost
            store.fence_with(lambda: self.elector.leading, self.elector.confirm)
        log.info("leading %s as %s", self.elector.name, self.elector.identity)
        self._changed.set()

    async def _step_down(self) -> None:
        running, self.running = self.running, None
        await running.stop(0)
        await self._stand_by()
        self._changed.set()

    async def _stand_by(self) -> None:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        from grpc_health.v1._async import HealthServicer

        from rlslice.adapters.channel import SERVER_OPTIONS, add_port
        from rlslice.scheduler.server import SERVICE_NAME

        server = grpc.aio.server(options=SERVER_OPTIONS)
        health = HealthServicer()
        await health.set("", health_pb2.HealthCheckResponse.SERVING)
        await health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.NOT_SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        host = self.address.rsplit(":", 1)[0]
        port = add_port(server, self.address, self.settings.tls)
        if port == 0:
            raise OSError(f"address: cannot bind {self.address}")
        self.address = f"{host}:{port}"  # keep the port for the scheduler that follows
        await server.start()
        self._standby = server
        if self.metrics_port is not None:
            # The standby is scraped too (no TargetDown on a healthy install).
            from prometheus_client import CollectorRegistry, start_http_server

            registry = CollectorRegistry()
            registry.register(_LeaderCollector(0.0))
            metrics, _ = start_http_server(
                self.metrics_port, addr=self.settings.metrics_address, registry=registry
            )
            self.metrics_port = int(metrics.server_port)
            self._standby_metrics = metrics

    async def _stop_standby(self) -> None:
        if self._standby is not None:
            await self._standby.stop(0)
            self._standby = None
        if self._standby_metrics is not None:
            metrics, self._standby_metrics = self._standby_metrics, None
            await asyncio.to_thread(metrics.shutdown)  # waits for the serving thread
            metrics.server_close()

    async def stop(self, *, release: bool = True) -> None:
        """Stop campaigning and serving; `release=False` leaves the lease to expire
        (what a crash does)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.running is not None:
            running, self.running = self.running, None
            await running.stop(0)
        await self._stop_standby()
        if release:
            if self.label is not None:
                await self.label.set(False)
            await self.elector.release()
        await self.elector.api.close()

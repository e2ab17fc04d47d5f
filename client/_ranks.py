"""Jobs of many ranks: every process of a torch.distributed job takes turns as one job.

One rank asks for the job. Rank 0 registers the job with the scheduler and makes the one
Acquire (and the one Yield) of each phase; the other ranks wait on a collective of their
own (a gloo group, so it runs beside NCCL) around rank 0's call, so every rank enters a
phase once the job holds the group, and no rank leaves it before every rank is done:

    enter:  rank 0 acquires  ->  broadcast of the grant (or of the error)  ->  all go on
    leave:  barrier of every rank (quiesce: no collective in flight)  ->  rank 0 yields
            ->  broadcast of the outcome  ->  all go on

Every rank's process is known to the node's agent, each under the same job: an `app` job
registers each rank through its offload loop (`serve_offload`), a job moved by another
backend through this client (`RLSLICE_AGENT_SOCKET`), so a switch moves every rank or none.

Ranks come from torch.distributed when it is initialised, else from the launcher's
`RANK`/`WORLD_SIZE`/`LOCAL_RANK` (torchrun, Slurm with `srun`), else the job is one rank.
`RLSLICE_RANKS=one` treats the process as a one-rank job whatever the variables say.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from rlslice import env as env_names
from rlslice._errors import AbortedError, DeadlineExceededError, InvalidArgumentError
from rlslice.client._local import register_with_agent
from rlslice.client._results import Grant, YieldResult
from rlslice.client._settings import ENV_AGENT_REGISTERED, resolve_settings
from rlslice.client._sync_client import Client

log = logging.getLogger("rlslice.client")

ENV_RANKS = env_names.RANKS
#: Seconds a rank waits for the others at a phase's edge before the job fails (default).
DEFAULT_QUIESCE_SECONDS = 300.0


@dataclass(frozen=True)
class Ranks:
    """Where this process sits in its job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    source: str = "single"
    """"torch.distributed", "env", "single" (nothing said otherwise) or "opt-out"."""

    @property
    def leader(self) -> bool:
        """Rank 0: the rank that asks the scheduler for the job."""
        return self.rank == 0

    @property
    def single(self) -> bool:
        """A job of one rank: nothing to coordinate."""
        return self.world_size == 1


def _int(env: Mapping[str, str], name: str, default: int | None) -> int | None:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise InvalidArgumentError(f"{name}: {text!r} is not an integer") from None


def ranks_from(env: Mapping[str, str], distributed: tuple[int, int] | None = None) -> Ranks:
    """This process's ranks from `distributed` ((rank, world size) of an initialised
    torch.distributed), else from the launcher's variables in `env`; validated."""
    opt = env.get(ENV_RANKS, "").strip()
    if opt and opt != "one":
        raise InvalidArgumentError(f"{ENV_RANKS}: {opt!r} is not 'one' (or unset)")
    if opt == "one":
        return Ranks(source="opt-out")
    local = _int(env, "LOCAL_RANK", None)
    if distributed is not None:
        rank, world, source = distributed[0], distributed[1], "torch.distributed"
    else:
        rank_var, world_var = _int(env, "RANK", None), _int(env, "WORLD_SIZE", None)
        if rank_var is None and world_var is None:
            return Ranks()
        if rank_var is None or world_var is None:
            missing = "RANK" if rank_var is None else "WORLD_SIZE"
            raise InvalidArgumentError(
                f"{missing}: unset while {'WORLD_SIZE' if missing == 'RANK' else 'RANK'} is "
                f"set; set both, or {ENV_RANKS}=one for a one-rank job"
            )
        rank, world, source = rank_var, world_var, "env"
    if world < 1:
        raise InvalidArgumentError(f"WORLD_SIZE: {world} is not a positive number of ranks")
    if not 0 <= rank < world:
        raise InvalidArgumentError(f"RANK: {rank} is not in 0..{world - 1} (WORLD_SIZE {world})")
    return Ranks(rank, world, local if local is not None else rank, source)


def _torch_distributed() -> tuple[int, int] | None:
    """(rank, world size) of torch.distributed, if this process imported and initialised it."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return int(dist.get_rank()), int(dist.get_world_size())


def detect_ranks(env: Mapping[str, str] | None = None) -> Ranks:
    """This process's ranks: torch.distributed, else `RANK`/`WORLD_SIZE`, else one rank."""
    environment = os.environ if env is None else env
    if environment.get(ENV_RANKS, "").strip() == "one":
        return Ranks(source="opt-out")
    return ranks_from(environment, _torch_distributed())


class RankCoordinator(Protocol):
    """The collectives the ranks of one job meet on (one implementation per transport)."""

    def share(self, value: object) -> object:
        """Every rank calls it; every rank gets rank 0's `value` back."""
        ...

    def barrier(self, what: str) -> None:
        """Every rank calls it; returns once every rank did. Raises DeadlineExceededError
        naming the ranks that did not come, past the coordinator's timeout."""
        ...


class TorchCoordinator:
    """The job's ranks meet on a gloo group of their own (created here: every rank must
    construct it together, after `init_process_group`), so the coordination runs on the
    CPU whatever the training's backend is, and never interleaves with its collectives."""

    def __init__(self, *, timeout_seconds: float = DEFAULT_QUIESCE_SECONDS) -> None:
        from datetime import timedelta

        import torch.distributed as dist

        if not dist.is_initialized():
            raise InvalidArgumentError(
                "ranks: torch.distributed is not initialised (call init_process_group first)"
            )
        self._dist = dist
        self._timeout = timedelta(seconds=timeout_seconds)
        self._group = dist.new_group(backend="gloo", timeout=self._timeout)

    def share(self, value: object) -> object:
        box = [value]
        try:
            self._dist.broadcast_object_list(box, src=0, group=self._group)
        except RuntimeError as error:  # a rank died or its connection broke
            raise AbortedError(
                f"ranks: the job's ranks lost each other: {_first(error)}"
            ) from error
        return box[0]

    def barrier(self, what: str) -> None:
        try:
            # monitored_barrier names the ranks that did not arrive (on rank 0), and fails
            # every waiting rank past the timeout instead of hanging.
            self._dist.monitored_barrier(
                group=self._group, timeout=self._timeout, wait_all_ranks=True
            )
        except RuntimeError as error:
            raise DeadlineExceededError(f"ranks: {what}: {_first(error)}") from error


def _first(error: BaseException) -> str:
    """The first line of an error from torch.distributed (its messages run long)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else repr(error)


@dataclass(frozen=True)
class _Failed:
    """What rank 0 shares when its call failed: the others raise the same."""

    kind: str
    message: str


def _failure(error: BaseException) -> _Failed:
    return _Failed(type(error).__name__, str(error))


def _raise_shared(value: object, rank: int, what: str) -> None:
    if isinstance(value, _Failed):
        raise AbortedError(
            f"ranks: rank {rank}: rank 0 could not {what}: {value.kind}: {value.message}"
        )


class RankedClient:
    """A `Client` for a job of many ranks: rank 0 asks for the job (see the module doc).

    >>> dist.init_process_group("gloo")                          # doctest: +SKIP
    >>> client = RankedClient(job="ddp-a", group="gpus")          # every rank, together
    >>> with client.phase("train"):                               # every rank, together
    ...     train_step()

    `ranks` and `coordinator` default to `detect_ranks()` and a `TorchCoordinator`; the
    other arguments are `Client`'s and are used on rank 0 only. A rank that is not rank 0
    registers its own process with the node's agent (`RLSLICE_AGENT_SOCKET`), unless
    `register_with_agent=False` (an `app` job's offload loop registers it).
    """

    def __init__(
        self,
        job: str | None = None,
        group: str | None = None,
        scheduler: str | None = None,
        *,
        ranks: Ranks | None = None,
        coordinator: RankCoordinator | None = None,
        quiesce_seconds: float = DEFAULT_QUIESCE_SECONDS,
        register_with_agent: bool = True,
        **client_options: Any,
    ) -> None:
        self.ranks = ranks if ranks is not None else detect_ranks()
        self._coordinator = coordinator
        if coordinator is None and not self.ranks.single:
            self._coordinator = TorchCoordinator(timeout_seconds=quiesce_seconds)
        self._client: Client | None = None
        if self.ranks.leader:
            self._client = Client(job, group, scheduler, **client_options)
            self.job, self.group = self._client.job, self._client.group
        else:
            settings = resolve_settings(
                job=job, group=group, scheduler=scheduler, lease_seconds=None, token=None,
                tls=None, priority=None, weight=None, env=os.environ,
            )  # fmt: skip
            self.job, self.group = settings.job, settings.group
            if register_with_agent and settings.agent_socket and settings.job and settings.group:
                _register_rank(settings.agent_socket, settings.job, settings.group, self.ranks)

    @property
    def client(self) -> Client | None:
        """Rank 0's `Client` (None on the other ranks)."""
        return self._client

    def _shared(self, call: Any, what: str) -> object:
        """Rank 0 runs `call`; every rank gets its result, or raises what it raised."""
        value: object = None
        if self._client is not None:
            try:
                value = call()
            except Exception as error:
                if self._coordinator is None:
                    raise
                try:  # tell the other ranks; a rank that is gone cannot be told
                    self._coordinator.share(_failure(error))
                except AbortedError as lost:
                    log.error("rank 0 of job %r: %s", self.job, lost)
                raise
        if self._coordinator is None:
            return value
        value = self._coordinator.share(value)
        _raise_shared(value, self.ranks.rank, what)
        return value

    @contextmanager
    def phase(self, name: str, group: str | None = None) -> Iterator[Grant | None]:
        """Hold the job's group for a block, on every rank together. The `as` value is the
        grant (rank 0's, shared with every rank)."""
        holder = self._client.phase(name, group) if self._client is not None else None
        grant = self._shared(lambda: holder.__enter__() if holder else None, f"acquire {name!r}")
        assert grant is None or isinstance(grant, Grant)
        try:
            yield grant
        finally:
            self._leave(name, holder)

    def _leave(self, name: str, holder: Any) -> None:
        failed: BaseException | None = None
        if self._coordinator is not None:
            try:  # quiesce: every rank is past its last collective of the phase
                self._coordinator.barrier(f"end of phase {name!r}")
            except DeadlineExceededError as error:
                failed = error
        if failed is not None:
            # The job cannot go on: give the group back (rank 0), and say why on every rank.
            if holder is not None:
                holder.__exit__(None, None, None)
            raise failed
        self._shared(
            lambda: holder.__exit__(None, None, None) if holder else None, f"yield {name!r}"
        )

    def yield_(self, group: str | None = None) -> YieldResult | None:
        """Give the group up between phases (rank 0's call, shared); see `Client.yield_`."""
        shared = self._shared(lambda: self._client.yield_(group) if self._client else None, "yield")
        return shared if isinstance(shared, YieldResult) else None

    def close(self, **kwargs: Any) -> None:
        """Close rank 0's client (see `Client.close`); the other ranks hold nothing."""
        if self._client is not None:
            self._client.close(**kwargs)


def _register_rank(socket_path: str, job: str, group: str, ranks: Ranks) -> None:
    if os.environ.get(ENV_AGENT_REGISTERED):
        return
    answer = register_with_agent(socket_path, job, group)
    os.environ[ENV_AGENT_REGISTERED] = "1"
    log.info(
        "rank %d of job %r: pid %d registered on node %s", ranks.rank, job, answer.pid, answer.node
    )

"""`start_scheduler(settings) -> RunningScheduler`: the one way to run a scheduler.

Used by `rlslice scheduler`, standalone `rlslice up`, the client's testing kit, the demo
and the operator's deployment. The health service reports NOT_SERVING until the store is
loaded and interrupted switches are resumed, SERVING after, and NOT_SERVING again while
stopping.
"""

from __future__ import annotations

import asyncio
import gc
import logging

from rlslice.adapters.auth import Role, local_agent_token
from rlslice.adapters.server import GrpcServer
from rlslice.scheduler.clock import LoopClock
from rlslice.scheduler.coordinator import Coordinator
from rlslice.scheduler.engine import Engine
from rlslice.scheduler.metrics import SchedulerMetrics
from rlslice.scheduler.service import METHOD_ROLES, SchedulerService
from rlslice.scheduler.settings import SchedulerSettings, check_exposure
from rlslice.scheduler.store import Store, open_store
from rlslice.v1alpha1 import scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger(__name__)
SERVICE_NAME = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name


def _freeze_startup_heap() -> None:
    """Move what exists after start-up out of the collector's generations (once a process).

    Modules, classes and functions of grpc, protobuf, pydantic and prometheus_client are
    ~45k tracked objects that live as long as the process; every full collection walked them
    all, and a full collection stops the event loop (the tail of the acquire latency, see
    docs/benchmarks.md, `scale`). Garbage cycles are collected first, so nothing frozen is
    garbage yet; frozen objects are still freed by reference counting when dropped (as the
    states loaded from the store are). What a frozen cycle costs: the collector never frees
    it, so this scheduler's own start-up objects (server, engine) stay after it stops, which
    matters only in a process that starts several schedulers (tests), and only once.
    """
    # Once a process, unless something unfroze the heap since (a bench driver does).
    if gc.get_freeze_count() > 0:
        return
    gc.collect()
    gc.freeze()


class RunningScheduler:
    """A started scheduler. Stop it with `await stop(grace)`."""

    def __init__(
        self,
        grpc_server: GrpcServer,
        engine: Engine,
        coordinator: Coordinator,
        metrics: SchedulerMetrics,
        address: str,
        metrics_port: int | None,
    ) -> None:
        self._grpc = grpc_server
        self.server = grpc_server.server
        self.engine = engine
        self.coordinator = coordinator
        self.metrics = metrics
        self.address = address
        """`host:port` actually bound (the real port when 0 was asked for)."""
        self.metrics_port = metrics_port
        """Port of the Prometheus endpoint, or None when metrics are off."""
        self._stopped = asyncio.Event()
        self._stopping = False

    async def stop(self, grace: float = 5.0) -> None:
        """Stop serving: waiters fail with UNAVAILABLE, calls in flight get `grace` seconds."""
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        await self._grpc.set_serving(False)
        await self.engine.close()
        await self._grpc.stop(grace)
        await self.coordinator.close()
        await self.engine.store.close()
        self.metrics.close()
        self._stopped.set()
        log.info("scheduler on %s stopped", self.address)

    async def wait_closed(self) -> None:
        """Return once `stop` has finished."""
        await self._stopped.wait()


def _local_agent_token() -> str | None:
    """The node-local agent token, or None (with a warning) where it cannot be made: a
    scheduler without a home (systemd DynamicUser) still starts; agents then refuse it."""
    try:
        return local_agent_token()
    except OSError as error:
        log.warning("no agent token configured and no node-local one: %s", error)
        return None


async def start_scheduler(
    settings: SchedulerSettings, *, store: Store | None = None
) -> RunningScheduler:
    """Load state, resume interrupted switches, bind the port, and serve.

    `store` overrides `settings.store` with any `Store` implementation (the Kubernetes
    store, or one `MemoryStore` shared by two schedulers in a test of restarts).
    """
    check_exposure(settings)
    metrics = SchedulerMetrics()
    clock = LoopClock()  # one clock for the engine's state and timers and the switch timings
    coordinator = Coordinator(
        # Agents refuse calls without their token: with none configured, the node-local one
        # (a 0600 file of this user) is what an agent on this host, run by this user, takes.
        token=settings.agent_token or _local_agent_token(),
        tls=settings.agent_tls,
        rpc_timeout=settings.rpc_timeout_seconds,
        status_timeout=settings.status_timeout_seconds,
        retries=settings.agent_retries,
        backoff=settings.retry_backoff_seconds,
        clock=clock,
        agent_expiry_seconds=settings.agent_expiry_seconds,
    )
    engine = Engine(
        store if store is not None else open_store(settings.store),
        coordinator,
        metrics,
        auto_create_groups=settings.auto_create_groups,
        max_jobs_per_group=settings.max_jobs_per_group,
        max_groups=settings.max_groups,
        host_reserve_bytes=settings.host_reserve_bytes,
        ring_size=settings.event_ring_size,
        watch_queue_size=settings.watch_queue_size,
        clock=clock,
    )
    coordinator.groups = lambda: [runtime.state for runtime in engine.groups.values()]

    def agent_removed(node: str) -> None:
        engine.store.delete_agent(node)
        metrics.agents.set(len(coordinator.agents))

    coordinator.on_removed = agent_removed
    grpc_server = await GrpcServer.create(
        tokens={
            Role.JOB: settings.job_token,
            Role.ADMIN: settings.admin_token,
            Role.AGENT: settings.agent_token,
        },
        methods=METHOD_ROLES,
        services=(SERVICE_NAME,),
    )
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(
        SchedulerService(engine, coordinator), grpc_server.server
    )
    address = await grpc_server.start(settings.address, settings.tls)
    try:
        for agent in (await engine.start(settings.groups)).values():
            coordinator.add_agent(agent)
        metrics.agents.set(len(coordinator.agents))
        engine.recover()
        _freeze_startup_heap()
        metrics_port = None
        if settings.metrics_port is not None:
            metrics_port = metrics.serve(settings.metrics_address, settings.metrics_port)
    except BaseException:
        await grpc_server.stop(0)
        raise
    await grpc_server.set_serving(True)
    log.info("scheduler serving on %s (store %s)", address, settings.store)
    return RunningScheduler(grpc_server, engine, coordinator, metrics, address, metrics_port)

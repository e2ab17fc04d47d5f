"""Start a whole agent: engine, Agent service on TCP, LocalAgent on the Unix socket, health,
metrics, and registration with the scheduler."""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from rlslice.adapters.auth import Role, local_agent_token
from rlslice.adapters.channel import SERVER_OPTIONS
from rlslice.adapters.net import host_of
from rlslice.adapters.server import (
    GrpcServer,
    MetricsEndpoint,
    check_exposure,
    join_host_port,
    serve_metrics,
)
from rlslice.snapshot_agent.engine import AgentEngine
from rlslice.snapshot_agent.local_service import LocalAgentServicer
from rlslice.snapshot_agent.metrics import AgentMetrics
from rlslice.snapshot_agent.peercred import PeerCredRelay, private_folder
from rlslice.snapshot_agent.processes import ProcessSource
from rlslice.snapshot_agent.scheduler_link import SchedulerLink
from rlslice.snapshot_agent.service import METHOD_ROLES, AgentServicer
from rlslice.snapshot_agent.settings import AgentSettings
from rlslice.snapshot_agent.tiering import Tiering
from rlslice.v1alpha1 import agent_pb2_grpc, scheduler_pb2

log = logging.getLogger(__name__)

SERVICE_NAME = "rlslice.v1alpha1.Agent"


@dataclass
class RunningAgent:
    """A started agent. `stop()` it when done."""

    settings: AgentSettings
    address: str
    """Where the Agent service listens, `host:port` with the bound port."""
    advertised: str
    """Address sent to the scheduler."""
    socket_path: Path
    """The LocalAgent Unix socket."""
    node: str
    engine: AgentEngine
    metrics: AgentMetrics
    metrics_port: int | None
    """Port of the Prometheus endpoint, if one was asked for."""
    scheduler_link: SchedulerLink | None
    _grpc: GrpcServer
    _local_server: grpc.aio.Server
    _relay: PeerCredRelay
    token: str = field(default="", repr=False)
    """The token every Agent call must present: `settings.token`, else the node-local one
    (`rlslice.adapters.auth.local_agent_token`)."""
    _metrics: MetricsEndpoint | None = None

    async def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving: new calls are refused, calls under way get `grace` seconds."""
        await self._grpc.set_serving(False)
        if self.scheduler_link is not None:
            await self.scheduler_link.stop()
        await self._relay.stop()
        await asyncio.gather(self._grpc.stop(grace), self._local_server.stop(grace))
        await self.engine.close()
        if self._metrics is not None:
            self._metrics.close()


def _check_exposure(settings: AgentSettings) -> None:
    # TLS without client certificates encrypts but proves no caller: it needs the token too.
    check_exposure(
        settings.address,
        {Role.AGENT: settings.token},
        settings.tls,
        token_flags={Role.AGENT: "--token-file (or RLSLICE_AGENT_TOKEN)"},
    )


def _advertise(settings: AgentSettings, port: int) -> str:
    if settings.advertise_address:
        return settings.advertise_address
    host = host_of(settings.address)
    if host in ("0.0.0.0", "::", ""):
        host = socket.getfqdn()
    return join_host_port(host, port)


async def start_agent(
    settings: AgentSettings, *, processes: ProcessSource | None = None
) -> RunningAgent:
    """Start an agent with `settings` and return it running; `processes`, when given, is
    asked before every move to bring the jobs' processes up to date (Kubernetes mode)."""
    _check_exposure(settings)
    # Never open, not even on loopback: any local user could freeze or drop any job. With
    # no token configured the node-local one (a 0600 file of this user) stands in.
    token = settings.token or local_agent_token()
    metrics = AgentMetrics(settings.node)
    engine = AgentEngine(
        node=settings.node,
        state_dir=settings.state_dir,
        default_backend=settings.backend,
        backend_options=settings.options_for,
        host_reserve_bytes=settings.host_reserve_bytes,
        metrics=metrics,
        tiering=Tiering(
            node=settings.node,
            spill_dir=settings.spill_dir,
            budget=settings.host_budget_bytes,
            metrics=metrics,
        ),
        processes=processes,
    )
    await engine.start()
    grpc_server, local_server, relay = await _serve(settings, engine, token)
    endpoint = (
        serve_metrics(metrics.registry, host_of(settings.address), settings.metrics_port)
        if settings.metrics_port is not None
        else None
    )
    advertised = _advertise(settings, grpc_server.port)
    running = RunningAgent(
        settings=settings,
        address=grpc_server.address,
        advertised=advertised,
        socket_path=settings.socket_path,
        node=settings.node,
        engine=engine,
        metrics=metrics,
        metrics_port=endpoint.port if endpoint is not None else None,
        scheduler_link=_link(settings, engine, advertised, token),
        token=token,
        _grpc=grpc_server,
        _local_server=local_server,
        _relay=relay,
        _metrics=endpoint,
    )
    log.info(
        "agent %s: Agent on %s, LocalAgent on %s, backend %s",
        settings.node,
        running.address,
        settings.socket_path,
        settings.backend,
    )
    return running


async def _serve(
    settings: AgentSettings, engine: AgentEngine, token: str
) -> tuple[GrpcServer, grpc.aio.Server, PeerCredRelay]:
    """The Agent service on TCP and LocalAgent behind the credential relay, both serving;
    on failure everything started is stopped and the engine closed."""
    try:
        relay = PeerCredRelay(
            settings.socket_path, settings.socket_mode, private_folder(settings.state_dir)
        )
    except BaseException:
        await engine.close()  # a live agent on this state directory: nothing else started
        raise
    grpc_server = await GrpcServer.create(
        tokens={Role.AGENT: token},
        methods=METHOD_ROLES,
        services=(SERVICE_NAME,),
        # No SO_REUSEPORT: a second agent on a taken port must fail, not share its calls.
        options=[("grpc.so_reuseport", 0)],
    )
    agent_pb2_grpc.add_AgentServicer_to_server(AgentServicer(engine), grpc_server.server)
    local_server = grpc.aio.server(options=SERVER_OPTIONS)
    agent_pb2_grpc.add_LocalAgentServicer_to_server(LocalAgentServicer(engine, relay), local_server)
    local_server.add_insecure_port(relay.internal_address)
    try:
        await grpc_server.start(settings.address, settings.tls)
    except BaseException:
        # Stopped even though it never started: grpc complains at collection otherwise.
        await asyncio.gather(grpc_server.stop(0), local_server.stop(0))
        await engine.close()
        raise
    await local_server.start()
    try:
        await relay.start()
    except BaseException:
        await asyncio.gather(grpc_server.stop(0), local_server.stop(0))
        await relay.stop()
        await engine.close()
        raise
    await grpc_server.set_serving(True)
    return grpc_server, local_server, relay


def _link(
    settings: AgentSettings, engine: AgentEngine, advertised: str, token: str
) -> SchedulerLink | None:
    """The started registration loop with the scheduler, or None when none is configured."""
    if not settings.scheduler:
        return None

    async def request() -> scheduler_pb2.RegisterAgentRequest:
        view = await engine.status()
        return scheduler_pb2.RegisterAgentRequest(
            node=settings.node,
            address=advertised,
            backends=list(view.backends),
            device_total_bytes=[d.total_bytes for d in view.devices],
            host_available_bytes=view.host_available,
            labels=dict(settings.labels),
        )

    async def registered(answer: scheduler_pb2.RegisterAgentResponse) -> None:
        if not answer.jobs_listed:
            return  # a scheduler older than the list: nothing to reconcile against
        known: dict[str, set[str]] = {group: set() for group in answer.groups}
        for item in answer.jobs:
            known.setdefault(item.group, set()).add(item.job)
        await engine.forget_departed(known)

    link = SchedulerLink(
        settings.scheduler,
        request,
        tls=settings.scheduler_tls,
        token=token,
        on_registered=registered,
    )
    link.start()
    return link

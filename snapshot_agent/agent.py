"""Start a whole agent: engine, Agent service on TCP, LocalAgent on the Unix socket, health,
metrics, and registration with the scheduler."""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from rlslice._errors import InvalidArgumentError
from rlslice.adapters.auth import Role, TokenAuthInterceptor
from rlslice.adapters.channel import SERVER_OPTIONS, add_port
from rlslice.adapters.net import host_of, is_loopback
from rlslice.snapshot_agent.engine import AgentEngine
from rlslice.snapshot_agent.local_service import LocalAgentServicer
from rlslice.snapshot_agent.metrics import AgentMetrics
from rlslice.snapshot_agent.peercred import PeerCredRelay
from rlslice.snapshot_agent.scheduler_link import SchedulerLink
from rlslice.snapshot_agent.service import METHOD_ROLES, AgentServicer
from rlslice.snapshot_agent.settings import AgentSettings
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
    _server: grpc.aio.Server
    _local_server: grpc.aio.Server
    _relay: PeerCredRelay
    _health: HealthServicer
    _metrics_http: object | None = None

    async def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving: new calls are refused, calls under way get `grace` seconds."""
        await self._health.enter_graceful_shutdown()
        if self.scheduler_link is not None:
            await self.scheduler_link.stop()
        await self._relay.stop()
        await asyncio.gather(self._server.stop(grace), self._local_server.stop(grace))
        await self.engine.close()
        if self._metrics_http is not None:
            self._metrics_http.shutdown()  # type: ignore[attr-defined]


def _check_exposure(settings: AgentSettings) -> None:
    host = host_of(settings.address)
    if not is_loopback(host) and not settings.token and settings.tls is None:
        raise InvalidArgumentError(
            f"address: {settings.address} is reachable beyond this host; refusing to serve the "
            "Agent service there without an agent token (--token / RLSLICE_AGENT_TOKEN) or TLS"
        )


def _advertise(settings: AgentSettings, port: int) -> str:
    if settings.advertise_address:
        return settings.advertise_address
    host = host_of(settings.address)
    if host in ("0.0.0.0", "::", ""):
        host = socket.getfqdn()
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def start_agent(settings: AgentSettings) -> RunningAgent:
    """Start an agent with `settings` and return it running."""
    _check_exposure(settings)
    metrics = AgentMetrics(settings.node)
    engine = AgentEngine(
        node=settings.node,
        state_dir=settings.state_dir,
        default_backend=settings.backend,
        backend_options=settings.options_for,
        host_reserve_bytes=settings.host_reserve_bytes,
        metrics=metrics,
    )
    await engine.start()

    health_servicer = HealthServicer()
    server = grpc.aio.server(
        interceptors=[TokenAuthInterceptor({Role.AGENT: settings.token or ""}, METHOD_ROLES)],
        # No SO_REUSEPORT: a second agent on a taken port must fail, not share its calls.
        options=[*SERVER_OPTIONS, ("grpc.so_reuseport", 0)],
    )
    agent_pb2_grpc.add_AgentServicer_to_server(AgentServicer(engine), server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    try:
        port = add_port(server, settings.address, settings.tls)
    except RuntimeError:
        port = 0
    if port == 0:
        await engine.close()
        raise InvalidArgumentError(f"address: cannot bind {settings.address}")

    relay = PeerCredRelay(settings.socket_path, settings.socket_mode)
    local_server = grpc.aio.server(options=SERVER_OPTIONS)
    agent_pb2_grpc.add_LocalAgentServicer_to_server(LocalAgentServicer(engine, relay), local_server)
    local_server.add_insecure_port(relay.internal_address)

    await server.start()
    await local_server.start()
    try:
        await relay.start()
    except BaseException:
        await asyncio.gather(server.stop(0), local_server.stop(0))
        await relay.stop()
        await engine.close()
        raise
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)

    host = host_of(settings.address)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    metrics_http, metrics_port = _serve_metrics(settings, metrics)
    running = RunningAgent(
        settings=settings,
        address=address,
        advertised=_advertise(settings, port),
        socket_path=settings.socket_path,
        node=settings.node,
        engine=engine,
        metrics=metrics,
        metrics_port=metrics_port,
        scheduler_link=None,
        _server=server,
        _local_server=local_server,
        _relay=relay,
        _health=health_servicer,
        _metrics_http=metrics_http,
    )
    if settings.scheduler:

        async def request() -> scheduler_pb2.RegisterAgentRequest:
            view = await engine.status()
            return scheduler_pb2.RegisterAgentRequest(
                node=settings.node,
                address=running.advertised,
                backends=list(view.backends),
                device_total_bytes=[d.total_bytes for d in view.devices],
                host_available_bytes=view.host_available,
                labels=dict(settings.labels),
            )

        link = SchedulerLink(
            settings.scheduler, request, tls=settings.scheduler_tls, token=settings.token
        )
        link.start()
        running.scheduler_link = link
    log.info(
        "agent %s: Agent on %s, LocalAgent on %s, backend %s",
        settings.node,
        address,
        settings.socket_path,
        settings.backend,
    )
    return running


def _serve_metrics(
    settings: AgentSettings, metrics: AgentMetrics
) -> tuple[object | None, int | None]:
    if settings.metrics_port is None:
        return None, None
    from prometheus_client import start_http_server

    host = host_of(settings.address) or "127.0.0.1"
    http, _thread = start_http_server(settings.metrics_port, addr=host, registry=metrics.registry)
    return http, int(http.server_port)

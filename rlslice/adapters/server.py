"""The one way to serve gRPC: roles from the proto, auth, health, reflection, binding, metrics.

`rlslice scheduler` and `rlslice agent` (and everything that embeds them: `rlslice up`, the
testing kit, the benches) build their servers here, so both answer the same way:

- `method_roles(service, roles)` turns a table keyed by method name into the interceptor's
  table keyed by full method path, and refuses a table that misses a method of the service
  or names one it does not have (checked against the proto descriptor at import time);
- `TokenAuthInterceptor` (in `rlslice.adapters.auth`) refuses every method it has no role
  for, except the health and reflection services, which are open by design;
- `check_exposure` refuses, before any port is bound, to listen beyond this host while a
  role is open (no token; mutual TLS stands in for the job token only);
- `GrpcServer` binds (TLS when configured, IPv6 literals bracketed), starts, reports health
  NOT_SERVING until its owner says SERVING, and stops;
- `serve_metrics` starts the Prometheus endpoint of a registry;
- `serve_until_signal` runs a started server until SIGTERM or SIGINT, then stops it: the
  one main loop of `rlslice scheduler`, `rlslice agent` and `rlslice up`.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
from google.protobuf.descriptor import ServiceDescriptor

from rlslice._errors import InvalidArgumentError
from rlslice.adapters.auth import Role, TokenAuthInterceptor
from rlslice.adapters.channel import SERVER_OPTIONS, add_port
from rlslice.adapters.net import host_of, is_loopback
from rlslice.config import TLSConfig

if TYPE_CHECKING:
    from grpc_health.v1._async import HealthServicer
    from prometheus_client import CollectorRegistry

log = logging.getLogger(__name__)
_Running = TypeVar("_Running")

#: Services that need no role: anyone may ask whether a server is up and what it serves.
OPEN_SERVICES: frozenset[str] = frozenset(
    {
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
        "grpc.reflection.v1.ServerReflection",
    }
)


def method_roles(service: ServiceDescriptor, roles: Mapping[str, Role]) -> dict[str, Role]:
    """`{"/pkg.Service/Method": role}` for every method of `service`.

    Raises `ValueError` naming the methods when `roles` misses one of the service's methods
    or names one the service does not have: a new RPC cannot ship without a role.
    """
    declared = {method.name for method in service.methods}
    missing = sorted(declared - roles.keys())
    unknown = sorted(roles.keys() - declared)
    if missing or unknown:
        raise ValueError(
            f"method roles of {service.full_name}: "
            f"missing {missing or 'none'}, not in the proto {unknown or 'none'}"
        )
    return {f"/{service.full_name}/{name}": role for name, role in roles.items()}


def check_exposure(
    address: str,
    tokens: Mapping[Role, str | None],
    tls: TLSConfig | None,
    *,
    token_flags: Mapping[Role, str],
    allow_unauthenticated: bool = False,
) -> None:
    """Refuse to serve beyond this host while any caller could act unauthenticated.

    Every role needs its bearer token. Mutual TLS (`tls.client_ca`) stands in for the job
    token only: it proves a caller holds some certificate of the CA, which every job's pod
    may hold, so it never grants the admin or agent role (a job's certificate must not put
    groups or register as a node). Loopback addresses are exempt: only this host reaches
    them. Raises `InvalidArgumentError` naming the address, the open roles and the flags.
    """
    if is_loopback(host_of(address)) or allow_unauthenticated:
        return
    mutual = tls is not None and bool(tls.client_ca)
    open_roles = [role for role in tokens if not tokens[role] and not (mutual and role is Role.JOB)]
    if not open_roles:
        return
    names = "/".join(role.value for role in open_roles)
    flags = ", ".join(token_flags[role] for role in open_roles)
    plural = "s are" if len(open_roles) > 1 else " is"
    instead = " (mutual TLS stands in for the job token only)" if mutual else ""
    raise InvalidArgumentError(
        f"address: {address} is reachable beyond this host and the {names} role{plural} "
        f"open{instead}; set {flags}, or --allow-unauthenticated on a trusted network"
    )


def join_host_port(host: str, port: int) -> str:
    """`host:port`, with an IPv6 literal in brackets (`[::1]:50551`)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass
class GrpcServer:
    """A grpc.aio server with the house's interceptor, options and health service.

    Build it with `GrpcServer.create(...)`, add servicers to `.server`, then `await
    start(address, tls)`; health stays NOT_SERVING until `await set_serving(True)`.
    """

    server: grpc.aio.Server
    health: HealthServicer
    services: tuple[str, ...]
    """Full names of the services health reports on (besides the overall "")."""
    address: str = ""
    """`host:port` actually bound (the real port when 0 was asked for), after `start`."""
    port: int = 0
    _reflection: bool = field(default=False, repr=False)

    @classmethod
    async def create(
        cls,
        *,
        tokens: Mapping[Role, str | None],
        methods: Mapping[str, Role],
        services: Sequence[str],
        options: Iterable[tuple[str, Any]] = (),
        reflection: bool = True,
    ) -> GrpcServer:
        """A server refusing calls whose token does not prove their method's role."""
        from grpc_health.v1 import health_pb2_grpc
        from grpc_health.v1._async import HealthServicer

        interceptor = TokenAuthInterceptor(
            {role: token or "" for role, token in tokens.items()}, methods, OPEN_SERVICES
        )
        server = grpc.aio.server(interceptors=[interceptor], options=[*SERVER_OPTIONS, *options])
        health = HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        made = cls(server=server, health=health, services=tuple(services), _reflection=reflection)
        await made.set_serving(False)
        return made

    async def start(self, address: str, tls: TLSConfig | None) -> str:
        """Bind `address` (TLS when configured) and start; return the bound `host:port`.

        Raises `InvalidArgumentError` when the address cannot be bound.
        """
        if self._reflection:
            from grpc_health.v1 import health_pb2
            from grpc_reflection.v1alpha import reflection

            reflection.enable_server_reflection(
                (
                    *self.services,
                    health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                    reflection.SERVICE_NAME,
                ),
                self.server,
            )
        try:
            port = add_port(self.server, address, tls)
        except RuntimeError:
            port = 0
        if port == 0:
            raise InvalidArgumentError(f"address: cannot bind {address}")
        await self.server.start()
        self.port = port
        self.address = join_host_port(host_of(address), port)
        return self.address

    async def set_serving(self, serving: bool) -> None:
        """Report SERVING (or NOT_SERVING) for the server and each of its services."""
        from grpc_health.v1 import health_pb2

        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", *self.services):
            await self.health.set(name, status)

    async def stop(self, grace: float | None) -> None:
        """NOT_SERVING, then stop: calls under way get `grace` seconds."""
        await self.set_serving(False)
        await self.server.stop(grace)


@dataclass
class MetricsEndpoint:
    """A running Prometheus HTTP endpoint; `close()` stops it."""

    port: int
    _close: Callable[[], None]

    def close(self) -> None:
        """Stop serving /metrics."""
        self._close()


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> MetricsEndpoint:
    """Serve `registry` on `http://host:port/metrics` (port 0: any free port)."""
    from prometheus_client import start_http_server

    http, _thread = start_http_server(port, addr=host or "127.0.0.1", registry=registry)

    def close() -> None:
        http.shutdown()
        http.server_close()

    return MetricsEndpoint(port=int(http.server_port), _close=close)


async def serve_until_signal(
    start: Callable[[], Awaitable[_Running]],
    stop: Callable[[_Running], Awaitable[object]],
    *,
    started: Callable[[_Running], object] | None = None,
    until: asyncio.Event | None = None,
) -> None:
    """`start()`, call `started` with what it returned, wait, then `stop` it.

    The wait ends on SIGTERM or SIGINT, or, when `until` is given, once it is set (no
    handlers are installed then: the caller owns the stopping). The handlers go in before
    `start`, so a signal that comes while the server starts still stops it once it is up.
    An error from `start` propagates (nothing was started to stop); `stop` runs however the
    wait ends. The signals' earlier handlers are back once it returns.
    """
    stopping = until if until is not None else asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT) if until is None else ()
    previous = {signum: signal.getsignal(signum) for signum in signals}
    for signum in signals:
        loop.add_signal_handler(signum, stopping.set)
    try:
        running = await start()
        try:
            if started is not None:
                started(running)
            await stopping.wait()
        finally:
            await stop(running)
    finally:
        for signum, handler in previous.items():
            loop.remove_signal_handler(signum)
            if handler is not None:  # asyncio.run's own SIGINT handler, for one
                signal.signal(signum, handler)

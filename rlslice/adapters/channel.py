"""Open gRPC channels and servers the same way everywhere: TLS when configured, bearer
tokens as call metadata, and keep-alive options that suit long-blocking calls."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from rlslice.config import TLSConfig

#: Metadata key carrying `Bearer <token>`.
AUTHORIZATION = "authorization"

# Acquire can block for minutes: keep the connection alive through idle proxies and
# notice a dead peer well before the lease lapses.
CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.enable_retries", 0),
)
SERVER_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_receive_message_length", 4 * 1024 * 1024),
)


class _WithToken:
    """Adds `authorization: Bearer <token>` to a call's metadata."""

    def __init__(self, token: str) -> None:
        self._metadata = (AUTHORIZATION, f"Bearer {token}")

    def _with_token(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = list(details.metadata or ())
        metadata.append(self._metadata)
        return grpc.aio.ClientCallDetails(
            details.method,
            details.timeout,
            grpc.aio.Metadata(*metadata),
            details.credentials,
            details.wait_for_ready,
        )


# One class per kind of call: grpc.aio files an interceptor under the first kind it is an
# instance of, so a single class deriving from all of them only ever sees unary calls.
class _UnaryUnaryToken(_WithToken, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._with_token(details), request)


class _UnaryStreamToken(_WithToken, grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[type-arg]
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._with_token(details), request)


class _StreamUnaryToken(_WithToken, grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[type-arg]
    async def intercept_stream_unary(self, continuation: Any, details: Any, iterator: Any) -> Any:
        return await continuation(self._with_token(details), iterator)


class _StreamStreamToken(_WithToken, grpc.aio.StreamStreamClientInterceptor):  # type: ignore[type-arg]
    async def intercept_stream_stream(self, continuation: Any, details: Any, iterator: Any) -> Any:
        return await continuation(self._with_token(details), iterator)


def token_interceptors(token: str) -> list[Any]:
    """Interceptors that send `token` as a bearer token on every kind of call."""
    kinds = (_UnaryUnaryToken, _UnaryStreamToken, _StreamUnaryToken, _StreamStreamToken)
    return [kind(token) for kind in kinds]


def server_credentials(tls: TLSConfig) -> grpc.ServerCredentials:
    """grpc server credentials from the files; mutual TLS when `tls.client_ca` is set."""
    if tls.cert is None or tls.key is None:
        raise ValueError("tls: a server needs both cert and key")
    pair = [(tls.key.read_bytes(), tls.cert.read_bytes())]
    if tls.client_ca is not None:
        return grpc.ssl_server_credentials(
            pair, root_certificates=tls.client_ca.read_bytes(), require_client_auth=True
        )
    return grpc.ssl_server_credentials(pair)


def channel_credentials(tls: TLSConfig) -> grpc.ChannelCredentials:
    """grpc channel credentials from the files."""
    return grpc.ssl_channel_credentials(
        root_certificates=tls.ca.read_bytes() if tls.ca else None,
        private_key=tls.key.read_bytes() if tls.key else None,
        certificate_chain=tls.cert.read_bytes() if tls.cert else None,
    )


def open_channel(
    address: str,
    *,
    tls: TLSConfig | None = None,
    token: str | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.aio.Channel:
    """An asyncio channel to `address` (`host:port` or `unix:/path`)."""
    interceptors: list[Any] | None = token_interceptors(token) if token else None
    all_options = [*CHANNEL_OPTIONS, *options]
    if tls is not None:
        if tls.server_name:
            all_options.append(("grpc.ssl_target_name_override", tls.server_name))
        return grpc.aio.secure_channel(
            address, channel_credentials(tls), options=all_options, interceptors=interceptors
        )
    return grpc.aio.insecure_channel(address, options=all_options, interceptors=interceptors)


def add_port(server: grpc.aio.Server, address: str, tls: TLSConfig | None) -> int:
    """Bind `server` to `address` with TLS when configured; return the bound port."""
    if tls is not None:
        return server.add_secure_port(address, server_credentials(tls))
    return server.add_insecure_port(address)


def bearer_token(metadata: Sequence[tuple[str, str | bytes]] | None) -> str | None:
    """The token of an `authorization: Bearer ...` entry, if any."""
    for key, value in metadata or ():
        if key == AUTHORIZATION:
            text = value.decode() if isinstance(value, bytes) else value
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer" and token:
                return token.strip()
    return None

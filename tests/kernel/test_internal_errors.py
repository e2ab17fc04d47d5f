"""An unexpected exception in a handler: the caller gets INTERNAL and an incident id, never
the exception's text; the server's log holds the text and the traceback under that id.
(An rlslice error still answers its own code and one-line message.)"""

from __future__ import annotations

import logging
import re

import grpc
import pytest

from rlslice import _errors as e
from rlslice.adapters.grpc_errors import answer

METHOD = "/test.Echo/Call"


async def _call_raising(error: Exception, caplog: pytest.LogCaptureFixture) -> grpc.aio.AioRpcError:
    async def handle(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        async def work() -> bytes:
            raise error

        return await answer(context, work)

    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                "test.Echo", {"Call": grpc.unary_unary_rpc_method_handler(handle)}
            )
        ]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            with caplog.at_level(logging.ERROR), pytest.raises(grpc.aio.AioRpcError) as raised:
                await channel.unary_unary(METHOD)(b"")
    finally:
        await server.stop(0)
    return raised.value


async def test_an_unexpected_exception_answers_internal_with_only_an_incident_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failure = await _call_raising(KeyError("/var/lib/tenant-b/secret-token"), caplog)
    assert failure.code() == grpc.StatusCode.INTERNAL
    details = failure.details() or ""
    assert "tenant-b" not in details
    assert "KeyError" not in details
    incident = re.fullmatch(
        r"internal error \(incident ([0-9a-f]{8}), in the server's log\)", details
    )
    assert incident is not None
    logged = [r for r in caplog.records if incident.group(1) in r.getMessage()]
    assert logged
    assert "tenant-b/secret-token" in logged[0].getMessage()
    assert logged[0].exc_info is not None


async def test_an_rlslice_error_still_answers_its_code_and_its_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failure = await _call_raising(e.NotFoundError("group: 'g' is not defined"), caplog)
    assert failure.code() == grpc.StatusCode.NOT_FOUND
    assert failure.details() == "group: 'g' is not defined"

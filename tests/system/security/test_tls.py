"""TLS and mutual TLS on every gRPC endpoint, with certificates made here by `openssl`.

Cases:
- the scheduler with mutual TLS serves a client that trusts its CA and presents a client
  certificate of that CA; refuses (the connection never opens) plaintext, a client without
  a certificate, a client whose certificate another CA signed, and a client that does not
  trust the server; and the refused attempts changed nothing;
- the agent's TCP endpoint, the same matrix;
- end to end: the agent registers with the scheduler over mutual TLS (with the agent
  token), the scheduler calls the agent over mutual TLS, and a switch freezes the outgoing
  job's real process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest

from rlslice.adapters.channel import open_channel, server_credentials
from rlslice.client import AsyncClient
from rlslice.config import GroupSpec, TLSConfig
from rlslice.v1alpha1 import agent_pb2 as apb
from rlslice.v1alpha1 import agent_pb2_grpc, scheduler_pb2_grpc
from rlslice.v1alpha1 import scheduler_pb2 as pb

from .conftest import Pki, agent, code_of, scheduler


def _server_tls(pki: Pki) -> TLSConfig:
    return TLSConfig(cert=pki.server_cert, key=pki.server_key, client_ca=pki.ca)


def _clients(pki: Pki) -> dict[str, TLSConfig | None]:
    """Each kind of caller; only 'verified' may get through."""
    return {
        "verified": TLSConfig(ca=pki.ca, cert=pki.client_cert, key=pki.client_key),
        "plaintext": None,
        "no client certificate": TLSConfig(ca=pki.ca),
        "certificate of another CA": TLSConfig(
            ca=pki.ca, cert=pki.other_client_cert, key=pki.other_client_key
        ),
        "does not trust the server": TLSConfig(
            ca=pki.other_ca, cert=pki.client_cert, key=pki.client_key
        ),
    }


async def test_the_scheduler_with_mutual_tls_serves_only_verified_clients(pki: Pki) -> None:
    async with scheduler(tls=_server_tls(pki)) as running:
        running.engine.put_group(GroupSpec(name="g"))
        for name, tls in _clients(pki).items():
            before = {n: r.state for n, r in running.engine.groups.items()}
            async with open_channel(running.address, tls=tls) as channel:
                stub = scheduler_pb2_grpc.SchedulerStub(channel)
                code = await code_of(
                    stub.Register(pb.RegisterRequest(job="x", group="g"), timeout=3)
                )
            if name == "verified":
                assert code == grpc.StatusCode.OK
                continue
            assert code == grpc.StatusCode.UNAVAILABLE, (name, code)
            assert {n: r.state for n, r in running.engine.groups.items()} == before, name


async def test_the_agent_with_mutual_tls_serves_only_verified_callers(
    pki: Pki, agent_dirs: Callable[[str], dict[str, Any]]
) -> None:
    async with agent(agent_dirs("n1"), tls=_server_tls(pki)) as running:
        for name, tls in _clients(pki).items():
            async with open_channel(running.address, tls=tls, token=running.token) as channel:
                stub = agent_pb2_grpc.AgentStub(channel)
                code = await code_of(
                    stub.Release(apb.ReleaseRequest(job="a", group="g", force=True), timeout=3)
                )
            # A verified caller reaches the servicer (the job is unknown there).
            expected = (
                grpc.StatusCode.NOT_FOUND if name == "verified" else grpc.StatusCode.UNAVAILABLE
            )
            assert code == expected, (name, code)
        # A certificate of the CA alone is no agent token: refused before the servicer.
        async with open_channel(running.address, tls=_clients(pki)["verified"]) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            code = await code_of(
                stub.Release(apb.ReleaseRequest(job="a", group="g", force=True), timeout=3)
            )
        assert code == grpc.StatusCode.UNAUTHENTICATED


async def test_scheduler_and_agent_talk_over_mutual_tls_with_tokens(
    pki: Pki, agent_dirs: Callable[[str], dict[str, Any]], spawn_worker: Callable[..., Any]
) -> None:
    client_tls = TLSConfig(ca=pki.ca, cert=pki.client_cert, key=pki.client_key)
    tokens = {"job_token": "job-t", "admin_token": "admin-t", "agent_token": "agent-t"}
    async with (
        scheduler(
            tls=_server_tls(pki), agent_tls=client_tls, auto_create_groups=True, **tokens
        ) as sched,
        agent(
            agent_dirs("n1"),
            tls=_server_tls(pki),
            token="agent-t",
            scheduler=sched.address,
            scheduler_tls=client_tls,
        ) as node,
    ):
        assert node.scheduler_link is not None
        assert await node.scheduler_link.wait_registered(10)
        assert set(sched.coordinator.agents) == {"n1"}
        worker = await spawn_worker(node, "a")
        async with (
            AsyncClient(
                job="a", group="g", scheduler=sched.address, token="job-t", tls=client_tls
            ) as a,
            AsyncClient(
                job="b", group="g", scheduler=sched.address, token="job-t", tls=client_tls
            ) as b,
        ):
            await a.acquire(timeout=10)
            await worker.call(op="init", size=1 << 20, seed=1)
            await a.yield_()
            grant = await b.acquire(timeout=10)
            assert grant.moved_bytes == 1 << 20
            assert worker.state == "T"
            await b.yield_()


@pytest.mark.parametrize("field", ["cert", "key"])
def test_a_server_tls_config_without_cert_or_key_is_refused(pki: Pki, field: str) -> None:
    fields = {"cert": pki.server_cert, "key": pki.server_key}
    del fields[field]
    with pytest.raises(ValueError, match="cert and key"):
        server_credentials(TLSConfig(**fields))


async def test_the_agent_command_line_carries_a_client_certificate_to_the_scheduler(
    pki: Pki, agent_dirs: Callable[[str], dict[str, Any]]
) -> None:
    from rlslice.apps.agent import settings_from
    from rlslice.apps.cli import build_parser

    def agent_args(*extra: str) -> Any:
        return build_parser().parse_args(["agent", "--node", "n1", *extra])

    async with scheduler(
        tls=_server_tls(pki), auto_create_groups=True, agent_token="agent-t", job_token="j"
    ) as sched:
        flags = agent_args(
            "--scheduler",
            sched.address,
            "--scheduler-ca",
            str(pki.ca),
            "--scheduler-cert",
            str(pki.client_cert),
            "--scheduler-key",
            str(pki.client_key),
        )
        from_cli = settings_from(flags).scheduler_tls
        assert from_cli == TLSConfig(ca=pki.ca, cert=pki.client_cert, key=pki.client_key)
        async with agent(
            agent_dirs("n1"), token="agent-t", scheduler=sched.address, scheduler_tls=from_cli
        ) as node:
            assert node.scheduler_link is not None
            assert await node.scheduler_link.wait_registered(10)
            assert set(sched.coordinator.agents) == {"n1"}

    with pytest.raises(SystemExit, match="go together"):
        settings_from(agent_args("--scheduler-cert", str(pki.client_cert)))

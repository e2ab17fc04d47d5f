"""The client's token and TLS settings against a scheduler that requires them.

Cases:
- a job token from the argument, or from RLSLICE_TOKEN_FILE, is accepted;
- no token: the first call fails with UnauthenticatedError, and nothing was registered;
- a wrong token is refused the same way;
- mutual TLS configured through RLSLICE_TLS_CA / RLSLICE_TLS_CERT / RLSLICE_TLS_KEY works;
  a client that does not trust the scheduler's CA never connects: its acquire runs out of
  time with a message saying the scheduler was unreachable.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rlslice._errors import DeadlineExceededError, UnauthenticatedError
from rlslice.client import AsyncClient
from rlslice.config import TLSConfig
from rlslice.testing import TestScheduler, scheduler_for_tests

JOB_TOKEN = "job-token-for-tests"
ADMIN_TOKEN = "admin-token-for-tests"


@pytest.fixture
async def secured() -> AsyncIterator[TestScheduler]:
    async with scheduler_for_tests(
        groups=["gpus"], job_token=JOB_TOKEN, admin_token=ADMIN_TOKEN
    ) as running:
        yield running


async def test_a_job_token_from_the_argument_is_accepted(secured: TestScheduler) -> None:
    async with AsyncClient(
        job="a", group="gpus", scheduler=secured.address, token=JOB_TOKEN
    ) as client:
        assert (await client.acquire(timeout=5)).job == "a"


async def test_a_job_token_from_a_file_is_accepted(
    secured: TestScheduler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(JOB_TOKEN + "\n")
    monkeypatch.setenv("RLSLICE_TOKEN_FILE", str(token_file))
    async with AsyncClient(job="a", group="gpus", scheduler=secured.address) as client:
        assert (await client.acquire(timeout=5)).job == "a"


@pytest.mark.parametrize("token", [None, "not-the-token"])
async def test_a_missing_or_wrong_token_is_refused_and_changes_nothing(
    secured: TestScheduler, token: str | None
) -> None:
    async with AsyncClient(job="a", group="gpus", scheduler=secured.address, token=token) as client:
        with pytest.raises(UnauthenticatedError, match="token"):
            await client.acquire(timeout=5)
    status = await secured.group("gpus")
    assert (status.holder, len(status.jobs), status.epoch) == ("", 0, 0)


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_pki(folder: Path, name: str) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by it."""
    ca_key, ca = folder / f"{name}-ca.key", folder / f"{name}-ca.pem"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(ca_key),
             "-out", str(ca), "-days", "1", "-subj", f"/CN={name}-ca")  # fmt: skip
    paths = {"ca": ca}
    for role, extension in (
        ("server", "subjectAltName=IP:127.0.0.1"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        key, csr, cert = (folder / f"{name}-{role}.{ext}" for ext in ("key", "csr", "pem"))
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-out", str(csr),
                 "-subj", f"/CN={role}")  # fmt: skip
        ext_file = folder / f"{name}-{role}.ext"
        ext_file.write_text(extension + "\n")
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
                 "-CAcreateserial", "-out", str(cert), "-days", "1", "-extfile", str(ext_file))  # fmt: skip
        paths[f"{role}_key"], paths[f"{role}_cert"] = key, cert
    return paths


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
async def test_mutual_tls_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pki = make_pki(tmp_path, "good")
    other = make_pki(tmp_path, "other")
    server_tls = TLSConfig(cert=pki["server_cert"], key=pki["server_key"], client_ca=pki["ca"])
    async with scheduler_for_tests(groups=["gpus"], tls=server_tls) as sched:
        monkeypatch.setenv("RLSLICE_TLS_CA", str(pki["ca"]))
        monkeypatch.setenv("RLSLICE_TLS_CERT", str(pki["client_cert"]))
        monkeypatch.setenv("RLSLICE_TLS_KEY", str(pki["client_key"]))
        async with AsyncClient(job="a", group="gpus", scheduler=sched.address) as client:
            assert (await client.acquire(timeout=10)).job == "a"
        monkeypatch.setenv("RLSLICE_TLS_CA", str(other["ca"]))
        async with AsyncClient(
            job="b", group="gpus", scheduler=sched.address, lease_seconds=5
        ) as stranger:
            with pytest.raises(DeadlineExceededError, match="unreachable"):
                await stranger.acquire(timeout=2)

"""The real kopf runtime against kmock's Kubernetes emulator, and a real scheduler on loopback.

kopf needs `v1/namespaces` and the CRD resource itself registered beside our resource,
else its namespace and resource observers wait forever; it logs in to the emulator
through a login handler of the test's registry.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import kmock
import kopf
import pytest
import yaml

from rlslice.operator.handlers import build_registry, operator_settings
from rlslice.operator.mutation import InjectionSettings
from rlslice.operator.settings import OperatorConfig, Role, WebhookSettings
from rlslice.scheduler import SchedulerSettings, start_scheduler
from rlslice.testing import free_port

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "charts/rlslice/files/crds/timeslicegroups.rlslice.dev.yaml"
TSG = "rlslice.dev/v1alpha1/timeslicegroups"
TSG_URL = "/apis/rlslice.dev/v1alpha1/timeslicegroups"
ADMIN_TOKEN = "admin-token-for-tests"

T = TypeVar("T")


async def eventually(
    probe: Callable[[], Awaitable[T] | T], *, timeout: float = 10.0, what: str = "condition"
) -> T:
    """The first truthy result of `probe`, polled until `timeout` (tests only)."""
    deadline = asyncio.get_running_loop().time() + timeout
    last: Any = None
    while asyncio.get_running_loop().time() < deadline:
        last = probe()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last  # type: ignore[no-any-return]
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}; last seen: {last!r}")


@pytest.fixture
def k8s(kmock: kmock.KubernetesEmulator) -> kmock.KubernetesEmulator:
    """The emulator with the resources kopf discovers, and our CRD object in it."""
    info = kmock.ResourceInfo
    kmock.resources["v1/namespaces"] = info(
        kind="Namespace", namespaced=False, verbs={"list", "watch", "get"}
    )
    kmock.resources["apiextensions.k8s.io/v1/customresourcedefinitions"] = info(
        kind="CustomResourceDefinition", namespaced=False, verbs={"list", "watch", "get"}
    )
    kmock.resources[TSG] = info(
        kind="TimeSliceGroup",
        singular="timeslicegroup",
        namespaced=False,
        shortnames={"tsg"},
        subresources={"status"},
        verbs={"list", "watch", "get", "patch", "create", "delete", "update"},
    )
    kmock.resources["v1/pods"] = info(
        kind="Pod", namespaced=True, verbs={"list", "watch", "get", "patch", "create"}
    )
    kmock.resources["v1/events"] = info(kind="Event", namespaced=True, verbs={"create"})
    crd = yaml.safe_load(CRD_FILE.read_text())
    kmock.objects[
        "apiextensions.k8s.io/v1/customresourcedefinitions", None, crd["metadata"]["name"]
    ] = crd
    return kmock


@dataclass
class Scheduler:
    """A real scheduler serving on loopback."""

    address: str
    handle: Any


@pytest.fixture
async def scheduler() -> AsyncIterator[Scheduler]:
    settings = SchedulerSettings(address="127.0.0.1:0", admin_token=ADMIN_TOKEN)
    running = await start_scheduler(settings)
    try:
        yield Scheduler(address=running.address, handle=running)
    finally:
        await running.stop(0)


@dataclass
class Operator:
    """A running operator and where its webhook listens."""

    config: OperatorConfig
    webhook_url: str


@pytest.fixture
def delete_timeout() -> float:
    return 30.0


@pytest.fixture
def operator_role() -> Role:
    """What the operator under test runs (a module overrides this fixture to change it)."""
    return "all"


@pytest.fixture
async def operator(
    k8s: kmock.KubernetesEmulator,
    scheduler: Scheduler,
    delete_timeout: float,
    operator_role: Role,
) -> AsyncIterator[Operator]:
    port = free_port()
    config = OperatorConfig(
        scheduler_address=scheduler.address,
        injection=InjectionSettings(
            scheduler_address="rlslice-scheduler.rlslice.svc:50051",
            token_secret="rlslice-job-token",
        ),
        admin_token=ADMIN_TOKEN,
        status_interval=0.2,
        delete_timeout=delete_timeout,
        rpc_timeout=5.0,
        webhook=WebhookSettings(port=port, addr="127.0.0.1", insecure=True),
        role=operator_role,
    )
    registry = build_registry(config, kopf.OperatorRegistry())

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=str(k8s.url))

    settings = operator_settings(config)
    settings.watching.reconnect_backoff = 0.05
    # kopf gets its own thread and loop, as kopf.testing.KopfRunner does: on exit it
    # cancels every task it did not see at start, which would include the tasks of the
    # grpc server and the emulator living in the test's loop.
    stop, ready = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(
                kopf.operator(
                    registry=registry,
                    settings=settings,
                    clusterwide=True,
                    standalone=True,
                    stop_flag=stop,
                    ready_flag=ready,
                )
            )
        except BaseException as error:  # reported by the fixture's teardown
            errors.append(error)

    thread = threading.Thread(target=run, name="kopf", daemon=True)
    thread.start()
    assert await asyncio.to_thread(ready.wait, 10), "the operator did not start"
    try:
        yield Operator(config=config, webhook_url=f"http://127.0.0.1:{port}")
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 15)
        assert not thread.is_alive(), "the operator did not stop"
        assert not errors, errors

"""The rlslice image, run in real containers the way the chart runs each component.

Every container uses the host network with addresses on 127.0.0.1, a read-only root and
the chart's user: 65532 with no capabilities for the scheduler and the jobs, root with host
PID and only SYS_PTRACE and KILL for the agent. Env names and values are the chart's
(charts/rlslice/templates), except: listen addresses are 127.0.0.1 instead of 0.0.0.0, the
scheduler's store is a SQLite file on a volume (a `scheduler.store` the chart accepts)
instead of ConfigMaps, the agent runs standalone (`--node`, no Kubernetes API) since it
registers the job containers through its socket. (The agent's DAC_OVERRIDE, which the sim
backend needs to move the buffers of jobs running as another uid, is the chart's own with
`agent.backend=sim`.)

Cases:
- `rlslice --version` in the image is the package's version; the OCI labels name source,
  version, licenses and revision; the default user is 65532;
- the image holds no tests, no pip, setuptools, wheel or pytest, and no compiler;
- the scheduler and the agent answer gRPC health SERVING for their services from the host;
- a time-slicing round: two job containers run an RL-shaped `sim` job (tests/deploy/image/rl_job.py:
  an unregistered driver, and the GPU worker it starts through `rlslice run`) through the
  scheduler and agent containers; both finish with their weights intact,
  `rlslice status --json` from the host shows at least 4 switches and each job's device
  bytes, and the jobs report the bytes moved; after every container is stopped, a new
  scheduler container on the same store shows the same epoch and switch count;
- the operator (with its webhook) starts against a Kubernetes API on loopback (kmock) and
  answers its liveness probe `/healthz` and an admission review on the webhook port.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rlslice._version import __version__
from rlslice.testing import free_port

from . import components
from .components import TOKENS
from .conftest import Engine, run_detached

# The first test to ask for the image builds it (about 1-2 min on 2 cores, more with a
# fresh mmdebstrap base): beyond pytest's default per-test timeout.
pytestmark = pytest.mark.timeout(600)
HERE = Path(__file__).resolve().parent
GROUP = "round"
NODE = "node-a"
STEPS = 4
WEIGHT_BYTES = 4 << 20
GROUPS_YAML = f"""groups:
  - name: {GROUP}
    backend: sim
    nodes: [{NODE}]
    # Larger than any emulated device: the two jobs never fit side by side, so every
    # switch parks the outgoing job's weights and restores the incoming job's.
    headroom_bytes: 1125899906842624
"""


def _read_only(engine: Engine) -> list[str]:
    """readOnlyRootFilesystem; podman would add tmpfs mounts the chart does not have."""
    return ["--read-only", *(["--read-only-tmpfs=false"] if "podman" in engine.binary else [])]


def _env(**values: str) -> list[str]:
    return [item for name, value in values.items() for item in ("-e", f"{name}={value}")]


def wait_serving(target: str, service: str, timeout: float = 60) -> None:
    """Block until `service` at `target` reports SERVING (health Watch), or fail."""
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service=service)
        try:
            for answer in stub.Watch(request, timeout=timeout, wait_for_ready=True):
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    return
        except grpc.RpcError as error:
            pytest.fail(f"{service} at {target} never SERVING: {error}", pytrace=False)
    pytest.fail(f"{service} at {target}: health stream ended", pytrace=False)


def host_status(address: str) -> list[dict[str, Any]]:
    """`rlslice status --json` run on the host against `address`."""
    result = subprocess.run(
        [sys.executable, "-m", "rlslice.apps", "status", "--scheduler", address, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONSAFEPATH": "1", "RLSLICE_TOKEN": TOKENS["admin"]},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    groups: list[dict[str, Any]] = json.loads(result.stdout)
    return groups


@dataclass
class ControlPlane:
    """A scheduler container and an agent container, and where they live on the host."""

    engine: Engine
    image: str
    scheduler: str
    agent: str
    store: Path
    sockets: Path
    names: dict[str, str]

    def start_scheduler(self) -> None:
        name = self.engine.name("scheduler")
        self.names["scheduler"] = name
        spec = components.scheduler(self.scheduler, free_port())
        run_detached(
            self.engine,
            name,
            [
                *spec.flags("podman" in self.engine.binary),
                *("-v", f"{self.store}:/var/lib/rlslice"),
                *("-v", f"{self.store.parent / 'groups.yaml'}:/etc/rlslice/groups.yaml:ro"),
            ],
            self.image,
            *spec.args,
        )
        wait_serving(self.scheduler, "rlslice.v1alpha1.Scheduler")

    def start_agent(self) -> None:
        name = self.engine.name("agent")
        self.names["agent"] = name
        spec = components.agent(self.agent, self.scheduler, free_port(), NODE)
        run_detached(
            self.engine,
            name,
            [
                *spec.flags("podman" in self.engine.binary),
                *("-v", f"{self.sockets}:/run/rlslice"),
                *("-v", f"{self.store.parent / 'agent-state'}:/var/lib/rlslice/agent"),
                *("-v", "/proc:/host/proc:ro"),
            ],
            self.image,
            *spec.args,
        )
        wait_serving(self.agent, "rlslice.v1alpha1.Agent")

    def stop(self) -> None:
        self.engine("stop", "-t", "15", *self.names.values(), timeout=120)

    def logs(self) -> str:
        return "\n".join(
            f"--- {role}\n{self.engine('logs', name, check=False).stderr[-3000:]}"
            for role, name in self.names.items()
        )


@pytest.fixture
def control_plane(containers: Engine, image: str, tmp_path: Path) -> ControlPlane:
    store = tmp_path / "store"
    sockets = tmp_path / "run"
    for folder in (store, sockets, tmp_path / "agent-state"):
        folder.mkdir()
    store.chmod(0o777)  # the scheduler writes as uid 65532
    (tmp_path / "groups.yaml").write_text(GROUPS_YAML)
    plane = ControlPlane(
        engine=containers,
        image=image,
        scheduler=f"127.0.0.1:{free_port()}",
        agent=f"127.0.0.1:{free_port()}",
        store=store,
        sockets=sockets,
        names={},
    )
    try:
        plane.start_scheduler()
        plane.start_agent()
    except BaseException:
        print(plane.logs())  # shown with the failure
        raise
    return plane


def test_version_labels_and_user_of_the_image(engine: Engine, image: str) -> None:
    version = engine("run", "--rm", *_read_only(engine), image, "--version")
    assert version.stdout.strip() == f"rlslice {__version__}"
    inspected = engine("image", "inspect", "--format", "{{json .Config}}", image)
    config = json.loads(inspected.stdout)
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == __version__
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.source"]
    assert labels["org.opencontainers.image.revision"] not in ("", "unknown")
    assert config["User"] == "65532:65532"


def test_the_image_holds_no_tests_no_installers_and_no_compiler(engine: Engine, image: str) -> None:
    probe = (
        "import importlib.util, json, pathlib, shutil, rlslice\n"
        "site = pathlib.Path(rlslice.__file__).parents[1]\n"
        "print(json.dumps({\n"
        " 'modules': [m for m in ('pip', 'setuptools', 'wheel', 'pytest', 'hypothesis')\n"
        "             if importlib.util.find_spec(m)],\n"
        " 'tools': [t for t in ('gcc', 'cc', 'c++', 'make', 'ld', 'pip', 'pip3')\n"
        "           if shutil.which(t)],\n"
        " 'tests': sorted(str(p) for p in site.rglob('conftest.py'))\n"
        "          + sorted(str(p) for p in (site / 'rlslice').rglob('test_*.py')),\n"
        "}))\n"
    )
    found = json.loads(
        engine("run", "--rm", *_read_only(engine), "--entrypoint", "python3", image, "-c", probe)
        .stdout.strip()
        .splitlines()[-1]
    )
    assert found == {"modules": [], "tools": [], "tests": []}


def test_scheduler_and_agent_answer_health_serving(control_plane: ControlPlane) -> None:
    # start_* waited for SERVING through the health Watch; Check answers the same now.
    for target, service in (
        (control_plane.scheduler, "rlslice.v1alpha1.Scheduler"),
        (control_plane.agent, "rlslice.v1alpha1.Agent"),
    ):
        with grpc.insecure_channel(target) as channel:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=10
            )
        assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_a_time_slicing_round_through_containers_survives_a_restart(
    control_plane: ControlPlane, image: str, tmp_path: Path
) -> None:
    engine = control_plane.engine
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    barrier.chmod(0o777)
    jobs = {}
    for job in ("job-a", "job-b"):
        jobs[job] = engine.name(job)
        run_detached(
            engine,
            jobs[job],
            [
                *("--user", "65532:65532", *_read_only(engine), "--cap-drop=ALL"),
                *("-v", f"{control_plane.sockets}:/run/rlslice"),
                *("-v", f"{HERE / 'rl_job.py'}:/job/rl_job.py:ro", "-v", f"{barrier}:/barrier"),
                *_env(RLSLICE_SIM_ROOT="/run/rlslice/sim", RLSLICE_TOKEN=TOKENS["job"]),
            ],
            image,
            *("run", "--no-register", "--job", job, "--group", GROUP),
            *("--agent-socket", "/run/rlslice/agent.sock"),
            *("--scheduler", control_plane.scheduler, "--"),
            *("python3", "/job/rl_job.py", str(STEPS), str(WEIGHT_BYTES)),
            *("/barrier", "2"),
        )
    summaries = {}
    for job, name in jobs.items():
        try:
            exited = engine("wait", name, timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{job} still runs after 120 s\n{_round_report(control_plane, jobs)}")
        logs = engine("logs", name, check=False)
        assert exited.stdout.strip() == "0", f"{job}: {logs.stderr}\n{control_plane.logs()}"
        summaries[job] = json.loads(logs.stdout.strip().splitlines()[-1])
    assert {s["steps"] for s in summaries.values()} == {STEPS}
    assert sum(s["restored"] for s in summaries.values()) >= 4
    moved = sum(s["moved_bytes"] for s in summaries.values())
    assert moved >= 4 * WEIGHT_BYTES

    (group,) = [g for g in host_status(control_plane.scheduler) if g["spec"]["name"] == GROUP]
    switches, epoch = int(group["switches"]), int(group["epoch"])
    assert switches >= 4
    assert epoch >= 2 * 2 * STEPS
    print(f"\nimage round: {switches} switches, {moved} bytes moved, epoch {epoch}")

    # Stop everything; a new scheduler container on the same store knows what happened.
    control_plane.stop()
    control_plane.start_scheduler()
    (again,) = [g for g in host_status(control_plane.scheduler) if g["spec"]["name"] == GROUP]
    assert (int(again["switches"]), int(again["epoch"])) == (switches, epoch)


def _round_report(control_plane: ControlPlane, jobs: dict[str, str]) -> str:
    """What a stuck round leaves to read: each job's log, the group, the control plane's logs."""
    engine = control_plane.engine
    parts = []
    for job, name in jobs.items():
        logs = engine("logs", name, check=False)
        state = engine("inspect", "--format", "{{.State.Status}}", name, check=False)
        parts.append(
            f"--- {job} ({state.stdout.strip()})\n{logs.stdout[-2000:]}{logs.stderr[-3000:]}"
        )
    try:
        parts.append(f"--- group\n{json.dumps(host_status(control_plane.scheduler), indent=1)}")
    except Exception as error:  # the report must not hide the failure it reports
        parts.append(f"--- group: {error!r}")
    parts.append(control_plane.logs())
    return "\n".join(parts)

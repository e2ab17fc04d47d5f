"""A real container engine and the rlslice image, built once per session.

The image is built by `tools/image/build.sh` (what `make image` runs) and tagged
`localhost/rlslice-test:<hash>`, the hash of everything that goes into it (the Containerfile,
tools/image and the build context's sources): a rerun with nothing changed reuses it, and
older test images are removed. Where no engine is installed the tests skip, except with
CI=true or RLSLICE_REQUIRE_CONTAINERS=1 (.ci/run sets it), where they fail.

Containers get unique names and are removed after each test; every one uses the host
network with addresses on 127.0.0.1 only.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
IMAGE_TOOLS = ROOT / "tools" / "image"
CONTAINERS_CONF = IMAGE_TOOLS / "containers.conf"
TEST_REPOSITORY = "localhost/rlslice-test"
#: what the build context holds (.containerignore's allowlist), hashed for the cache tag
CONTEXT = (
    "pyproject.toml",
    "README.md",
    "rlslice",
    "proto",
    "client",
    "scheduler",
    "snapshot_agent",
    "kube_operator",
    "planner",
    "integrations",
    "apps",
    "testing",
)
BUILD_INPUTS = ("Containerfile", ".containerignore", "tools/image")


def _required() -> bool:
    return os.environ.get("CI") == "true" or os.environ.get("RLSLICE_REQUIRE_CONTAINERS") == "1"


def _missing(reason: str) -> None:
    if _required():
        pytest.fail(f"{reason} (CI=true / RLSLICE_REQUIRE_CONTAINERS=1: no skipping)", False)
    pytest.skip(reason)


@dataclass
class Engine:
    """podman or docker, with the project's containers.conf."""

    binary: str
    env: dict[str, str] = field(default_factory=dict)
    created: list[str] = field(default_factory=list)

    def __call__(
        self, *argv: str, timeout: float = 60, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [self.binary, *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"{self.binary} {' '.join(argv[:3])} ... exited {result.returncode}: "
                f"{result.stderr.strip()[-2000:]}"
            )
        return result

    def name(self, role: str) -> str:
        """A unique container name, removed by the `containers` fixture."""
        name = f"rlslice-test-{uuid.uuid4().hex[:8]}-{role}"
        self.created.append(name)
        return name


@pytest.fixture(scope="session")
def engine() -> Engine:
    binary = os.environ.get("ENGINE") or shutil.which("podman")
    if binary is None and shutil.which("docker"):
        answers = subprocess.run(["docker", "info"], capture_output=True, check=False)
        binary = "docker" if answers.returncode == 0 else None
    if binary is None:
        _missing("no container engine (podman, or docker with a daemon) on this machine")
    assert binary is not None
    env = {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}
    return Engine(binary=binary, env=env)


def context_hash() -> str:
    """The hash of every file the image is built from."""
    digest = hashlib.sha256()
    paths: list[Path] = []
    for name in (*CONTEXT, *BUILD_INPUTS):
        path = ROOT / name
        paths.extend(sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path])
    for path in paths:
        if "__pycache__" in path.parts or path.suffix == ".pyc" or ".egg-info" in str(path):
            continue
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


# build.sh's knobs (`make image BASE=... EXTRAS=...`): the tag is the working tree's hash, so
# the image under test is the default build; an ambient `BASE=21` once made it `FROM 21`.
_BUILD_KNOBS = frozenset({"BASE", "EXTRAS", "ONLINE", "SOURCE"})


def _without_build_knobs(env: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if name not in _BUILD_KNOBS}


@pytest.fixture(scope="session")
def image(engine: Engine) -> str:
    """The image of the working tree, built by tools/image/build.sh unless cached."""
    tag = f"{TEST_REPOSITORY}:{context_hash()}"
    listed = engine("images", "--format", "{{.Repository}}:{{.Tag}}", check=False).stdout
    for stale in {line for line in listed.split() if line.startswith(TEST_REPOSITORY + ":")}:
        if stale != tag:
            engine("rmi", "-f", stale, check=False)
    if engine("image", "inspect", tag, check=False).returncode == 0:
        return tag
    if engine.binary.endswith("podman") and not shutil.which("mmdebstrap"):
        _missing("mmdebstrap is needed for the offline base image (tools/image/base.sh)")
    built = subprocess.run(
        [str(IMAGE_TOOLS / "build.sh")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**_without_build_knobs(engine.env), "IMAGE": tag, "ENGINE": engine.binary},
        check=False,
    )
    # The wheels stage stays behind as an untagged image: it is ours, remove it.
    engine("image", "prune", "-f", "--filter", "label=dev.rlslice.stage=wheels", check=False)
    assert built.returncode == 0, built.stderr[-4000:]
    return tag


@pytest.fixture
def containers(engine: Engine) -> Iterator[Engine]:
    """The engine; every container named through it is removed after the test."""
    first = len(engine.created)
    try:
        yield engine
    finally:
        names = engine.created[first:]
        if names:
            engine("rm", "-f", "-t", "0", *names, check=False, timeout=120)
        del engine.created[first:]


def run_detached(engine: Engine, name: str, flags: Sequence[str], image: str, *argv: str) -> None:
    """`run -d` with the host network (addresses on 127.0.0.1 only)."""
    engine("run", "-d", "--name", name, "--network=host", *flags, image, *argv)

"""A real OCI registry on loopback, and one release pushed to it, once per session.

The registry is Debian's `docker-registry` (the CNCF distribution registry), started by
pid on a free 127.0.0.1 port with its storage in a temporary folder, and stopped by pid.
The release is `tools/release.py --registry 127.0.0.1:PORT` (what `make release` runs)
with `--image` the image tests/deploy/image build and cache (`localhost/rlslice-test:<hash>`,
the same `tools/image/build.sh` build), so a session builds the image once for both.

Where docker-registry, podman or helm is missing the tests skip, except with CI=true or
RLSLICE_REQUIRE_REGISTRY=1 (.ci/run sets it and installs docker-registry), where they fail.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from rlslice._version import __version__
from rlslice.testing import free_port

ROOT = Path(__file__).resolve().parents[3]


def load(name: str, path: Path) -> ModuleType:
    """A Python file that is no importable module (tools/, another test folder's conftest)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# The engine and the cached image of tests/deploy/image, as fixtures here too: a session
# running both folders builds the image once (the second finds it by its tag).
_image_conftest = load("image_conftest", ROOT / "tests" / "deploy" / "image" / "conftest.py")
Engine = _image_conftest.Engine
engine = _image_conftest.engine
image = _image_conftest.image


def _required() -> bool:
    return os.environ.get("CI") == "true" or os.environ.get("RLSLICE_REQUIRE_REGISTRY") == "1"


def missing(reason: str) -> None:
    """Skip, or fail under CI=true / RLSLICE_REQUIRE_REGISTRY=1."""
    if _required():
        pytest.fail(f"{reason} (CI=true / RLSLICE_REQUIRE_REGISTRY=1: no skipping)", False)
    pytest.skip(reason)


def load_release_tool() -> ModuleType:
    """tools/release.py as a module."""
    return load("release_tool", ROOT / "tools" / "release.py")


@dataclass(frozen=True)
class Registry:
    """A running registry: `address` is host:port, spoken to over plain HTTP."""

    address: str
    process: subprocess.Popen[bytes]
    log: Path

    def manifest_digest(self, repository: str, reference: str) -> str:
        """The digest the registry answers for `repository:reference` (HEAD of the manifest)."""
        request = urllib.request.Request(
            f"http://{self.address}/v2/{repository}/manifests/{reference}",
            method="HEAD",
            headers={
                "Accept": ", ".join(
                    (
                        "application/vnd.oci.image.manifest.v1+json",
                        "application/vnd.docker.distribution.manifest.v2+json",
                    )
                )
            },
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            return str(answer.headers["Docker-Content-Digest"])


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    binary = shutil.which("docker-registry")
    if binary is None:
        missing("docker-registry is not installed (apt-get install docker-registry)")
    assert binary is not None
    folder = tmp_path_factory.mktemp("registry")
    address = f"127.0.0.1:{free_port()}"
    config = folder / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {folder / 'data'}\n"
        f"http:\n  addr: {address}\n"
    )
    log = folder / "registry.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [binary, "serve", str(config)], stdout=sink, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, f"docker-registry exited: {log.read_text()[-2000:]}"
            try:
                with urllib.request.urlopen(f"http://{address}/v2/", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert time.monotonic() < deadline, f"no registry on {address}: {log.read_text()}"
            time.sleep(0.1)
        yield Registry(address=address, process=process, log=log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


@pytest.fixture(scope="session")
def helm() -> Path:
    """The real helm (tools/fetch_helm.py, as the chart tests get it)."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "fetch_helm.py")],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if result.returncode != 0:
        missing(f"no helm (python tools/fetch_helm.py): {result.stderr.strip()[-500:]}")
    return Path(result.stdout.strip().splitlines()[-1]) / "helm"


@dataclass(frozen=True)
class Release:
    """What tools/release.py wrote: its folder and release.json."""

    out: Path
    record: dict[str, Any]


@pytest.fixture(scope="session")
def released(
    registry: Registry,
    engine: Any,  # the shared fixtures (an image_conftest.Engine)
    image: str,
    helm: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Release]:
    """One release of the working tree, pushed to the loopback registry."""
    out = tmp_path_factory.mktemp("release") / "dist"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "release.py"),
            "--registry",
            registry.address,
            "--image",
            image,
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**engine.env, "HELM": str(helm), "ENGINE": engine.binary},
        check=False,
    )
    try:
        assert result.returncode == 0, result.stderr[-4000:]
        yield Release(out=out, record=json.loads(result.stdout))
    finally:
        # The release tagged the cached image under the registry's name: only the tag goes.
        engine("untag", image, f"{registry.address}/rlslice:{__version__}", check=False)

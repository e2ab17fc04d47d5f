"""A release pushed to a real OCI registry on loopback, and pulled back from it.

`tools/release.py --registry 127.0.0.1:PORT` (conftest.py's `released`, what `make release
REGISTRY=...` runs) builds the sdist, the wheel, the chart package and the SBOM, pushes the
image with podman and the chart with helm; then, only through the registry:

- every file's checksum is in SHA256SUMS (`sha256sum -c` passes) and release.json, whose
  image is tagged and labelled with the version;
- `helm pull oci://127.0.0.1:PORT/charts/rlslice --version V` gives back the very package
  pushed, whose `helm template` with `image.registry` (and `image.digest`) pointing at the
  registry runs every container from the pushed image;
- `podman pull` by digest into an empty image store gives back the image pushed (same
  manifest digest, same image id) and it says `rlslice V`;
- the SBOM lists exactly the Python distributions installed in the image.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlslice._version import __version__

from .conftest import Registry, Release

# The image build (when tests/deploy/image has not cached it) and a release on a loaded
# 2-core machine: beyond pytest's default per-test timeout.
pytestmark = pytest.mark.timeout(900)


def _helm(helm: Path, *args: str) -> str:
    result = subprocess.run(
        [str(helm), *args], capture_output=True, text=True, timeout=180, check=False
    )
    assert result.returncode == 0, f"helm {' '.join(args[:2])}: {result.stderr}"
    return result.stdout


def _containers(node: Any) -> Iterator[dict[str, Any]]:
    """Every container and init container anywhere in a rendered object."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                yield from value
            else:
                yield from _containers(value)
    elif isinstance(node, list):
        for item in node:
            yield from _containers(item)


def test_every_released_file_is_checksummed_and_the_image_carries_the_version(
    released: Release,
) -> None:
    record = released.record
    version = __version__
    files = {
        f"rlslice-{version}.tar.gz",
        f"rlslice-{version}-py3-none-any.whl",
        f"rlslice-{version}.tgz",
        f"rlslice-{version}.cdx.json",
    }
    assert {path.name for path in released.out.iterdir()} == {*files, "release.json", "SHA256SUMS"}
    checked = subprocess.run(
        ["sha256sum", "--check", "--strict", "SHA256SUMS"],
        cwd=released.out,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    listed = {
        line.split("  ", 1)[1] for line in (released.out / "SHA256SUMS").read_text().splitlines()
    }
    assert listed == {*files, "release.json"}
    assert set(record["files"]) == files
    assert json.loads((released.out / "release.json").read_text()) == record

    assert record["version"] == version
    assert record["image"]["name"].endswith(f"/rlslice:{version}")
    assert record["image"]["labels"]["org.opencontainers.image.version"] == version
    assert record["chart"]["version"] == version
    assert record["revision"] == record["image"]["labels"]["org.opencontainers.image.revision"]


def test_the_chart_pulled_from_the_registry_is_the_one_pushed_and_renders_the_pinned_image(
    released: Release, registry: Registry, helm: Path, tmp_path: Path
) -> None:
    record = released.record
    version = __version__
    assert record["chart"]["reference"] == f"oci://{registry.address}/charts/rlslice"
    assert registry.manifest_digest("charts/rlslice", version) == record["chart"]["digest"]

    _helm(
        helm,
        "pull",
        record["chart"]["reference"],
        "--version",
        version,
        "--plain-http",
        "--destination",
        str(tmp_path),
    )
    pulled = tmp_path / f"rlslice-{version}.tgz"
    assert (released.out / pulled.name).read_bytes() == pulled.read_bytes()
    with tarfile.open(pulled) as chart:
        member = chart.extractfile("rlslice/Chart.yaml")
        assert member is not None
        meta = yaml.safe_load(member)
    assert (meta["version"], meta["appVersion"]) == (version, version)

    digest = record["image"]["digest"]
    for sets, expected in (
        ([f"image.registry={registry.address}"], f"{registry.address}/rlslice:{version}"),
        (
            [f"image.registry={registry.address}", f"image.digest={digest}"],
            f"{registry.address}/rlslice@{digest}",
        ),
    ):
        args = ["template", "rls", str(pulled), "--namespace", "rl-system"]
        for item in sets:
            args += ["--set", item]
        objects = [doc for doc in yaml.safe_load_all(_helm(helm, *args)) if doc]
        images = {container["image"] for container in _containers(objects)}
        workloads = [obj for obj in objects if obj["kind"] in ("Deployment", "DaemonSet")]
        assert len(workloads) >= 3, [obj["kind"] for obj in objects]
        assert images == {expected}
    assert record["install"] == (
        f"helm install rlslice {record['chart']['reference']} --version {version} "
        f"--namespace rlslice --create-namespace --set image.registry={registry.address} "
        f"--set image.digest={digest}"
    )


@pytest.fixture
def empty_store(engine: Any, tmp_path: Path) -> Iterator[list[str]]:
    """podman flags of an image store of this test's own, emptied afterwards."""
    runroot = tempfile.mkdtemp(prefix="rls-run-", dir="/tmp")  # podman: 50 characters at most
    flags = ["--root", str(tmp_path / "root"), "--runroot", runroot]
    try:
        yield flags
    finally:
        engine(*flags, "rmi", "--all", "--force", check=False, timeout=120)
        shutil.rmtree(runroot, ignore_errors=True)


def test_the_image_pulled_by_digest_into_an_empty_store_is_the_one_pushed(
    released: Release, registry: Registry, engine: Any, empty_store: list[str]
) -> None:
    if not engine.binary.endswith("podman"):
        pytest.fail("the release pushes with podman (tools/image/engine.sh chose another)")
    image = released.record["image"]
    version = __version__
    assert image["reference"] == f"{registry.address}/rlslice@{image['digest']}"
    assert registry.manifest_digest("rlslice", version) == image["digest"]

    assert engine(*empty_store, "images", "--quiet").stdout.strip() == ""
    engine(*empty_store, "pull", "--quiet", "--tls-verify=false", image["reference"], timeout=600)
    (pulled,) = json.loads(engine(*empty_store, "images", "--digests", "--format", "json").stdout)
    assert pulled["Digest"] == image["digest"]
    assert "sha256:" + pulled["Id"].removeprefix("sha256:") == image["id"]
    assert pulled["Labels"]["org.opencontainers.image.version"] == version

    said = engine(*empty_store, "run", "--rm", "--network=none", image["reference"], "--version")
    assert said.stdout.strip() == f"rlslice {version}"


def test_the_sbom_lists_exactly_the_python_distributions_installed_in_the_image(
    released: Release, engine: Any
) -> None:
    sbom = json.loads((released.out / f"rlslice-{__version__}.cdx.json").read_text())
    assert sbom["bomFormat"] == "CycloneDX"
    listed = {(c["name"].lower(), c["version"]) for c in sbom["components"]}

    installed = engine(
        "run",
        "--rm",
        "--network=none",
        "--entrypoint",
        "/opt/rlslice/bin/python",
        released.record["image"]["name"],
        "-c",
        "import importlib.metadata as m, json; "
        "print(json.dumps([(d.metadata['Name'], d.version) for d in m.distributions()]))",
    ).stdout
    expected = {(name.lower(), version) for name, version in json.loads(installed)}
    assert ("rlslice", __version__) in expected
    assert listed == expected

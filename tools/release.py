"""`make release`: one version's wheel, sdist, image, chart, SBOM, checksums and release.json.

    python tools/release.py [--registry HOST[:PORT][/PATH]] [--plain-http] [--image IMAGE]
                            [--out DIR]

The version is set in one place, `rlslice/_version.py`; everything else that carries it
(the chart's `version` and `appVersion`, the Containerfile's default `VERSION`, CHANGELOG.md's
latest release) must agree, or nothing is built. Into `--out` (default `dist/release/`,
emptied first):

1. the sdist and the wheel (`python -m build --no-isolation`, from a copy of the sources, the
   wheel built from the sdist), checked by `twine check --strict`;
2. the image: `tools/image/build.sh` (what `make image` runs), or `--image`, an image already
   built from this tree, tagged as the release; its OCI version label and `rlslice --version`
   inside it must say the version;
3. an SBOM of the image's Python environment, `rlslice-VERSION.cdx.json` (CycloneDX JSON by
   `cyclonedx-py environment`, run inside a container of the image against its own
   interpreter, `/opt/rlslice/bin/python`, with this venv's cyclonedx-bom mounted read-only);
4. the chart package, `rlslice-VERSION.tgz` (`helm package`);
5. with `--registry`: `podman push` of the image to `REGISTRY/rlslice:VERSION` and `helm push`
   of the chart to `oci://REGISTRY/charts`, both digests recorded (a loopback registry, or
   `--plain-http`, is spoken to over plain HTTP);
6. `release.json` (version, revision, every file's sha256, the image's id, labels, reference
   and digest, the chart's OCI reference and digest, the pinned `helm install` command) and
   `SHA256SUMS` of every file (`sha256sum -c SHA256SUMS` checks them).

Exit status 1 with the reason on the first failure. docs/image.md ("Releases") has the rest.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "rlslice"
IMAGE_TOOLS = ROOT / "tools" / "image"
#: what the distributions are built from: pyproject's package-dir folders, the readme
SOURCES = (
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
#: the image's Python environment (Containerfile)
IMAGE_PYTHON = "/opt/rlslice/bin/python"
VERSION_LABEL = "org.opencontainers.image.version"
REVISION_LABEL = "org.opencontainers.image.revision"
#: runs cyclonedx-bom's `python -m cyclonedx_py` from the mounted folder; the interpreter it
#: inspects is started afresh, so the mount never reaches the path it reports
_SBOM_LAUNCHER = (
    "import runpy, sys; sys.path.insert(0, '/sbom'); sys.argv[0] = 'cyclonedx-py'; "
    "runpy.run_module('cyclonedx_py', run_name='__main__', alter_sys=True)"
)
_LOOPBACK = re.compile(r"^(localhost|127\.\d+\.\d+\.\d+|\[::1\])(:\d+)?$")


class ReleaseError(Exception):
    """Why the release stopped (one line, or a command's output tail)."""


# --- the pure part: versions, names, records --------------------------------------------------


def module_version(text: str) -> str:
    """`__version__` of rlslice/_version.py's text."""
    match = re.search(r'^__version__ = "([^"]+)"$', text, re.MULTILINE)
    if match is None:
        raise ReleaseError('rlslice/_version.py has no line `__version__ = "X.Y.Z"`')
    return match.group(1)


def chart_versions(text: str) -> dict[str, str]:
    """The chart's `version` and `appVersion` from Chart.yaml's text."""
    chart = yaml.safe_load(text)
    return {"chart version": str(chart["version"]), "chart appVersion": str(chart["appVersion"])}


def changelog_latest(text: str) -> str:
    """The newest released version in a Keep a Changelog file (the first `## [X.Y.Z]`)."""
    for match in re.finditer(r"^## \[([^\]]+)\]", text, re.MULTILINE):
        if match.group(1).lower() != "unreleased":
            return match.group(1)
    raise ReleaseError("CHANGELOG.md has no released version (a `## [X.Y.Z] - DATE` heading)")


def containerfile_default(text: str) -> str:
    """The Containerfile's default `VERSION` build argument (a plain `podman build`'s label)."""
    match = re.search(r"^ARG VERSION=(\S+)$", text, re.MULTILINE)
    if match is None:
        raise ReleaseError("the Containerfile has no `ARG VERSION=...` line")
    return match.group(1)


def disagreements(declared: Mapping[str, str], version: str) -> list[str]:
    """One line per declaration that is not `version`, naming where it is."""
    return [
        f"{where} is {value}, not {version}"
        for where, value in declared.items()
        if value != version
    ]


def is_loopback(registry: str) -> bool:
    """Whether a registry (host[:port][/path]) is on this machine's loopback."""
    return _LOOPBACK.match(registry.split("/", 1)[0]) is not None


def image_name(version: str, registry: str | None) -> str:
    """The release image's name: `REGISTRY/rlslice:VERSION`, or `rlslice:VERSION` (local)."""
    return f"{registry.rstrip('/')}/rlslice:{version}" if registry else f"rlslice:{version}"


def pushed_digest(output: str) -> str:
    """The manifest digest in `helm push`'s output (`Digest: sha256:...`)."""
    match = re.search(r"^Digest: (sha256:[0-9a-f]{64})$", output, re.MULTILINE)
    if match is None:
        raise ReleaseError(f"helm push printed no digest: {output.strip()[-500:]}")
    return match.group(1)


def sha256sums(digests: Mapping[str, str]) -> str:
    """`sha256sum` format (two spaces, sorted by name), for `sha256sum -c`."""
    return "".join(f"{digest}  {name}\n" for name, digest in sorted(digests.items()))


def install_command(registry: str, version: str, image_digest: str) -> str:
    """`helm install` of the pushed chart with the image pinned by digest."""
    registry = registry.rstrip("/")
    return (
        f"helm install rlslice oci://{registry}/charts/rlslice --version {version} "
        f"--namespace rlslice --create-namespace --set image.registry={registry} "
        f"--set image.digest={image_digest}"
    )


def release_record(
    *,
    version: str,
    files: Mapping[str, str],
    image: Mapping[str, Any],
    chart: Mapping[str, Any],
    registry: str | None,
) -> dict[str, Any]:
    """release.json's content."""
    record: dict[str, Any] = {
        "version": version,
        "revision": image["labels"].get(REVISION_LABEL, "unknown"),
        "files": dict(sorted(files.items())),
        "image": dict(image),
        "chart": dict(chart),
        "registry": registry,
    }
    if registry and image.get("digest"):
        record["install"] = install_command(registry, version, image["digest"])
    return record


# --- adapters: files, commands ---------------------------------------------------------------


def declared_versions(root: Path = ROOT) -> dict[str, str]:
    """Every place in the tree that states the version, by where it is."""
    return {
        "rlslice/_version.py": module_version((root / "rlslice" / "_version.py").read_text()),
        **chart_versions((root / "charts" / "rlslice" / "Chart.yaml").read_text()),
        "Containerfile ARG VERSION": containerfile_default((root / "Containerfile").read_text()),
        "CHANGELOG.md latest release": changelog_latest((root / "CHANGELOG.md").read_text()),
    }


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def run(
    argv: Sequence[str | Path],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 600,
    stderr_too: bool = False,
) -> str:
    """Run a command; its stdout (and stderr after it with `stderr_too`), or ReleaseError
    with the end of its output."""
    words = [str(word) for word in argv]
    print("+", " ".join(words), file=sys.stderr, flush=True)
    try:
        result = subprocess.run(
            words, capture_output=True, text=True, env=env, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ReleaseError(f"{words[0]}: {error}") from error
    if result.returncode != 0:
        tail = (result.stderr.strip() or result.stdout.strip())[-3000:]
        raise ReleaseError(f"{' '.join(words[:3])} ... exited {result.returncode}: {tail}")
    return result.stdout + result.stderr if stderr_too else result.stdout


def build_python(out: Path, python: str = sys.executable) -> tuple[Path, Path]:
    """The sdist and the wheel built from it, into `out`, from a copy of the sources (so no
    build/ or egg-info lands in a tree others read); `twine check --strict` on both."""
    with tempfile.TemporaryDirectory(prefix="rlslice-release-") as tmp:
        source = Path(tmp) / "src"
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
        for name in SOURCES:
            if (ROOT / name).is_dir():
                shutil.copytree(ROOT / name, source / name, ignore=ignore)
            else:
                source.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, source / name)
        run([python, "-m", "build", "--no-isolation", "--outdir", out, source])
    (sdist,) = out.glob("rlslice-*.tar.gz")
    (wheel,) = out.glob("rlslice-*.whl")
    run([python, "-m", "twine", "check", "--strict", sdist, wheel])
    return sdist, wheel


def engine_env() -> dict[str, str]:
    return {
        **os.environ,
        "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(IMAGE_TOOLS / "containers.conf")),
    }


def image_facts(engine: str, reference: str) -> dict[str, Any]:
    """The image's id and labels (`image inspect`)."""
    (facts,) = json.loads(run([engine, "image", "inspect", reference], env=engine_env()))
    labels = facts.get("Labels") or facts.get("Config", {}).get("Labels") or {}
    return {"id": "sha256:" + facts["Id"].removeprefix("sha256:"), "labels": dict(labels)}


def prepare_image(engine: str, name: str, given: str | None) -> None:
    """Build the release image under `name` (tools/image/build.sh), or tag `given` as it."""
    if given is None:
        env = {**engine_env(), "IMAGE": name, "ENGINE": engine, "PYTHON": sys.executable}
        run([IMAGE_TOOLS / "build.sh"], env=env, timeout=1800)
    elif given != name:
        run([engine, "tag", given, name], env=engine_env())


def check_image(engine: str, name: str, version: str) -> dict[str, Any]:
    """The image's facts, after checking its version label and `rlslice --version`."""
    facts = image_facts(engine, name)
    if facts["labels"].get(VERSION_LABEL) != version:
        raise ReleaseError(
            f"{name}: label {VERSION_LABEL} is {facts['labels'].get(VERSION_LABEL)!r}"
        )
    said = run([engine, "run", "--rm", "--network=none", name, "--version"], env=engine_env())
    if said.strip() != f"rlslice {version}":
        raise ReleaseError(f"{name}: `rlslice --version` says {said.strip()!r}")
    return facts


def write_sbom(engine: str, image: str, out: Path, epoch: str) -> None:
    """CycloneDX JSON of the image's Python environment, by cyclonedx-py inside the image."""
    spec = importlib.util.find_spec("cyclonedx_py")
    if spec is None or spec.origin is None:
        raise ReleaseError("cyclonedx-bom is not installed here (pip install cyclonedx-bom)")
    site = Path(spec.origin).parents[1]
    sbom = run(
        [
            engine, "run", "--rm", "--network=none", "--read-only",
            "--entrypoint", IMAGE_PYTHON, "-v", f"{site}:/sbom:ro",
            "-e", f"SOURCE_DATE_EPOCH={epoch}",
            image, "-c", _SBOM_LAUNCHER,
            "environment", "--output-reproducible", "--of", "JSON", "-o", "-", IMAGE_PYTHON,
        ],
        env=engine_env(),
    )  # fmt: skip
    json.loads(sbom)  # a tool that printed something else fails here, not in a consumer
    out.write_text(sbom)


def helm_binary() -> str:
    for candidate in (
        os.environ.get("HELM"),
        ROOT / ".tools" / "bin" / "helm",
        shutil.which("helm"),
    ):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    raise ReleaseError("no helm: run `make tools` (or set HELM)")


def commit_epoch() -> str:
    """The commit's time (SOURCE_DATE_EPOCH of the SBOM), or 0 outside git."""
    result = subprocess.run(
        ["git", "-C", str(ROOT), "log", "-1", "--format=%ct"],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout.strip() or "0"


def push_image(engine: str, name: str, plain_http: bool) -> str:
    """`push` the image; the manifest digest the registry stored."""
    with tempfile.TemporaryDirectory() as tmp:
        digestfile = Path(tmp) / "digest"
        tls = ["--tls-verify=false"] if plain_http else []
        run([engine, "push", *tls, "--digestfile", digestfile, name], env=engine_env())
        return digestfile.read_text().strip()


def release(
    out: Path, registry: str | None, plain_http: bool, given_image: str | None
) -> dict[str, Any]:
    """Everything above, in order; release.json's content."""
    declared = declared_versions()
    version = declared["rlslice/_version.py"]
    wrong = disagreements(declared, version)
    if wrong:
        raise ReleaseError("the version disagrees: " + "; ".join(wrong))
    engine = run([IMAGE_TOOLS / "engine.sh"]).strip()
    helm = helm_binary()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)

    build_python(out)
    name = image_name(version, registry)
    prepare_image(engine, name, given_image)
    facts = check_image(engine, name, version)
    write_sbom(engine, name, out / f"rlslice-{version}.cdx.json", commit_epoch())
    run([helm, "package", CHART, "--destination", out])
    chart_file = out / f"rlslice-{version}.tgz"
    if not chart_file.is_file():
        raise ReleaseError(f"helm package made no {chart_file.name}")

    image: dict[str, Any] = {"name": name, **facts}
    chart: dict[str, Any] = {"file": chart_file.name}
    if registry:
        plain = plain_http or is_loopback(registry)
        digest = push_image(engine, name, plain)
        repository = name.rsplit(":", 1)[0]
        image.update(digest=digest, reference=f"{repository}@{digest}")
        flags = ["--plain-http"] if plain else []
        pushed = run(
            [helm, "push", chart_file, f"oci://{registry.rstrip('/')}/charts", *flags],
            stderr_too=True,
        )
        chart.update(
            reference=f"oci://{registry.rstrip('/')}/charts/rlslice",
            version=version,
            digest=pushed_digest(pushed),
        )
    files = {path.name: sha256_of(path) for path in sorted(out.iterdir())}
    record = release_record(
        version=version, files=files, image=image, chart=chart, registry=registry
    )
    (out / "release.json").write_text(json.dumps(record, indent=2) + "\n")
    files["release.json"] = sha256_of(out / "release.json")
    (out / "SHA256SUMS").write_text(sha256sums(files))
    return record


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--registry", help="push to this OCI registry: HOST[:PORT][/PATH]")
    parser.add_argument(
        "--plain-http", action="store_true", help="speak plain HTTP to the registry"
    )
    parser.add_argument("--image", help="release this image (built from this tree)")
    parser.add_argument("--out", type=Path, default=ROOT / "dist" / "release")
    args = parser.parse_args(argv)
    try:
        record = release(args.out, args.registry or None, args.plain_http, args.image)
    except ReleaseError as error:
        print(f"release: {error}", file=sys.stderr)
        return 1
    print(json.dumps(record, indent=2))
    print(f"release {record['version']}: {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

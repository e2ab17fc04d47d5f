"""The pure part of tools/release.py: names, plain HTTP, helm's digest, SHA256SUMS lines."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from .conftest import load_release_tool

release_tool = load_release_tool()


@pytest.mark.parametrize(
    ("registry", "plain"),
    [
        ("127.0.0.1:5000", True),
        ("127.0.0.1:5000/team", True),
        ("localhost:5000", True),
        ("localhost", True),
        ("[::1]:5000", True),
        ("registry.example.com/team", False),
        ("127.0.0.1.example.com:5000", False),
        ("10.0.0.1:5000", False),
    ],
)
def test_only_a_loopback_registry_is_spoken_to_over_plain_http_by_default(
    registry: str, plain: bool
) -> None:
    assert release_tool.is_loopback(registry) is plain


def test_the_image_is_named_after_the_registry_and_the_version() -> None:
    assert release_tool.image_name("1.2.3", "registry.example.com/team/") == (
        "registry.example.com/team/rlslice:1.2.3"
    )
    assert release_tool.image_name("1.2.3", None) == "rlslice:1.2.3"


def test_the_chart_digest_is_read_from_helm_push_output_or_the_release_stops() -> None:
    digest = "sha256:" + "ab" * 32
    output = f"Pushed: 127.0.0.1:5000/charts/rlslice:0.1.0\nDigest: {digest}\n"
    assert release_tool.pushed_digest(output) == digest
    with pytest.raises(release_tool.ReleaseError, match="no digest"):
        release_tool.pushed_digest("Pushed: 127.0.0.1:5000/charts/rlslice:0.1.0\n")


def test_the_checksum_list_is_what_sha256sum_checks(tmp_path: Path) -> None:
    files = {"b.whl": b"wheel", "a.tgz": b"chart"}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    (tmp_path / "SHA256SUMS").write_text(release_tool.sha256sums(digests))
    assert [line.split("  ")[1] for line in (tmp_path / "SHA256SUMS").read_text().splitlines()] == [
        "a.tgz",
        "b.whl",
    ]
    ok = subprocess.run(
        ["sha256sum", "--check", "--strict", "SHA256SUMS"], cwd=tmp_path, capture_output=True
    )
    assert ok.returncode == 0, ok.stdout
    (tmp_path / "b.whl").write_bytes(b"tampered")
    bad = subprocess.run(
        ["sha256sum", "--check", "--strict", "SHA256SUMS"], cwd=tmp_path, capture_output=True
    )
    assert bad.returncode == 1

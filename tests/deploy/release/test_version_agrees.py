"""One version, set in rlslice/_version.py, and every artefact that carries it says the same.

- the chart's `version` and `appVersion`, the Containerfile's default `VERSION` label,
  CHANGELOG.md's latest release, and the version `tools/image/build.sh` tags and labels the
  image with (`--version`, the same lookup its build uses);
- the sdist and the wheel `make release` builds (their metadata and file names), and
  `rlslice --version` run from that wheel alone, through its console-script entry point;
- a tree where one of them differs stops `tools/release.py` before anything is built.

The image's tag, its OCI version label and `rlslice --version` inside it are checked on
the image a release pushes (test_registry.py).
"""

from __future__ import annotations

import configparser
import email.parser
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from rlslice._version import __version__

from .conftest import ROOT, load_release_tool

release_tool = load_release_tool()


def test_every_file_that_states_the_version_states_the_one_in_rlslice_version_py() -> None:
    declared = release_tool.declared_versions(ROOT)
    assert set(declared) == {
        "rlslice/_version.py",
        "chart version",
        "chart appVersion",
        "Containerfile ARG VERSION",
        "CHANGELOG.md latest release",
    }
    assert declared == dict.fromkeys(declared, __version__)


def test_the_image_build_script_tags_and_labels_with_the_package_version() -> None:
    said = subprocess.run(
        [str(ROOT / "tools" / "image" / "build.sh"), "--version"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert said.stdout.strip() == __version__
    # and the image is tagged and labelled with that one variable
    script = (ROOT / "tools" / "image" / "build.sh").read_text()
    assert 'image="${IMAGE:-rlslice:$version}"' in script
    assert '--build-arg "VERSION=$version"' in script


def test_the_sdist_the_wheel_and_rlslice_version_from_the_wheel_carry_the_version(
    tmp_path: Path,
) -> None:
    sdist, wheel = release_tool.build_python(tmp_path)
    assert sdist.name == f"rlslice-{__version__}.tar.gz"
    assert wheel.name == f"rlslice-{__version__}-py3-none-any.whl"

    with tarfile.open(sdist) as archive:
        member = archive.extractfile(f"rlslice-{__version__}/PKG-INFO")
        assert member is not None
        sdist_meta = email.parser.BytesParser().parse(member)
    with zipfile.ZipFile(wheel) as archive:
        info = f"rlslice-{__version__}.dist-info"
        wheel_meta = email.parser.BytesParser().parsebytes(archive.read(f"{info}/METADATA"))
        entry_points = configparser.ConfigParser()
        entry_points.read_string(archive.read(f"{info}/entry_points.txt").decode())
    assert sdist_meta["Name"] == wheel_meta["Name"] == "rlslice"
    assert sdist_meta["Version"] == wheel_meta["Version"] == __version__

    # `rlslice --version` as the installed script runs it, importing only the wheel (no
    # site-packages, so not this checkout's editable install).
    module, function = entry_points["console_scripts"]["rlslice"].split(":")
    said = subprocess.run(
        [
            sys.executable,
            "-S",
            "-c",
            f"import sys, rlslice; from {module} import {function}; "
            f"print(rlslice.__file__, file=sys.stderr); sys.argv = ['rlslice', '--version']; "
            f"sys.exit({function}())",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(wheel), "PYTHONSAFEPATH": "1"},
        cwd=tmp_path,
        check=False,
    )
    assert said.returncode == 0, said.stderr
    assert said.stdout.strip() == f"rlslice {__version__}"
    assert said.stderr.strip().startswith(str(wheel)), said.stderr


def _tree_with(tmp_path: Path, chart_app_version: str) -> Path:
    """tools/release.py and the files that state the version, with the chart's appVersion
    set to another."""
    for name in ("tools/release.py", "rlslice/_version.py", "Containerfile", "CHANGELOG.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, tmp_path / name)
    chart = tmp_path / "charts" / "rlslice" / "Chart.yaml"
    chart.parent.mkdir(parents=True)
    text = (ROOT / "charts" / "rlslice" / "Chart.yaml").read_text()
    assert f'appVersion: "{__version__}"' in text
    chart.write_text(
        text.replace(f'appVersion: "{__version__}"', f'appVersion: "{chart_app_version}"')
    )
    return tmp_path


def test_a_chart_app_version_that_differs_is_named_and_stops_the_release_before_building(
    tmp_path: Path,
) -> None:
    tree = _tree_with(tmp_path, "9.9.9")
    declared = release_tool.declared_versions(tree)
    assert release_tool.disagreements(declared, __version__) == [
        f"chart appVersion is 9.9.9, not {__version__}"
    ]
    out = tmp_path / "out"
    refused = subprocess.run(
        [sys.executable, str(tree / "tools" / "release.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 1
    assert f"chart appVersion is 9.9.9, not {__version__}" in refused.stderr
    assert "+ " not in refused.stderr  # no command ran
    assert not out.exists()


def test_the_changelog_latest_release_skips_unreleased_and_needs_a_release() -> None:
    text = "# Changelog\n\n## [Unreleased]\n\n## [1.2.0] - 2026-01-01\n\n## [1.1.0] - 2025-01-01\n"
    assert release_tool.changelog_latest(text) == "1.2.0"
    with pytest.raises(release_tool.ReleaseError, match="no released version"):
        release_tool.changelog_latest("# Changelog\n\n## [Unreleased]\n")

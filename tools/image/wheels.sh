#!/usr/bin/env bash
# Wheels of rlslice, the image's extras and their dependencies, built on this machine into
# WHEELHOUSE (default .whl/, gitignored), plus pip, setuptools and wheel, so that the image
# builds with `pip --no-index` and no network inside the container. PYTHON must be the
# image's Python version (3.11: python:3.11-slim and Debian bookworm alike).
#
#   tools/image/wheels.sh [EXTRAS]     (default scheduler,agent,cuda,operator,tracing)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
extras="${1:-scheduler,agent,cuda,operator,tracing}"
python="${PYTHON:-$root/.venv/bin/python}"
wheelhouse="${WHEELHOUSE:-$root/.whl}"
want="${PYTHON_VERSION:-3.11}"
have="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ "$have" != "$want" ]; then
  echo "wheels.sh: $python is Python $have, the image's is $want (set PYTHON)" >&2
  exit 1
fi
mkdir -p "$wheelhouse"
# The project's own wheel is built from a copy, so no build/ or egg-info lands in the tree.
src="$(mktemp -d)"
trap 'rm -rf "$src"' EXIT
(cd "$root" && cp -r pyproject.toml README.md rlslice proto client scheduler snapshot_agent \
  kube_operator planner integrations apps testing "$src/")
find "$src" -name __pycache__ -prune -exec rm -rf {} +
rm -f "$wheelhouse"/rlslice-*.whl
"$python" -m pip wheel --quiet --wheel-dir "$wheelhouse" \
  "$src[$extras]" pip "setuptools>=77" wheel >&2
# The image builds rlslice itself from the sources in its context.
rm -f "$wheelhouse"/rlslice-*.whl
echo "$wheelhouse"

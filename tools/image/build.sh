#!/usr/bin/env bash
# `make image`: build the rlslice image with podman or docker (whichever is present).
#
#   IMAGE   name:tag to build (default rlslice:<package version>)
#   BASE    base image; default the official Python slim image when it can be pulled, else
#           a local Debian bookworm base made by tools/image/base.sh (mmdebstrap)
#   EXTRAS  extras to install (default scheduler,agent,cuda,operator,tracing)
#   ONLINE  1: let the build fetch wheels from the package index instead of using the
#           wheels built here (tools/image/wheels.sh; needs this machine's Python to be 3.11)
#
#   tools/image/build.sh --version     print the version the image is tagged and labelled
#                                      with (rlslice/_version.py's), build nothing
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"
version="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$root/rlslice/_version.py")"
[ -n "$version" ] || { echo "build.sh: no __version__ in rlslice/_version.py" >&2; exit 1; }
if [ "${1:-}" = --version ]; then
  echo "$version"
  exit 0
fi
engine="$("$here/engine.sh")"
image="${IMAGE:-rlslice:$version}"
extras="${EXTRAS:-scheduler,agent,cuda,operator,tracing}"
slim=docker.io/library/python:3.11-slim-bookworm
revision="$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)"
if ! git -C "$root" diff --quiet HEAD 2>/dev/null; then revision="$revision-dirty"; fi
# The git remote when it is a URL (a clone of a local path has none worth a label).
source_url="${SOURCE:-$(git -C "$root" remote get-url origin 2>/dev/null || true)}"
case "$source_url" in
  *://* | git@*) ;;
  *) source_url=https://rlslice.dev ;;
esac

base="${BASE:-}"
if [ -z "$base" ]; then
  if "$engine" image inspect "$slim" >/dev/null 2>&1 || "$engine" pull -q "$slim" >/dev/null 2>&1; then
    base="$slim"
  else
    echo "build.sh: cannot pull $slim; using a local Debian bookworm base (mmdebstrap)" >&2
    base="$("$here/base.sh")"
  fi
fi

wheel_args=()
if [ "${ONLINE:-0}" != 1 ]; then
  "$here/wheels.sh" "$extras" >/dev/null
  wheel_args=(--build-arg "PIP_WHEEL_ARGS=--no-index")
else
  mkdir -p "$root/.whl"
fi

"$engine" build -f "$root/Containerfile" -t "$image" \
  --build-arg "BASE=$base" --build-arg "EXTRAS=$extras" \
  --build-arg "VERSION=$version" --build-arg "REVISION=$revision" \
  --build-arg "SOURCE=$source_url" "${wheel_args[@]}" "$root" >&2
# The wheels stage's leftover image (podman keeps it untagged): only /wheels was used.
"$engine" image prune -f --filter label=dev.rlslice.stage=wheels >/dev/null 2>&1 || true
echo "$image"

#!/usr/bin/env bash
# A Debian bookworm base image (python3, venv, ca-certificates) made with mmdebstrap and
# imported into the container engine, for machines that can pull no image but reach the
# Debian mirror that apt uses (this project's CI). Idempotent: an existing image is kept.
#
#   tools/image/base.sh [IMAGE]        (default localhost/rlslice-base:bookworm)
#   ENGINE=podman|docker               (default: tools/image/engine.sh's choice)
#   MIRROR=http://...                  (default: apt's bookworm source on this machine)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
image="${1:-localhost/rlslice-base:bookworm}"
engine="${ENGINE:-$("$here/engine.sh")}"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"

if "$engine" image inspect "$image" >/dev/null 2>&1; then
  echo "$image"
  exit 0
fi
command -v mmdebstrap >/dev/null || { echo "base.sh: mmdebstrap is not installed" >&2; exit 1; }

# The mirror apt already uses for bookworm (deb822 or one-line sources alike).
mirror="${MIRROR:-$(apt-cache policy 2>/dev/null | awk '$3 == "bookworm/main" { print $2; exit }')}"
[ -n "$mirror" ] || { echo "base.sh: no bookworm source in apt's lists (set MIRROR)" >&2; exit 1; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mmdebstrap --quiet --variant=minbase \
  --include=python3,python3-venv,ca-certificates \
  --aptopt='Acquire::Languages "none"' \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*' \
  bookworm "$tmp/base.tar" "$mirror" >&2
"$engine" import \
  --change 'CMD ["/bin/bash"]' \
  --change 'ENV LANG=C.UTF-8' \
  "$tmp/base.tar" "$image" >/dev/null
echo "$image"

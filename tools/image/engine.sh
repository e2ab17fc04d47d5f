#!/usr/bin/env bash
# Print the container engine to use: $ENGINE if set, else podman if installed, else docker
# if its daemon answers. Exit 1 with a reason when there is none.
set -euo pipefail
if [ -n "${ENGINE:-}" ]; then
  echo "$ENGINE"
elif command -v podman >/dev/null; then
  echo podman
elif command -v docker >/dev/null && docker info >/dev/null 2>&1; then
  echo docker
else
  echo "no container engine: install podman (or docker with a running daemon)" >&2
  exit 1
fi

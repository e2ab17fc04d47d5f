# Every target that runs code first makes the virtual environment (.venv), idempotently.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PYTHONUNBUFFERED := 1

.PHONY: venv test lint typecheck pytest demo proto bench clean tools image release

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade "pip>=25.1" setuptools wheel
	# torch first, the CPU build on this disk: otherwise a dependency asking for any torch
	# (accelerate) would pull a multi-GB CUDA build from the registry.
	$(BIN)/python -m pip install -q "torch==2.13.0" || echo "torch 2.13.0 not available: torch tests will be skipped (CI fails instead)"
	$(BIN)/python -m pip install -q -e ".[all]" --group dev
	touch $(STAMP)

test: venv lint typecheck pytest

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv
	$(BIN)/python tools/typecheck_tree.py
	$(BIN)/mypy
	cd .typecheck && ../$(BIN)/lint-imports --config ../pyproject.toml --no-cache

# helm and kubectl for the chart tests, into .tools/bin (idempotent).
tools: venv
	$(BIN)/python tools/fetch_helm.py

pytest: venv tools
	$(BIN)/pytest -q -p no:randomly --durations=25

demo: venv
	$(BIN)/rlslice demo

proto: venv
	$(BIN)/python tools/genproto.py

bench: venv
	$(BIN)/rlslice bench handoff

# The container image (Containerfile) with podman or docker: IMAGE=name:tag, BASE=image,
# EXTRAS=a,b (docs/image.md). Wheels are built here first, so the build needs no network.
image: venv
	IMAGE="$(IMAGE)" BASE="$(BASE)" EXTRAS="$(EXTRAS)" PYTHON=$(BIN)/python tools/image/build.sh

# One version's wheel, sdist, image, chart package, SBOM, SHA256SUMS and release.json into
# dist/release/; REGISTRY=host:port[/path] also pushes the image and the chart there
# (PLAIN_HTTP=1 for a registry without TLS; loopback is always plain). docs/image.md.
release: venv tools
	$(BIN)/python tools/release.py $(if $(REGISTRY),--registry "$(REGISTRY)") $(if $(filter 1,$(PLAIN_HTTP)),--plain-http)

clean:
	rm -rf $(VENV) .typecheck .tools build *.egg-info .whl

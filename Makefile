# ctbench: two commands set up a fresh machine.
#   make run    creates .venv, installs ctbench, runs the demo on bundled sample data
#   make test   installs what the tests need (system packages too) and runs them
PY      ?= python3
SHELL   := /bin/bash
VENV    := .venv
VPY     := $(VENV)/bin/python
PIP     := $(VPY) -m pip
TORCH   ?= torch==2.13.0
OUTDIR  ?= out
PYTEST_ARGS ?=

.PHONY: run test venv dev-deps system-deps gui bench gpu-check clean

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first, pinned: a bare 'torch' requirement would pull a multi-GB CUDA build.
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e .
	touch $@

venv: $(VENV)/.installed

$(VENV)/.dev-installed: $(VENV)/.installed
	$(PIP) install -q -e ".[gui,dev]"
	touch $@

dev-deps: $(VENV)/.dev-installed

system-deps:
	bash scripts/install-system-deps.sh

run: venv
	$(VENV)/bin/ctbench demo --out $(OUTDIR)

test: dev-deps system-deps
	$(VPY) -m pytest -q -p no:cacheprovider --timeout=900 $(PYTEST_ARGS)

gui: dev-deps
	$(VENV)/bin/ctbench gui

bench: dev-deps
	$(PIP) install -q -e ".[peers]"
	bash scripts/run-benchmarks.sh

# On a machine with an NVIDIA GPU: CUDA parity tests and the GPU benchmark; JSON to $$OUT (or out/).
gpu-check: venv
	$(PIP) install -q -e ".[gpu,dev]"
	mkdir -p $${OUT:-$(OUTDIR)}
	set -o pipefail; $(VPY) -m pytest -q -m gpu tests 2>&1 | tee $${OUT:-$(OUTDIR)}/gpu-tests.log
	$(VPY) benchmarks/bench_gpu.py --out $${OUT:-$(OUTDIR)}/bench_gpu.jsonl

clean:
	rm -rf $(VENV) build dist *.egg-info $(OUTDIR)

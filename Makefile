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

.PHONY: run test venv dev-deps system-deps gui bench gpu-check gpu-rehearse gpu-wheels clean

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first, pinned: a bare 'torch' requirement would pull a multi-GB CUDA build.
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e .
	touch $@

venv: $(VENV)/.installed

$(VENV)/.dev-installed: $(VENV)/.installed pyproject.toml
	$(PIP) install -q -e ".[gui,dev]"
	touch $@

dev-deps: $(VENV)/.dev-installed

system-deps:
	bash scripts/install-system-deps.sh
	bash scripts/install-cross-deps.sh

run: venv
	$(VENV)/bin/ctbench demo --out $(OUTDIR)

# Mesa's on-disk shader cache is memory-mapped and shared by every GL process of the user;
# the GUI tests (Xvfb, llvmpipe) run without it so that no test depends on its state.
test: dev-deps system-deps
	MESA_SHADER_CACHE_DISABLE=true $(VPY) -m pytest -q -p no:cacheprovider --timeout=900 $(PYTEST_ARGS)

# A GUI user needs the gui and jobs extras only (not the dev extra's CUDA bindings, NVRTC, test tools).
$(VENV)/.gui-installed: $(VENV)/.installed pyproject.toml
	$(PIP) install -q -e ".[gui,jobs]"
	touch $@

gui: $(VENV)/.gui-installed
	$(VENV)/bin/ctbench gui

bench: dev-deps
	$(PIP) install -q -e ".[peers]"
	bash scripts/run-benchmarks.sh

# On a machine with an NVIDIA GPU (its own python3 with torch and CuPy): CUDA parity tests and the
# GPU benchmark; JSON and logs to $$OUT (or out/gpu-check).  gpu-wheels fetches, here, the wheels that
# machine lacks (carry .whl); gpu-rehearse runs the same script here on the CPU (backend='cuda-emulated').
gpu-check:
	bash scripts/gpu-check.sh

gpu-rehearse: dev-deps
	PY=$(VPY) bash scripts/gpu-check.sh --rehearse

GPU_WHEELS ?= zarr numcodecs donfig crc32c pydantic pydantic-core annotated-types typing-inspection diffct archspec
gpu-wheels:
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  -d .whl $(GPU_WHEELS)

clean:
	rm -rf $(VENV) build dist *.egg-info $(OUTDIR)

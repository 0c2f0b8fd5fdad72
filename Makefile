# ctbench: a few commands set up a fresh machine.
#   make run         creates .venv, installs ctbench, runs the demo on bundled sample data
#   make check       the fast tier: no GUI, no slow, no torchrun, no system packages (a few minutes)
#   make test        the full gate (.ci/run): installs the system packages the tests need (it says which and
#                    why first) and runs every test
#   make test-cross  the aarch64 tier: the cross toolchain and qemu-user, then tests/test_aarch64_kernels.py
PY      ?= python3
SHELL   := /bin/bash
VENV    := .venv
VPY     := $(VENV)/bin/python
PIP     := $(VPY) -m pip
TORCH   ?= torch==2.13.0
# torch's CPU build (about 200 MB) from PyTorch's index; TORCH_INDEX= (empty) takes pip's configured indexes
# (PyPI's build, which on Linux is the CUDA one: several GB with its NVIDIA libraries). Where PyTorch's index
# does not resolve (a machine that reaches only a mirror or a local wheel folder), it is left out rather than
# retried package by package for minutes.
TORCH_INDEX ?= $(shell $(PY) -c "import socket; socket.getaddrinfo('download.pytorch.org', 443)" >/dev/null 2>&1 \
                 && echo https://download.pytorch.org/whl/cpu)
OUTDIR  ?= out
PYTEST_ARGS ?=

FAST    := not slow and not gui and not distributed and not gpu and not cross

.PHONY: run check test test-cross venv dev-deps system-deps cross-deps compiler gui bench gpu-check gpu-rehearse \
        gpu-wheels clean

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first, pinned, and the CPU build unless TORCH_INDEX says otherwise: ctbench's own requirement
	# 'torch>=2.1' would pull PyPI's multi-GB CUDA build on Linux.
	$(PIP) install -q "$(TORCH)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PIP) install -q -e .
	touch $@

venv: $(VENV)/.installed

$(VENV)/.dev-installed: $(VENV)/.installed pyproject.toml
	$(PIP) install -q -e ".[gui,dev]"
	touch $@

dev-deps: $(VENV)/.dev-installed

system-deps:
	@echo "make: system packages for the tests: g++ (compiles the CPU kernels of a checkout at first use),"
	@echo "      Xvfb, xauth and Qt's xcb/GL libraries (the napari GUI tests); missing ones are installed with apt-get"
	bash scripts/install-system-deps.sh

cross-deps:
	@echo "make: system packages for the aarch64 tier: g++-aarch64-linux-gnu and qemu-user (cross-build the"
	@echo "      kernels and run them under emulation); missing ones are installed with apt-get"
	bash scripts/install-cross-deps.sh

# A checkout compiles its CPU kernels at first use; make check installs no system package, so it stops here.
compiler:
	@command -v "$${CXX:-g++}" >/dev/null || command -v c++ >/dev/null || command -v clang++ >/dev/null || \
	  { echo "make check: no C++ compiler (g++, c++ or clang++) on PATH; a checkout compiles its CPU kernels"; \
	    echo "            at first use. Install one (make system-deps does, with apt-get) and run make check again."; \
	    exit 2; }

run: venv
	$(VENV)/bin/ctbench demo --out $(OUTDIR)

# Mesa's on-disk shader cache is memory-mapped and shared by every GL process of the user;
# the GUI tests (Xvfb, llvmpipe) run without it so that no test depends on its state.
test: dev-deps system-deps
	MESA_SHADER_CACHE_DISABLE=true $(VPY) -m pytest -q -p no:cacheprovider --timeout=900 $(PYTEST_ARGS)

check: dev-deps compiler
	$(VPY) -m pytest -q -p no:cacheprovider --timeout=300 -m "$(FAST)" $(PYTEST_ARGS)

test-cross: dev-deps cross-deps
	$(VPY) -m pytest -q -p no:cacheprovider --timeout=1800 -m cross $(PYTEST_ARGS)

# A GUI user needs the gui extra only (it carries io and jobs; not the dev extra's CUDA bindings, NVRTC,
# test tools).
$(VENV)/.gui-installed: $(VENV)/.installed pyproject.toml
	$(PIP) install -q -e ".[gui]"
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

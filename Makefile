# flashnum: set up, run the main sweep, run the tests, build the paper.
#   make run       set up .venv (CPU torch first) and run experiment=bf16_sweep
#   make test      set up .venv and run the test suite
#   make figures   regenerate the paper's figures from experiments/*/results.parquet
#   make paper     build paper/paper.pdf (latexmk)
# TORCH names the torch requirement installed before the package; TORCH= keeps the
# torch the venv already has (e.g. your own CUDA build: make VENV_FLAGS=--system-site-packages TORCH=).
PY ?= python3
VENV ?= .venv
VENV_FLAGS ?=
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: setup run test figures paper
setup: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV_FLAGS) $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(if $(TORCH),$(BIN)/python -m pip install -q "$(TORCH)")
	$(BIN)/python -m pip install -q -e ".[test,triton,slurm]"
	touch $@

run: setup
	$(BIN)/python -m flashnum.run experiment=bf16_sweep

test: setup
	$(BIN)/python -m pytest -q -n 2

figures: setup
	$(BIN)/python -m flashnum.figures

paper: figures
	$(MAKE) -C paper

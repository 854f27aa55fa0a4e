# flashnum: set up, run the main sweep, run the tests, build the paper.
#   make run       set up .venv (CPU torch first), compute experiment=bf16_sweep again into
#                  the scratch store $(SCRATCH)/ and compare every row with the shipped table
#                  in experiments/ (exit status 1 if any differs); a deterministic sample:
#                  make run RUN_ARGS="num_shards=10 shard=0" (every 10th case)
#   make test      set up .venv and run the fast test suite (every test not marked slow)
#   make test-slow the tests marked slow (CI runs both: .ci/run); make test-all runs all
#   make verify    rerun every shipped experiment (cheapest first) into $(SCRATCH)/ and compare
#                  each with its stored table; VERIFY="a b" names some; one line each at the end
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

.PHONY: setup run test test-slow test-all verify figures paper
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
	$(BIN)/python -m pytest -q -n 2 -m "not slow"

test-slow: setup
	$(BIN)/python -m pytest -q -n 2 -m slow

test-all: setup
	$(BIN)/python -m pytest -q -n 2

figures: setup
	$(BIN)/python -m flashnum.figures

paper: figures
	$(MAKE) -C paper

# cheapest first, by the wall times their manifests record; a table that needs a third
# party's file (qiu_yao_agreement, triton_tutorial_*) says so and counts as not run
VERIFY ?= input_transforms trained_model_stats bwd_delta_site ties_bias bwd_trained_model \
    bwd_order trained_model precision_bits fa3_protocol fp32_sweep block_scaled \
    bound_tightness block_order block_size bwd_attribution repro_fp8_offset \
    kernel_audit_backward bwd_bf16_sweep repro_pcast_threshold kernel_audit splitkv_decode \
    fp16_sweep torch_cpu_backward kernel_vs_emulator worst_case repro_qiu_yao attribution \
    kernel_table repro_fp8_pcast repro_is_flash_stable repro_splitkv_decode repro_fa3_table3 \
    repro_block_scaled exp_exhaustive bf16_sweep seqlen_growth bwd_seqlen_growth \
    torch_cpu_forward triton_interpreter audit_ports qiu_yao_agreement triton_tutorial_backward triton_tutorial_forward \
    bound_stress
verify: setup
	@mkdir -p "$(SCRATCH)"; : > "$(SCRATCH)/verify.txt"; \
	for e in $(VERIFY); do rm -rf "$(SCRATCH)/$$e"; t0=$$(date +%s); \
	  $(BIN)/python -m flashnum.run experiment=$$e store.root=$(SCRATCH) \
	      compare_with=experiments > "$(SCRATCH)/$$e.log" 2>&1; rc=$$?; \
	  case $$rc in 0) v=identical;; 1) v=DIFFERS;; *) v="not run (exit $$rc)";; esac; \
	  grep -q "compared only on its CPU class" "$(SCRATCH)/$$e.log" && \
	      v="a real kernel's table, stored on another CPU class: not compared"; \
	  echo "$$e: $$v, $$(( $$(date +%s) - t0 )) s" | tee -a "$(SCRATCH)/verify.txt"; \
	done; ! grep -q DIFFERS "$(SCRATCH)/verify.txt"

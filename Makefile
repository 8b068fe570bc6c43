# ncc — the two commands that matter on a fresh machine are `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test test-sweeps lint bench bench-scale bench-fusion bench-reduce bench-sim bench-random bench-decoder bench-suite bench-models schemas clean

$(BIN)/ncc: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(BIN)/ncc

# Byte-compile the sources the way pip does for an installed package: every stage tool is a new
# process, and without .pyc files (PYTHONDONTWRITEBYTECODE, a fresh checkout) each one compiles
# the modules it imports again (a sixth of a farm's CPU, measured). Only changed files are redone.
setup: $(BIN)/ncc
	$(BIN)/python -m compileall -q orchestrator schemas tools

# Compile every bundled JAX model to a NEFF, run it in the simulator, compare with JAX's output.
demo: setup
	$(BIN)/python scripts/demo.py

# The suite on both cores (pytest-xdist; every test works in its own tmp_path), the long fuzz
# sweeps left to test-sweeps; .ci/run runs both tiers. --durations names the slowest.
PYTEST := $(BIN)/python -m pytest -q -n 2 --dist worksteal
test: setup
	$(PYTEST) -m "not sweep" --durations=20

test-sweeps: setup
	$(PYTEST) -m sweep --durations=10

lint: setup
	$(BIN)/ruff check .

bench: setup
	$(BIN)/python bench/run_bench.py

# Compile generated HLO of growing size; time and memory of the backend, per pass, vs XLA:CPU.
bench-scale: setup
	$(BIN)/python bench/run_scale.py

# Bytes moved and simulated time against the machine's limits, with and without the Penguin optimizer.
bench-fusion: setup
	$(BIN)/python bench/run_fusion.py

# `ncc reduce` of a planted crash on each shared model: reduction time and final size.
bench-reduce: setup
	$(BIN)/python bench/run_reduce.py

# `ncc run` of rolled NEFFs executing 16k, 100k and 1M instructions (and the compiled 2,000-op
# chain): wall, us per instruction, CPU, peak RSS, and how they grow with the executed count.
bench-sim: setup
	$(BIN)/python bench/run_sim.py

# Compile 500 random small modules with --verify: compile-time distribution, slowest ten, ok/refused/mismatch/traceback/timeout.
bench-random: setup
	$(BIN)/python bench/run_random.py

# A 7B-shaped decoder (1 and 32 layers) compiled, and one layer simulated against JAX (needs .[jax]).
bench-decoder: setup
	$(BIN)/python bench/run_decoder.py

# The real architectures of models/suite/ at full size, one compile at a time: compile with --verify (again
# without it past --verify's budget, E305), per-job wall, peak RSS, instruction counts, simulated time.
# `--jax` (needs JAX) also runs each NEFF on seeded inputs against JAX's outputs.
bench-suite: setup
	$(BIN)/python bench/run_suite.py

# The table of issue 35: the suite at full size against JAX, each module's compile (per job) beside
# XLA:CPU's of the same function in the same run, instruction counts, peak RSS, simulated time, the
# schedule's lower bound, the first-principles bound (PE FLOPs at the dtype's peak, HBM bytes) and
# HBM bytes over the minimum. Installs the optional JAX extra.
bench-models: setup
	$(BIN)/pip install --quiet -e '.[jax]'
	$(BIN)/python bench/run_suite.py --jax

# Regenerate the committed protobuf modules after editing schemas/*.proto.
schemas: setup
	$(BIN)/python schemas/generate.py

clean:
	rm -rf $(VENV) out .pytest_cache

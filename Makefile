# Two commands on a fresh machine (see README):
#   make main   install everything, then train configs/fmnist.yaml
#   make test   install everything, then run the test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
UV     := $(BIN)/uv pip install -q --system-certs --python $(BIN)/python
DATA   := /usr/share/datasets/fashion-mnist
# KerasHub for the tests of its tasks, without the full `tensorflow` that tensorflow-text's wheel asks for (setup.cfg's
# hub extra lists the rest); tensorflow-text 2.21.0 is broken (an undefined ICU symbol), 2.21.1 works
HUB    := keras-hub==0.32.0 tensorflow-text==2.21.1

.PHONY: main setup data test test-slow lint bench clean

main: setup
	$(BIN)/accum-train run configs/fmnist.yaml

setup: data $(VENV)/.installed

# Fashion-MNIST from Debian's package (needs root or sudo); otherwise say how.
data:
	@if [ -f $(DATA)/train-images-idx3-ubyte.gz ] || [ -n "$$ACCUM_TRAIN_DATA" ]; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist; \
	elif command -v sudo >/dev/null 2>&1; then \
	  sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist; \
	else \
	  echo "Fashion-MNIST is not installed and apt-get needs root: run 'sudo apt-get install dataset-fashion-mnist'," >&2; \
	  echo "or put the four .gz files in a folder and export ACCUM_TRAIN_DATA=that/folder" >&2; exit 2; \
	fi

# uv installs what pip would (the same resolution from PyPI, the same versions), unpacking the wheels in parallel:
# 12 s against pip's 29 s on 2 cores, which kept `make test` in a fresh clone over its 4 minutes. It trusts the
# system's certificates (--system-certs) as pip is set to, behind a proxy that signs with its own; pip installs
# where uv cannot.
$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q uv==0.13.9 || true
	$(UV) -e ".[cpu,hub,test]" || $(BIN)/pip install -q --no-compile -e ".[cpu,hub,test]"
	@# Keras' JAX backend for tests/test_jax_backend.py, on its own line: the one above is README's develop line
	$(UV) -e ".[jax]" || $(BIN)/pip install -q --no-compile -e ".[jax]"
	$(UV) --no-deps $(HUB) || $(BIN)/pip install -q --no-compile --no-deps $(HUB)
	@# uv byte-compiles nothing; the tests' processes would each compile what they import (where nothing writes
	@# .pyc files). compileall uses every core and, as pip does, skips a file that does not compile (templates,
	@# Python 2 test data shipped in wheels). It leaves out pip and the wheels' own test suites (tests/ folders,
	@# Keras' foo_test.py files), none of which the tests or commands import; not test/ folders or _x_test.py
	@# names, which TensorFlow's tf.test API and SciPy's statistical tests use. This step: 26 s to 18 s on 2 cores.
	$(BIN)/python -m compileall -q -j 0 -x '/(tests|pip)/|/[a-z][^/]*_test\.py$$' $(VENV)/lib >/dev/null 2>&1 || true
	touch $@

# One process per core, each test file whole in one of them (its module fixtures are built once).
test: setup
	$(BIN)/python -m pytest -q -n auto --dist loadfile

# ruff: the linter and the formatter's check, rules in pyproject.toml; zero findings (CI runs it).
lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The slow suites (kill -9 / signals + resume; tf.distribute in fresh processes); .ci/run runs them too.
# The cases that start local workers (marker `workers`) run alone, one at a time: their workers have start-up
# deadlines that a loaded machine could miss. Everything else, mirrored replicas included, runs side by side.
test-slow: setup
	$(BIN)/python -m pytest -q -m "slow and not workers" -n auto --dist loadfile
	$(BIN)/python -m pytest -q -m "slow and workers"

# The figures in the README: bench against k, and the side-by-side with the peers.
bench: setup
	$(BIN)/accum-train bench configs/fmnist.yaml --subdivisions 1,2,4,8,16 --steps 10
	$(BIN)/python benchmarks/peers.py --output docs/peers.json
	$(BIN)/python benchmarks/peers_keras.py --output docs/peers-keras-file.json

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache

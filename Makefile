# The two front doors: `make demo` and `make test`. Both build .venv themselves from pinned
# packages (constraints.txt pins torch==2.13.0: never an unpinned, multi-GB CUDA torch).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.diagkit-installed
OUT    ?= out/demo

.PHONY: setup system test demo data bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade-strategy only-if-needed -c constraints.txt torch==2.13.0
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# The browser tests need a real Chromium: Debian's, never a downloaded one.
system:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "make: installing Debian's chromium for the browser tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

test: $(STAMP) system
	$(PY) -m pytest -q

demo: $(STAMP)
	$(VENV)/bin/diagkit demo --out $(OUT)

# Overhead of observation (time, memory, report build): prints a table, writes JSON.
# ~10 min on 2 CPUs; `$(PY) benchmarks/overhead.py --quick` for a smoke run.
bench: $(STAMP)
	$(PY) benchmarks/overhead.py --out out/bench.json

# Rebuild the committed demo checkpoint (deterministic).
data: $(STAMP)
	$(PY) scripts/make_demo_data.py

clean:
	rm -rf $(VENV) out .pytest_cache

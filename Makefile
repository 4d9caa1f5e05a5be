# The two front doors: `make demo` and `make test`. Both build .venv themselves from pinned
# packages (constraints.txt pins torch==2.13.0: never an unpinned, multi-GB CUDA torch).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.diagkit-installed
OUT    ?= out/demo

# The suite runs on $(WORKERS) pytest-xdist workers (tests/suite_plan.py says how it spreads;
# three on two cores: one runs while the others wait on a timeout, a rank or a browser).
WORKERS ?= 3
XDIST   := -n $(WORKERS) --dist loadgroup

.PHONY: setup system test test-fast demo docs data bench clean

setup: $(STAMP)

# Never `pip install --no-compile` here: it saves 54 CPU s of the install, but where
# PYTHONDONTWRITEBYTECODE=1 is set (as on our CI machines) nothing is compiled later either,
# and every process of the suite then compiles torch from source as it imports it.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	DS_BUILD_OPS=0 $(PY) -m pip install --quiet -c constraints.txt torch==2.13.0 -e '.[dev]'  # one resolve
	touch $(STAMP)

# The browser tests need a real Chromium: Debian's, never a downloaded one.
system:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "make: installing Debian's chromium for the browser tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# Everything (CI: .ci/run). Fails if any process the tests started outlives them.
# compileall: where PYTHONDONTWRITEBYTECODE=1 is set (our CI machines), no process of the suite
# writes diagkit's bytecode, so each of a few hundred compiled it again (~0.2 CPU s each).
test: $(STAMP) system
	$(PY) -m compileall -q src
	$(PY) -m pytest -q $(XDIST)

# The contributor's tier, under 3 minutes here: the unit layers and the quick whole-run checks,
# none of the tests marked slow (torchrun jobs, papermill, the browser, the wheel).
test-fast: $(STAMP)
	$(PY) -m pytest -q $(XDIST) -m "not slow"

demo: $(STAMP)
	$(VENV)/bin/diagkit demo --out $(OUT)

# The docs: docs/*.md into out/docs/ (mkdocs.yml; --strict: a broken link or anchor fails it).
# Offline: the theme ships inside mkdocs, and the pages load nothing from outside.
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --clean --site-dir out/docs

# Overhead of observation (time, memory, report build): prints a table, writes JSON.
# ~25 min on 2 CPUs (section I, the whole run, ~15 of them: `--skip whole` leaves it out);
# `$(PY) benchmarks/overhead.py --quick` for a smoke run.
bench: $(STAMP)
	$(PY) benchmarks/overhead.py --out out/bench.json

# Rebuild the committed demo checkpoint (deterministic).
data: $(STAMP)
	$(PY) scripts/make_demo_data.py

clean:
	rm -rf $(VENV) out .pytest_cache

# The two front doors: `make demo` and `make test`. Both build .venv themselves from pinned
# packages (constraints.txt pins torch==2.13.0: never an unpinned, multi-GB CUDA torch).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.diagkit-installed
OUT    ?= out/demo

.PHONY: setup test demo data clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade-strategy only-if-needed -c constraints.txt torch==2.13.0
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

demo: $(STAMP)
	$(VENV)/bin/diagkit demo --out $(OUT)

# Rebuild the committed demo checkpoint (deterministic).
data: $(STAMP)
	$(PY) scripts/make_demo_data.py

clean:
	rm -rf $(VENV) out .pytest_cache

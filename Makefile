# Two commands, each does its own setup on a machine that has only Python 3.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-test

.PHONY: demo test test-fast clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/tra-dask run matmul --shape general --scale 0.1 --sites 2

# two pytest workers, each taking half the suite in file order (a module's shared cluster
# is started once, in the worker that runs it) and, once done, stealing what the other has
# not started (a module split so starts its cluster in both); TEST_WORKERS=0: one process
TEST_WORKERS ?= 2
test: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal tra_dask tests

# the tests that start no Dask cluster and are not slow, and the doctests (docs/contributing.md),
# test by test over the same pytest workers
test-fast: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) -m "not cluster and not slow" tra_dask tests

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis

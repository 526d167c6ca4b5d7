# One venv for everything; `make run` runs the pipeline on embedded defaults, `make test` the tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: venv run tutorial lint test test-fast test-long bench clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, from the exact releases the CI machines hold on disk (no 3 GB download).
	$(BIN)/pip install -q torch==2.14.1 torchvision==0.29.1
	$(BIN)/pip install -q -e ".[test]" --config-settings editable_mode=compat
	touch $@

# MIRROR=folder-or-URL reads the data set from a mirror instead of the internet.
run: venv
	$(BIN)/python -m flows.main $(if $(MIRROR),--mirrors $(MIRROR)) $(ARGS)

# The tutorial reads FashionMNIST through torchvision from $$TMPDIR/data; with MIRROR the raw files are put there first.
tutorial: venv
	$(if $(MIRROR),$(BIN)/python -c "import os, tempfile; from tasks.domain.torchvision_layout import torchvision_layout; torchvision_layout('$(MIRROR)', os.path.join(tempfile.gettempdir(), 'data'))")
	$(BIN)/python examples/tutorial.py

# Three pytest-xdist workers, one test module at a time each (modules share their servers), the
# longest modules first (tests/conftest.py): on 2 cores the suite is CPU-bound, and three workers keep both
# cores busy while a module waits on its servers. TEST_WORKERS=0 runs it in this one process.
TEST_WORKERS ?= 3
test: venv
	$(BIN)/pytest -q -p no:cacheprovider $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder) $(PYTEST_ARGS)

# The long tier: end-to-end checks of over a minute each (marked `long`; tests/conftest.py leaves them out of
# `make test`): the `ray start` cluster, the killed and retried deployment run and the Prefect UI, MLflow outages, ...
test-long: venv
	$(BIN)/pytest -q -p no:cacheprovider -m long $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder) $(PYTEST_ARGS)

# The unit tier alone: no Ray, servers or subprocesses, in under a minute (tests/conftest.py sets the tiers by folder).
test-fast: venv
	$(BIN)/pytest -q -p no:cacheprovider tests/unit $(PYTEST_ARGS)

# Lint, format check (ruff) and the import rules between trainlib, tasks and flows (import-linter), all configured
# in pyproject.toml; CI runs it before the tests.
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

bench: venv
	$(BIN)/pip install -q -e ".[bench]" --config-settings editable_mode=compat
	$(BIN)/python -m bench overhead

clean:
	rm -rf $(VENV) .pytest_cache

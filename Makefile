# Two commands from a fresh clone: `make demo` (the main job) and `make test` (the suite).
# Each creates .venv when missing and reinstalls when pyproject.toml changes.
VENV  := .venv
BIN   := $(VENV)/bin
STAMP := $(VENV)/.installed
export MUJOCO_GL ?= egl
# The suite in this many processes, a test file each at a time (its module fixtures are built once): most tests
# wait on servers, subprocesses and sockets, so 2 workers on 2 cores took it from 29 to 18 minutes.
TEST_WORKERS ?= 2

.PHONY: demo test install clean
install: $(STAMP)

$(STAMP): pyproject.toml scripts/system-deps scripts/check-disk
	@scripts/system-deps
	@scripts/check-disk $(VENV)
	@test -x $(BIN)/python || "$$(scripts/find-python)" -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/robotloop loop

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15 tests

clean:
	rm -rf $(VENV) .pytest_cache

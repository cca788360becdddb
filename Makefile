# Two commands from a fresh clone: `make demo` (the main job) and `make test` (the suite).
# Each creates .venv when missing and reinstalls when pyproject.toml changes.
VENV  := .venv
BIN   := $(VENV)/bin
STAMP := $(VENV)/.installed
export MUJOCO_GL ?= egl

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
	$(BIN)/python -m pytest -q --durations=15 tests

clean:
	rm -rf $(VENV) .pytest_cache

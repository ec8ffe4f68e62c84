# captain_ros: the two commands are `make run` (main job) and `make test` (all tests).
# Both set up whatever is missing first (idempotent; a second run takes seconds).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python

.PHONY: setup run test lint bench lock clean

setup:
	@$(PYTHON) tools/setup_env.py

run: setup
	@$(VENV)/bin/captain-ros doctor

test: setup
	@$(VENV)/bin/ruff check .
	@$(VENV)/bin/ruff format --check .
	@$(PY) -m pytest

lint: setup
	@$(VENV)/bin/ruff check --fix .
	@$(VENV)/bin/ruff format .

bench: setup
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# Re-resolve requirements/base.in into requirements/lock.txt in a scratch venv.
lock:
	@$(PYTHON) tools/lock_requirements.py

clean:
	rm -rf $(VENV) .setup-logs build install log

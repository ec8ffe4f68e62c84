# captain_ros: the two commands are `make run` (main job) and `make test` (all tests).
# Both set up whatever is missing first (idempotent; a second run takes seconds).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# The second environment: the ROS 2 Jazzy wheels. The main pytest run uses the Kilted ones; the node
# start-up and DDS smoke tests then run again here, so every node is proven to start on both distros.
JAZZY_PY    := .venv-jazzy/bin/python
JAZZY_TESTS := tests/workspace/test_node_startup.py
# Test files run in parallel, each whole on one worker with its own ROS domain (tests/conftest.py). Two workers on
# two cores: the load the DDS tests are stress-tested under (tools/stress_dds_tests.py: two busy loops); three kept
# both cores 86% busy with 30 runnable processes, and waits of 30-60 s ran out.
TEST_WORKERS ?= 2

.PHONY: setup run test lint bench lock clean

setup:
	@$(PYTHON) tools/setup_env.py

# The main job: whole episodes on the twin over ROS with the scripted expert (RUN_ARGS, e.g.
# RUN_ARGS="--task open_drawer --episodes 5 --policy-url http://127.0.0.1:8000/v1"; see captain-ros run --help).
run: setup
	@$(VENV)/bin/captain-ros run $(RUN_ARGS)

test: setup
	@$(VENV)/bin/ruff check .
	@$(VENV)/bin/ruff format --check .
	@$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not serial"
	@$(PY) -m pytest -m serial
	@echo "== node start-up and DDS smoke tests on ROS 2 Jazzy ($(JAZZY_PY))"
	@$(JAZZY_PY) -m pytest $(JAZZY_TESTS)

lint: setup
	@$(VENV)/bin/ruff check --fix .
	@$(VENV)/bin/ruff format .

bench: setup
	@for b in bench/[!_]*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# Re-resolve the requirement files in scratch venvs: lock.txt, jazzy-lock.txt, colcon.txt
# (`make lock LOCK=jazzy` for one of main, jazzy, colcon).
lock:
	@$(PYTHON) tools/lock_requirements.py $(LOCK)

clean:
	rm -rf $(VENV) .venv-jazzy .venv-vllm .venv-libero .cache .setup-logs build install log

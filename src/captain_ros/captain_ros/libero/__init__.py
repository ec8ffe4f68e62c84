"""LIBERO and LIBERO-PRO through the harness: the benchmark's scenes driven by the same backend interface.

LIBERO needs robosuite 1.4 and MuJoCo < 4, so the benchmark lives in its own venv (`.venv-libero`, setup step
`libero`) and runs in a server process (`server.py`, which imports only numpy, the benchmark and
`captain_ros.core.trajectory`); the harness talks to it through `LiberoBackend` (`libero_backend.py`) over a private
socket (`protocol.py`)."""

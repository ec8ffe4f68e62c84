"""The native LIBERO environment's own costs, for bench/libero.py (runs in .venv-libero, started by that script).

Prints one JSON line: the mean wall time of env.step (robosuite's OSC controller, 25 physics steps = 50 ms of
simulated time) with LIBERO's two cameras rendered at the harness's size (RGB + depth), of the same step without
any rendering, and of rendering the two cameras alone (env observations, force-updated).
"""

import json
import os
import sys
import time

import numpy as np
from libero.libero import benchmark, get_libero_path
from libero.libero.envs import OffScreenRenderEnv

size, n = int(sys.argv[1]), int(sys.argv[2])
suite = benchmark.get_benchmark_dict()["libero_spatial"]()
task = suite.get_task(0)
bddl = os.path.join(get_libero_path("bddl_files"), task.problem_folder, task.bddl_file)
state = suite.get_task_init_states(0)[11]


def timed(fn, count):
    fn()  # warm up
    t0 = time.perf_counter()
    for _ in range(count):
        fn()
    return (time.perf_counter() - t0) / count


env = OffScreenRenderEnv(bddl_file_name=bddl, camera_heights=size, camera_widths=size, camera_depths=True)
env.seed(0)
env.reset()
env.set_init_state(state)
zero = np.zeros(7)
step_render = timed(lambda: env.step(zero), n)
observe = timed(lambda: env.env._get_observations(force_update=True), n)
env.close()
env = OffScreenRenderEnv(bddl_file_name=bddl, has_offscreen_renderer=False, use_camera_obs=False)
env.seed(0)
env.reset()
env.set_init_state(state)
step_bare = timed(lambda: env.step(zero), 4 * n)
env.close()
print(json.dumps({"step_render_s": step_render, "observe_s": observe, "step_s": step_bare, "sim_s_per_step": 0.05}))

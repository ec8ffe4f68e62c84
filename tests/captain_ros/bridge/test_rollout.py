"""Rollouts end to end: the scripted expert behind the recording proxy, twin worker processes, the episode store
streamed over pyzmq to a trainer-side receiver; kill -9 of a worker (with its twin) and of the proxy mid-episode;
the same workers on a local Ray cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from captain_ros.bridge.host import HostOptions, RolloutHost, Watchdog
from captain_ros.bridge.rollout import Job, RolloutReport
from captain_ros.bridge.store import EpisodeReader, EpisodeStore

pytestmark = pytest.mark.slow
WAIT_S = 300.0  # the most any condition below is waited for (a loaded CI machine)


def _group(task: str, start: str, attempts: int) -> list[Job]:
    return [Job(task, start, a, start, "eval") for a in range(attempts)]


def _wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)  # poll interval


def _check_whole(store_path) -> list[str]:
    """Every valid episode has its start, end, and a model_call and a step for each request; returns them."""
    reader = EpisodeReader(store_path)
    ids = reader.episode_ids()
    for eid in ids:
        episode = reader.load(eid)
        n = episode.end["requests"]
        assert [r.index for r in episode.requests] == list(range(1, n + 1)), eid
        assert all(r.model_call is not None and r.step is not None for r in episode.requests), eid
    return ids


def _same_records(a, b) -> None:
    import sqlite3

    def digests(path):
        with sqlite3.connect(path) as db:
            return dict(db.execute("SELECT id, sha256 FROM records").fetchall())

    assert digests(a) == digests(b)


def test_a_group_is_recorded_shipped_and_readable_by_the_trainer(tmp_path):
    jobs = _group("put_red_cube_in_bowl", "put_red_cube_in_bowl/official/11", 2)
    with RolloutHost(HostOptions(tmp_path / "run", workers=2, progress=False, policy_version=7)) as host:
        report = host.run(jobs)
        assert host.drain() == 0
    assert (report.episodes, report.valid, report.strict) == (2, 2, 2), report.as_dict()
    assert report.version_lag == {0: 2} and report.stale == 0
    _same_records(host.store_path, host.trainer_store)  # every record reached the trainer, byte for byte
    ids = _check_whole(host.trainer_store)
    reader = EpisodeReader(host.trainer_store)
    episodes = [reader.load(eid) for eid in ids]
    assert sorted(e.start["attempt"] for e in episodes) == [0, 1]
    assert {e.start["group_id"] for e in episodes} == {"put_red_cube_in_bowl/official/11"}
    for episode in episodes:
        assert episode.start["policy_version"] == 7 and episode.start["policy"] == "expert"
        first = episode.requests[0].model_call
        assert first["policy_version"] == 7 and first["messages"][0]["role"] == "system"
        assert first["timing"]["proxy_s"] >= 0 and first["response"]["tool_calls"]


def test_a_stream_runs_jobs_admitted_while_it_runs_until_stopped(tmp_path):
    """LocalEngine.stream (an RL driver's rollouts): the first group, then a second one admitted only after an
    episode of the first ended, both run on the same workers; `admit` returning nothing leaves them idle, not
    stopped; the stream ends when told, with its report filled as it went."""
    groups = [
        _group("open_drawer", "open_drawer/official/11", 2),
        _group("close_drawer", "close_drawer/official/11", 2),
    ]
    ended, stop = threading.Event(), threading.Event()
    asked: list[int] = []

    def admit() -> list[Job]:
        asked.append(len(groups))
        if len(groups) == 2 or (groups and ended.is_set()):
            return groups.pop(0)
        return []

    report = RolloutReport()

    def progress(r: RolloutReport) -> None:
        ended.set()
        if r.episodes == 4:
            stop.set()

    with RolloutHost(HostOptions(tmp_path / "run", workers=2, progress=False, ship=False)) as host:
        from captain_ros.bridge.rollout import LocalEngine

        returned = LocalEngine(host.config(), progress).stream(admit, stop, report)
    assert returned is report and (report.episodes, report.valid) == (4, 4) and not groups
    # asked only while a worker was idle: the second group once a worker had finished, then nothing to give (the
    # workers idled, not stopped, until told)
    assert asked[:2] == [2, 1] and set(asked[2:]) == {0}
    reader = EpisodeReader(host.store_path)
    tasks = sorted(reader.load(e).start["task"] for e in reader.episode_ids())
    assert tasks == ["close_drawer", "close_drawer", "open_drawer", "open_drawer"]


def test_kill_9_of_a_worker_mid_episode_abandons_it_and_runs_the_job_again(tmp_path):
    jobs = _group("open_drawer", "open_drawer/official/14", 2)
    with RolloutHost(HostOptions(tmp_path / "run", workers=2, progress=False)) as host:
        killed: list[str] = []

        def kill_a_worker_mid_episode() -> None:
            with EpisodeStore(host.store_path) as store:

                def a_step_of_an_open_episode() -> bool:
                    return any(store.record_ids(r["episode_id"], "step") for r in store.episodes(status="open"))

                _wait_for(a_step_of_an_open_episode, "a recorded step")
                name, pid = next(iter(host.engine.pids().items()))
                os.kill(pid, signal.SIGKILL)
                killed.append(name)

        threading.Thread(target=kill_a_worker_mid_episode, daemon=True).start()
        report: RolloutReport = host.run(jobs)
        assert host.drain() == 0
    assert killed and report.restarts >= 1
    assert report.valid == 2 and report.episodes == 2  # both attempts ran to the end, one of them twice
    assert len(report.abandoned) == 1 and "died (exit code -9) during the episode" in report.abandoned[0]
    with EpisodeStore(host.trainer_store) as store:
        abandoned = [r for r in store.episodes(status="complete", valid=False)]
        assert len(abandoned) == 1 and abandoned[0]["outcome"] == "infrastructure_failure"
        assert store.episodes(status="open") == []
    assert len(_check_whole(host.trainer_store)) == 2
    _same_records(host.store_path, host.trainer_store)


def test_kill_9_of_the_proxy_mid_episode_loses_no_acknowledged_record(tmp_path):
    jobs = _group("put_red_cube_in_bowl", "put_red_cube_in_bowl/official/11", 2)
    with RolloutHost(HostOptions(tmp_path / "run", workers=1, progress=False)) as host:
        watchdog = Watchdog(host, names=("proxy",))
        watchdog.start()

        def kill_the_proxy_mid_episode() -> None:
            with EpisodeStore(host.store_path) as store:

                def a_model_call_of_an_open_episode() -> bool:
                    opened = store.episodes(status="open")
                    return any(store.record_ids(r["episode_id"], "model_call") for r in opened)

                _wait_for(a_model_call_of_an_open_episode, "a recorded model call")
                host.services["proxy"].kill()

        threading.Thread(target=kill_the_proxy_mid_episode, daemon=True).start()
        try:
            report = host.run(jobs)
        finally:
            watchdog.stopping.set()
        assert host.drain() == 0
    assert "proxy" in watchdog.restarts and report.episodes == 2
    # the agent's retries reach the restarted proxy (same port, same store), or the episode is invalid and says why
    with EpisodeStore(host.trainer_store) as store:
        for row in store.episodes(status="complete", valid=False):
            assert "policy server" in store.record(row["episode_id"], "episode_end").payload["invalid_reason"]
        assert store.episodes(status="open") == []
    assert len(_check_whole(host.trainer_store)) == report.valid
    _same_records(host.store_path, host.trainer_store)


def test_a_small_rollout_on_a_local_ray_cluster(tmp_path):
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": {"MUJOCO_GL": "egl"}})
    try:
        jobs = _group("put_red_cube_in_bowl", "put_red_cube_in_bowl/official/11", 2)
        options = HostOptions(tmp_path / "run", workers=2, progress=False, engine="ray")
        with RolloutHost(options) as host:
            report = host.run(jobs)
            assert host.drain() == 0
    finally:
        ray.shutdown()
    assert (report.episodes, report.valid) == (2, 2), report.as_dict()
    with EpisodeStore(host.trainer_store) as store:
        workers = {r["worker"] for r in store.episodes()}
    assert workers <= {"ray-w1", "ray-w2"} and workers
    assert len(_check_whole(host.trainer_store)) == 2


MANAGER = """
import sys
from pathlib import Path
from captain_ros.bridge.rollout import LocalEngine, RolloutConfig
if __name__ == "__main__":  # spawned workers re-import this file
    engine = LocalEngine(RolloutConfig(Path(sys.argv[1]), "http://127.0.0.1:9/v1", workers=2))
    engine._spawn()
    engine._spawn()
    print(" ".join(str(pid) for pid in engine.pids().values()), flush=True)
    sys.stdin.read()  # until killed
"""


def test_workers_exit_when_their_manager_is_killed(tmp_path):
    script = tmp_path / "manager.py"
    script.write_text(MANAGER)
    argv = [sys.executable, str(script), str(tmp_path / "s.sqlite")]
    manager = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in manager.stdout.readline().split()]
        assert len(pids) == 2

        def holds_the_store(pid: int) -> bool:  # the worker finished starting: its RolloutWorker opened the store
            fds = Path(f"/proc/{pid}/fd")
            return any(os.readlink(fd) == str(store) for fd in fds.iterdir() if fd.is_symlink())

        store = tmp_path / "s.sqlite"
        _wait_for(lambda: all(holds_the_store(pid) for pid in pids), "both workers to start")
        os.kill(manager.pid, signal.SIGKILL)
        manager.wait()

        def alive(pid: int) -> bool:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"  # a zombie has exited

        _wait_for(lambda: not any(alive(pid) for pid in pids), "the orphaned workers to exit")
    finally:
        manager.kill()


def _descendants(pid: int) -> set[int]:
    """Every process below `pid`, by the parent ids in /proc (those in sessions of their own included)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # exited while read
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except OSError:
        return False


def test_sigterm_to_a_rollout_stops_its_workers_and_services(tmp_path):
    """`kill <pid>` of `captain-ros rollout` ends it as Ctrl-C does: its proxy (in a session of its own, so no
    signal of the terminal's reaches it) and its workers go with it, and it says so. Before, SIGTERM ended the
    command at once and left the proxy running, holding the store."""
    store = tmp_path / "runs"
    argv = [sys.executable, "-m", "captain_ros.cli", "rollout", "--tasks", "put_red_cube_in_bowl", "--split", "train"]
    argv += ["--starts-per-task", "40", "--group-size", "1", "--workers", "1", "--no-images", "--no-ship"]
    cli = subprocess.Popen([*argv, "--runs-dir", str(store)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: any(store.glob("*/rollout.sqlite")), "the rollout's store")
        _wait_for(lambda: len(_descendants(cli.pid)) >= 3, "the proxy and the worker to start")
        started = _descendants(cli.pid)
        cli.send_signal(signal.SIGTERM)
        _, err = cli.communicate(timeout=WAIT_S)
        assert cli.returncode == 130 and "interrupted; the workers and services it started were stopped" in err, err
        _wait_for(lambda: not any(_alive(pid) for pid in started), "the rollout's processes to exit")
    finally:
        cli.kill()
        cli.wait()


def test_the_episode_budget_runs_on_the_twins_simulated_time():
    """A twin worker's wall-time budget is the twin's time (as the agent node's ROS clock on the twin): waiting for
    a slow model server spends none of it, and a reset (time back to 0) does not give it back or take it away."""
    from types import SimpleNamespace

    from captain_ros.bridge.rollout import RolloutConfig, episode_clock

    twin = SimpleNamespace(time_s=0.0)
    link = SimpleNamespace(twin=None)
    clock = episode_clock(RolloutConfig(Path("unused.sqlite"), "http://unused/v1"), link)
    assert clock() == 0.0  # no twin yet
    link.twin = twin
    twin.time_s = 2.5
    time.sleep(0.01)  # host time passes: the budget does not see it
    assert clock() == 2.5
    twin.time_s = 0.0  # the next episode's reset
    assert clock() == 2.5
    twin.time_s = 1.0
    assert clock() == 3.5
    assert (
        episode_clock(RolloutConfig(Path("unused.sqlite"), "http://unused/v1", backend="libero"), link)
        is time.monotonic
    )


def test_a_plugin_is_named_and_a_bad_name_says_what_it_must_be():
    """The trainer hands the workers its early stop by name (`early_stop_factory`): the bridge imports no trainer."""
    import re

    from captain_ros.bridge.rollout import plugin

    assert plugin("pathlib:PurePosixPath", "early_stop_factory")("a/b").name == "b"
    with pytest.raises(ValueError, match=re.escape("early_stop_factory must be 'package.module:name', got 'pathlib'")):
        plugin("pathlib", "early_stop_factory")
    with pytest.raises(ValueError, match="'pathlib:Nope' names nothing importable here"):
        plugin("pathlib:Nope", "early_stop_factory")
    with pytest.raises(ValueError, match="'no_such_module_x:f' names nothing importable here"):
        plugin("no_such_module_x:f", "early_stop_factory")


def test_nothing_in_captain_ros_imports_the_trainer():
    """docs/architecture.md: torch and transformers stay off the robot. Every import, at the top of a file or inside
    a function, of every module under captain_ros/."""
    import ast

    package = Path(__file__).resolve().parents[3] / "src" / "captain_ros" / "captain_ros"
    wrong = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            wrong += [
                f"{path.relative_to(package)}:{node.lineno} {n}"
                for n in names
                if n.split(".")[0] == "captain_ros_training"
            ]
    assert not wrong, wrong

"""Rollouts: N parallel workers in a world (the twin, or LIBERO: `captain_ros.worlds`) running groups of G attempts
per start state, recorded into an episode store (the rollout host's outbox) and tagged with the policy version.

A worker is one process with its own simulator (the world's link), harness core and sandboxed sessions; the policy
is reached through the recording proxy, which writes each request's model call into the same store. Workers take
jobs (task, start id, attempt) from one queue, so a group's G attempts run in parallel on different
workers. The manager assigns every episode its id before it starts, so when a worker dies (kill -9, a
crashed twin) the episode it was running is closed as an invalid infrastructure failure and its job
runs again under a new id; the worker is restarted.

Policy versions and staleness: the proxy holds the version being served (the trainer bumps it after a
weight update); each episode is tagged with it at its start and each model call with the version that
produced it. An episode more than `max_staleness` versions behind the proxy's version when it ends is
counted as stale (the trainer's reader drops it: `EpisodeReader.episode_ids(min_policy_version=...)`).

Local processes by default; `RayEngine` runs the same workers as Ray actors across a cluster (each host
writes its own store and ships it with `captain-ros transport ship`).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

POLL_S = 0.2  # how often the manager looks at its result queue and its workers' liveness


@dataclass(frozen=True)
class Job:
    task: str
    start_id: str
    attempt: int
    group_id: str
    split: str = "train"
    episode_id: str = ""  # assigned by the manager when the job is dispatched


@dataclass(frozen=True)
class RolloutConfig:
    store_path: Path  # the rollout host's episode store (the proxy writes into it too)
    policy_url: str  # the recording proxy's /v1 URL
    workers: int = 2
    policy: str = "expert"  # a label recorded with every episode
    max_staleness: int = 2  # versions behind the served policy an episode may be and still train
    max_restarts: int = 50  # worker restarts before the rollout gives up
    runs_dir: Path | None = None  # transcripts per episode (None: none)
    request_timeout_s: float = 600.0
    harness_path: Path | None = None  # a harness.yaml for the workers (None: config/harness.yaml)
    backend: str = "twin"  # the world (captain_ros.worlds): twin | libero (the benchmark's scenes, a server per worker)
    segmentation: str = ""  # how perception names objects, where the world has variants ("": its default; see
    # World.segmentations: LIBERO's "oracle" is labelled as such)
    log_dir: Path | None = None  # the LIBERO servers' logs (None: a temporary folder each)
    send_images: bool = True  # False for a text-only policy model: no camera images in requests
    max_new_tokens: int = 0  # sampled tokens per request at most (0: the harness's agent.max_new_tokens)
    requests_budget: int = 0  # requests per episode (0: the harness's budgets.requests)
    context_limit_tokens: int = 0  # the policy model's context (0: the harness's); history is compacted before it
    early_stop_critic: Path | None = None  # RL only: the critic a trainer publishes; its App. E rule cuts hopeless
    # episodes. None (evaluation, data collection): nothing is ever cut
    early_stop_factory: str = ""  # "module:name", called with early_stop_critic, gives the worker's stopper
    # (begin/check/record, bridge/recorder.py): a plug-in by name, so the bridge imports no trainer

    @property
    def world_options(self) -> Any:
        from captain_ros.worlds import WorldOptions

        return WorldOptions(segmentation=self.segmentation, log_dir=self.log_dir)

    @property
    def backend_label(self) -> str:
        """The simulator as recorded with each episode: `twin`, `libero/appearance`, `libero/oracle` ..."""
        from captain_ros.worlds import world

        return world(self.backend).label(self.world_options)


def with_overrides(harness: Any, config: RolloutConfig) -> Any:
    """The harness with the rollout's overrides: images, tokens per request, requests per episode, context."""
    agent = replace(
        harness.agent,
        send_images=harness.agent.send_images and config.send_images,
        max_new_tokens=config.max_new_tokens or harness.agent.max_new_tokens,
    )
    if config.context_limit_tokens:  # compaction keeps the same headroom below the limit as harness.yaml's
        headroom = harness.agent.context_limit_tokens - harness.agent.compaction_at_tokens
        limit = config.context_limit_tokens
        agent = replace(
            agent, context_limit_tokens=limit, compaction_at_tokens=limit - max(headroom, agent.max_new_tokens)
        )
    budgets = replace(harness.budgets, requests=config.requests_budget or harness.budgets.requests)
    return replace(harness, agent=agent, budgets=budgets)


def plan_groups(
    tasks: Iterable[str],
    starts_per_task: int,
    group_size: int,
    split: str = "train",
    seed: int = 0,
    *,
    backend: str = "twin",
) -> list[Job]:
    """`starts_per_task` start states per task, each run `group_size` times (one group per start state), on the world
    `backend` names (captain_ros.worlds). On the twin start states are drawn from the split's generator; on LIBERO
    they are official initial states, each once per task (libero.link.start_states)."""
    from captain_ros.worlds import world

    place = world(backend)
    rng = np.random.default_rng(seed)
    jobs = []
    for task in tasks:
        for start in place.start_states(task, split, starts_per_task, rng):
            group = place.group_id(task, start)
            jobs += [Job(task, start, attempt, group, split) for attempt in range(group_size)]
    return jobs


def proxy_version(policy_url: str, wait_s: float = 120.0) -> int:
    """The policy version the recording proxy serves now; waits up to `wait_s` for a proxy that is down
    (restarting after a crash) before raising."""
    import httpx

    root = policy_url.rstrip("/").removesuffix("/v1")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            reply = httpx.get(f"{root}/captain/status", timeout=10.0, trust_env=False)
            reply.raise_for_status()
            return int(reply.json()["policy_version"])
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the recording proxy at {root} does not answer: {exc}") from exc
            time.sleep(0.5)  # poll interval while it restarts


def make_link(config: RolloutConfig, harness: Any, name: str) -> tuple[Any, Any]:
    """The agent link of a worker on its world, and the recorder's privileged source for it."""
    from captain_ros.worlds import world

    place = world(config.backend)
    link = place.link(harness, config.world_options, name)
    return link, place.privileged(link)


def plugin(spec: str, what: str) -> Any:
    """The object `spec` ("package.module:name") names, imported when asked for: how a trainer hands the workers
    code of its own (the RL early stop) without the bridge importing the trainer."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"{what} must be 'package.module:name', got {spec!r}")
    import importlib

    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"{what} {spec!r} names nothing importable here: {exc}") from exc


def episode_clock(config: RolloutConfig, link: Any) -> Callable[[], float]:
    """The clock the episode's wall-time budget runs on, the world's: the twin's simulated time, as in the agent node
    on the twin (its ROS clock), so a slow model server (vLLM on 2 CPU cores writes 8 tokens/s per request) spends no
    robot time; LIBERO's server keeps the host's monotonic clock."""
    from captain_ros.worlds import world

    return world(config.backend).clock(link)


class RolloutWorker:
    """Runs episodes one at a time: the world's simulator (the twin, or a LIBERO server) and harness in-process, the
    policy through the proxy, records into the store. Used by worker processes and by Ray actors alike."""

    def __init__(self, config: RolloutConfig, name: str):
        from captain_ros.agent.episode import EpisodeRunner
        from captain_ros.agent.policy_client import PolicyClient, PolicyConfig
        from captain_ros.agent.sandbox import Sandbox, SandboxLimits
        from captain_ros.bridge.store import EpisodeStore
        from captain_ros.core.config import load_config

        self.config, self.name = config, name
        harness = with_overrides(load_config(harness_path=self.config.harness_path), config)
        limits = SandboxLimits(cell_timeout_s=harness.agent.cell_timeout_s)

        def sandbox(scratch, on_call, allowed):
            box = Sandbox(scratch, on_call, allowed, limits)
            box.start()
            return box

        self.store = EpisodeStore(config.store_path)
        self.link, self.source = make_link(config, harness, name)
        policy = PolicyClient(  # the harness's sampling settings, as the agent node uses them
            PolicyConfig(
                base_url=config.policy_url,
                max_tokens=harness.agent.max_new_tokens,
                temperature=harness.agent.temperature,
                request_timeout_s=config.request_timeout_s,
            )
        )
        self.runner = EpisodeRunner(
            self.link,
            policy,
            harness,
            sandbox_factory=sandbox,
            runs_dir=config.runs_dir,
            clock=episode_clock(config, self.link),
        )
        self.stopper = None
        if config.early_stop_critic is not None:
            self.stopper = plugin(config.early_stop_factory, "early_stop_factory")(config.early_stop_critic)

    def run(self, job: Job) -> dict[str, Any]:
        from captain_ros.bridge.recorder import EpisodeMeta, EpisodeRecorder

        version = proxy_version(self.config.policy_url)
        meta = EpisodeMeta(
            job.attempt,
            job.group_id,
            version,
            self.config.policy,
            self.name,
            job.split,
            backend=self.config.backend_label,
        )
        stop = None if self.stopper is None else self.stopper.episode(job.episode_id)
        recorder = EpisodeRecorder(self.store, job.episode_id, self.source, meta, early_stop=stop)
        self.runner.recorder = recorder
        t0 = time.perf_counter()
        result = self.runner.run(job.task, job.start_id, job.split, job.episode_id)
        end = self.store.record(job.episode_id, "episode_end")
        if end is None:  # the recorder could not write it (e.g. a full disk): close the episode as invalid
            self.store.abandon(job.episode_id, f"its end could not be recorded ({result.reason})")
        return {
            "episode_id": job.episode_id,
            "outcome": result.outcome.value,
            "valid": bool(end and end.payload["valid"]),
            "strict": result.strict_success,
            "requests": result.requests,
            "policy_version": version,
            "seconds": time.perf_counter() - t0,
            "record_s": recorder.record_s,
            "request_s": sum(t.total_s for t in result.timings),
            "early_stopped": bool(stop is not None and stop.cut is not None),
        }

    def run_safely(self, job: Job) -> dict[str, Any]:
        """`run`, with an episode that could not run at all reported as {"episode_id", "error"}."""
        try:
            return self.run(job)
        except Exception as exc:
            return {"episode_id": job.episode_id, "error": f"{type(exc).__name__}: {exc}"}

    def close(self) -> None:
        self.link.close()
        self.store.close()


def _worker_main(config: RolloutConfig, name: str, jobs: mp.Queue, results: mp.Queue) -> None:
    """One worker process: runs the jobs the manager assigns to it, one at a time, until it gets None, or until
    the manager is gone (killed: nobody would collect the results, and the worker must not linger)."""
    os.environ.setdefault("MUJOCO_GL", "egl")
    manager = mp.parent_process()
    worker = RolloutWorker(config, name)
    try:
        while manager is None or manager.is_alive():
            try:
                job = jobs.get(timeout=POLL_S * 5)
            except queue.Empty:
                continue
            if job is None:
                return
            results.put((name, worker.run_safely(job)))
    finally:
        worker.close()


@dataclass
class RolloutReport:
    episodes: int = 0  # episodes that ended (valid or not)
    valid: int = 0
    strict: int = 0
    outcomes: Counter = field(default_factory=Counter)
    abandoned: list[str] = field(default_factory=list)  # "<episode id>: why"
    restarts: int = 0
    stale: int = 0  # more than max_staleness versions behind when they ended
    version_lag: Counter = field(default_factory=Counter)  # lag -> episodes
    seconds: float = 0.0
    record_s: float = 0.0
    request_s: float = 0.0
    errors: list[str] = field(default_factory=list)

    def add(self, summary: dict[str, Any], current_version: int, max_staleness: int) -> None:
        self.episodes += 1
        self.valid += int(summary["valid"])
        self.strict += int(summary["strict"])
        self.outcomes[summary["outcome"]] += 1
        lag = current_version - summary["policy_version"]
        self.version_lag[lag] += 1
        self.stale += int(lag > max_staleness)
        self.record_s += summary["record_s"]
        self.request_s += summary["request_s"]

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["outcomes"], d["version_lag"] = dict(self.outcomes), {str(k): v for k, v in self.version_lag.items()}
        return d


class LocalEngine:
    """N worker processes on this host (spawned: each gets a fresh MuJoCo/EGL context). The manager hands
    each idle worker one job on its own queue, so it always knows which episode a dead worker was running."""

    def __init__(self, config: RolloutConfig, on_progress: Callable[[RolloutReport], None] | None = None):
        self.config, self.on_progress = config, on_progress or (lambda report: None)
        self.ctx = mp.get_context("spawn")
        self.results: mp.Queue = self.ctx.Queue()
        self.workers: dict[str, tuple[Any, mp.Queue]] = {}  # name -> (process, its job queue)
        self.assigned: dict[str, Job] = {}  # worker -> the job it runs now
        self.todo: list[Job] = []
        self._count = 0

    def _spawn(self) -> None:
        self._count += 1
        name = f"{os.uname().nodename}-w{self._count}"
        jobs = self.ctx.Queue()
        proc = self.ctx.Process(target=_worker_main, args=(self.config, name, jobs, self.results), daemon=True)
        proc.start()
        self.workers[name] = (proc, jobs)

    def pids(self) -> dict[str, int]:
        """Worker name -> pid, for the workers alive now (fault injection kills them)."""
        return {n: p.pid for n, (p, _) in self.workers.items() if p.is_alive()}

    def run(self, jobs: list[Job]) -> RolloutReport:
        from captain_ros.bridge.store import EpisodeStore

        report = RolloutReport()
        store = EpisodeStore(self.config.store_path)
        t0 = time.perf_counter()
        self.todo = [replace(j, episode_id=j.episode_id or _new_id()) for j in jobs]
        for _ in range(self.config.workers):
            self._spawn()
        try:
            while report.episodes < len(jobs):
                self._assign()
                self._collect(report, store)
                self._reap(report, store)
        finally:
            self.close()
            store.close()
        report.seconds = time.perf_counter() - t0
        return report

    def stream(self, admit: Callable[[], list[Job]], stop: Any, report: RolloutReport | None = None) -> RolloutReport:
        """`run` for a job list that grows while it runs (an RL driver's rollouts, captain_ros_training.rl_host):
        while a worker is idle and no job waits, `admit()` gives more jobs ([]: none now, asked again after the next
        poll); runs until `stop` (a threading.Event) is set, then closes its workers (an episode still running stays
        open in the store; a rerun of its job is the caller's). Worker deaths and retries are as in `run`. `report`
        (filled as episodes end, for a caller to watch) is returned."""
        from captain_ros.bridge.store import EpisodeStore

        report = RolloutReport() if report is None else report
        store = EpisodeStore(self.config.store_path)
        t0 = time.perf_counter()
        for _ in range(self.config.workers):
            self._spawn()
        try:
            while not stop.is_set():
                while len(self.todo) < len(self.workers) - len(self.assigned):  # a worker would be idle
                    jobs = admit()
                    if not jobs:
                        break
                    self.todo += [replace(j, episode_id=j.episode_id or _new_id()) for j in jobs]
                self._assign()
                self._collect(report, store)  # waits up to POLL_S for an ended episode
                self._reap(report, store)
        finally:
            self.close()
            store.close()
            report.seconds = time.perf_counter() - t0
        return report

    def _assign(self) -> None:
        for name, (proc, queue_) in self.workers.items():
            if self.todo and name not in self.assigned and proc.is_alive():
                self.assigned[name] = job = self.todo.pop(0)
                queue_.put(job)

    def _collect(self, report: RolloutReport, store) -> None:
        try:
            name, summary = self.results.get(timeout=POLL_S)
        except queue.Empty:
            return
        job = self.assigned.pop(name, None)
        if "error" in summary:  # the episode could not run (e.g. the proxy stayed down): run it again
            why = f"worker {name}: {summary['error']}"
            store.abandon(summary["episode_id"], why)
            report.errors.append(f"{summary['episode_id']}: {why}")
            self._retry(job, report)
            return
        self._ended(report, summary)

    def _ended(self, report: RolloutReport, summary: dict[str, Any]) -> None:
        try:
            current = proxy_version(self.config.policy_url, wait_s=0.0)
        except RuntimeError:
            current = summary["policy_version"]  # the proxy is restarting; its version did not change
        report.add(summary, current, self.config.max_staleness)
        self.on_progress(report)

    def _retry(self, job: Job | None, report: RolloutReport) -> None:
        if job is not None:
            self.todo.append(replace(job, episode_id=_new_id()))  # a new id: the old one is closed
        if len(report.errors) + report.restarts > self.config.max_restarts:
            raise RuntimeError(
                f"{report.restarts} worker deaths and {len(report.errors)} errors: giving up; last: "
                f"{(report.abandoned + report.errors)[-3:]}"
            )

    def _reap(self, report: RolloutReport, store) -> None:
        for name, (proc, _) in list(self.workers.items()):
            if proc.is_alive():
                continue
            del self.workers[name]
            report.restarts += 1
            job = self.assigned.pop(name, None)
            if job is not None:
                why = f"worker {name} died (exit code {proc.exitcode}) during the episode"
                if store.abandon(job.episode_id, why):
                    report.abandoned.append(f"{job.episode_id}: {why}")
                    self._retry(job, report)
                else:  # it ended and was stored, but its summary died with the worker
                    self._ended(report, _summary_from_store(store, job.episode_id))
            self._spawn()

    def close(self) -> None:
        for _, jobs in self.workers.values():
            jobs.put(None)
        deadline = time.monotonic() + 30.0
        for proc, _ in self.workers.values():
            proc.join(timeout=max(0.1, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join()
        self.workers.clear()


def _new_id() -> str:
    return uuid.uuid4().hex[:16]


def _summary_from_store(store, episode_id: str) -> dict[str, Any]:
    start = store.record(episode_id, "episode_start").payload
    end = store.record(episode_id, "episode_end").payload
    return {
        "episode_id": episode_id,
        "outcome": end["outcome"],
        "valid": end["valid"],
        "strict": end["outcome"] == "success",
        "requests": end["requests"],
        "policy_version": start["policy_version"],
        "seconds": 0.0,
        "record_s": 0.0,
        "request_s": 0.0,
    }


class RayEngine:
    """The same workers as Ray actors (one per worker) on a Ray cluster: `ray.init(address=...)` is the
    caller's; every actor writes the store path on its own host. Actor death is handled like a dead worker
    process: the episode is abandoned (when the store is reachable from here) and its job re-run."""

    def __init__(self, config: RolloutConfig, on_progress: Callable[[RolloutReport], None] | None = None):
        import ray

        self.ray, self.config = ray, config
        self.on_progress = on_progress or (lambda report: None)
        self.actor_cls = ray.remote(num_cpus=1, max_restarts=-1)(_RayWorker)
        self.actors = [self.actor_cls.remote(config, f"ray-w{i + 1}") for i in range(config.workers)]

    def run(self, jobs: list[Job]) -> RolloutReport:
        from captain_ros.bridge.store import EpisodeStore

        ray = self.ray
        report = RolloutReport()
        store = EpisodeStore(self.config.store_path)
        t0 = time.perf_counter()
        todo = [replace(j, episode_id=j.episode_id or _new_id()) for j in jobs]
        in_flight: dict[Any, tuple[Any, Job]] = {}
        idle = list(self.actors)
        try:
            while todo or in_flight:
                while todo and idle:
                    actor, job = idle.pop(), todo.pop(0)
                    in_flight[actor.run.remote(job)] = (actor, job)
                done, _ = ray.wait(list(in_flight), num_returns=1)
                actor, job = in_flight.pop(done[0])
                idle.append(actor)
                try:
                    summary = ray.get(done[0])
                except ray.exceptions.RayActorError as exc:  # the actor restarts (max_restarts=-1)
                    summary = {"episode_id": job.episode_id, "error": f"ray actor died during the episode: {exc}"}
                    report.restarts += 1
                if "error" in summary:
                    store.abandon(job.episode_id, summary["error"])
                    report.errors.append(f"{job.episode_id}: {summary['error']}")
                    if len(report.errors) > self.config.max_restarts:
                        raise RuntimeError(f"{len(report.errors)} episodes could not run; last: {report.errors[-3:]}")
                    todo.append(replace(job, episode_id=_new_id()))
                    continue
                report.add(summary, proxy_version(self.config.policy_url), self.config.max_staleness)
                self.on_progress(report)
        finally:
            store.close()
        report.seconds = time.perf_counter() - t0
        return report

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor)


class _RayWorker:
    def __init__(self, config: RolloutConfig, name: str):
        os.environ.setdefault("MUJOCO_GL", "egl")
        self.worker = RolloutWorker(config, name)

    def run(self, job: Job) -> dict[str, Any]:
        return self.worker.run_safely(job)

"""A rollout host: the policy (the scripted expert unless a server URL is given) behind the recording proxy,
N twin (or LIBERO) workers, the episode store, and the shipper streaming it to a trainer-side receiver (a local one
unless `--ship` names the trainer's). Used by `captain-ros rollout`, `captain-ros eval run` and
bench/bridge.py; every process it starts logs under <run_dir>/logs/.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from captain_ros.bridge.rollout import Job, LocalEngine, RayEngine, RolloutConfig, RolloutReport
from captain_ros.bridge.services import Service, free_port

DRAIN_TIMEOUT_S = 600.0  # after the last episode, the shipper has this long to deliver everything
CLI = "captain_ros.cli"  # the services are captain-ros commands: expert-server, proxy, transport receive|ship


@dataclass
class HostOptions:
    run_dir: Path
    workers: int = 2
    policy_url: str = ""  # "" = start the scripted expert
    policy: str = ""  # label; "" = "expert" or the URL
    policy_version: int = 0
    ship_to: str = ""  # a trainer's receiver endpoint (tcp://host:port); "" = a local receiver
    ship: bool = True
    engine: str = "local"  # local | ray
    ray_address: str = ""  # "" = start a local Ray instance
    progress: bool = True
    harness_path: Path | None = None  # the workers' harness.yaml (None: config/harness.yaml)
    backend: str = "twin"  # the world (captain_ros.worlds): twin | libero
    segmentation: str = ""  # how perception names objects where the world has variants ("": its default)
    send_images: bool = True  # False for text-only policy models
    max_new_tokens: int = 0  # 0: the harness's
    requests_budget: int = 0  # 0: the harness's
    context_limit_tokens: int = 0  # 0: the harness's
    early_stop_critic: Path | None = None  # RL only: the trainer's published critic cuts hopeless episodes (App. E)
    early_stop_factory: str = ""  # RL only: "module:name" of the trainer's stopper (RolloutConfig.early_stop_factory)
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))


class RolloutHost:
    def __init__(self, options: HostOptions):
        self.o = options
        self.run_dir = Path(options.run_dir)
        self.logs = self.run_dir / "logs"
        self.store_path = self.run_dir / "rollout.sqlite"
        self.trainer_store = self.run_dir / "trainer.sqlite"
        self.services: dict[str, Service] = {}
        self.engine: LocalEngine | RayEngine | None = None
        self.policy_url = ""
        self.endpoint = ""

    # ------------------------------------------------------------------------------------------ bring-up
    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        env = {**self.o.env, "PYTHONUNBUFFERED": "1"}
        upstream = self.o.policy_url
        if not upstream:
            expert = Service("expert", CLI, ["expert-server", "--port", "0"], self.logs, env=env)
            upstream = expert.start().removesuffix("/v1") + "/v1"
            self.services["expert"] = expert
        proxy_port = free_port()
        proxy_args = ["--upstream", upstream, "--store", str(self.store_path), "--port", str(proxy_port)]
        if "expert" in self.services:  # not a language model: its replies carry no token ids or logprobs
            proxy_args.append("--allow-missing-token-ids")
        proxy = Service(
            "proxy",
            CLI,
            ["proxy", *proxy_args, "--policy-version", str(self.o.policy_version)],
            self.logs,
            env=env,
        )
        self.policy_url = proxy.start().removesuffix("/v1") + "/v1"
        self.services["proxy"] = proxy
        if self.o.ship:
            if self.o.ship_to:
                self.endpoint = self.o.ship_to
            else:
                port = free_port()
                self.endpoint = f"tcp://127.0.0.1:{port}"
                receiver = Service(
                    "receiver",
                    CLI,
                    ["transport", "receive", "--store", str(self.trainer_store), "--bind", self.endpoint],
                    self.logs,
                    ready=False,
                    port=port,
                    env=env,
                )
                receiver.start()
                self.services["receiver"] = receiver
            shipper = Service(
                "shipper",
                CLI,
                ["transport", "ship", "--store", str(self.store_path), "--connect", self.endpoint],
                self.logs,
                ready=False,
                env=env,
            )
            shipper.start()
            self.services["shipper"] = shipper

    def config(self) -> RolloutConfig:
        label = self.o.policy or ("expert" if not self.o.policy_url else self.o.policy_url)
        return RolloutConfig(
            self.store_path,
            self.policy_url,
            workers=self.o.workers,
            policy=label,
            harness_path=self.o.harness_path,
            backend=self.o.backend,
            segmentation=self.o.segmentation,
            log_dir=self.logs,
            send_images=self.o.send_images,
            max_new_tokens=self.o.max_new_tokens,
            requests_budget=self.o.requests_budget,
            context_limit_tokens=self.o.context_limit_tokens,
            early_stop_critic=self.o.early_stop_critic,
            early_stop_factory=self.o.early_stop_factory,
        )

    # ------------------------------------------------------------------------------------------ rollout
    def run(self, jobs: list[Job], on_progress: Callable[[RolloutReport], None] | None = None) -> RolloutReport:
        """Run the jobs on the engine with a progress bar; `on_progress` also sees each ended episode (the
        benchmark injects faults from it)."""
        from tqdm import tqdm

        bar = tqdm(total=len(jobs), desc="episodes", unit="ep", disable=not self.o.progress)

        def progress(report: RolloutReport) -> None:
            bar.n = report.episodes
            bar.set_postfix(
                strict=f"{report.strict}/{report.valid}",
                invalid=report.episodes - report.valid,
                restarts=report.restarts,
                stale=report.stale,
            )
            bar.refresh()
            if on_progress is not None:
                on_progress(report)

        if self.o.engine == "ray":
            import ray

            if not ray.is_initialized():
                ray.init(address=self.o.ray_address or None, include_dashboard=False, log_to_driver=False)
            self.engine = RayEngine(self.config(), progress)
        else:
            self.engine = LocalEngine(self.config(), progress)
        try:
            return self.engine.run(jobs)
        finally:
            bar.close()
            if isinstance(self.engine, RayEngine):
                self.engine.close()

    def drain(self, timeout_s: float = DRAIN_TIMEOUT_S) -> int:
        """Wait until the receiver acknowledged every stored record; returns how many are still unacknowledged."""
        from captain_ros.bridge.store import EpisodeStore

        if "shipper" not in self.services:
            return 0
        with EpisodeStore(self.store_path) as store:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                left = len(store.unacked(limit=100_000))
                if left == 0:
                    return 0
                for name in ("shipper", "receiver"):  # a service killed by fault injection comes back
                    service = self.services.get(name)
                    if service is not None and not service.alive:
                        service.start()
                time.sleep(0.5)  # poll interval
            return len(store.unacked(limit=100_000))

    def stop(self) -> None:
        for name in ("shipper", "receiver", "proxy", "expert"):
            service = self.services.get(name)
            if service is not None:
                service.stop()

    def __enter__(self) -> RolloutHost:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def write_summary(path: Path, report: RolloutReport, extra: dict[str, Any]) -> None:
    path.write_text(json.dumps({**report.as_dict(), **extra}, indent=2, default=str) + "\n")


class Watchdog(threading.Thread):
    """Restarts host services that died (a killed proxy or shipper comes back on the same port and store)."""

    def __init__(self, host: RolloutHost, names: tuple[str, ...] = ("proxy", "shipper", "receiver")):
        super().__init__(daemon=True)
        self.host, self.names = host, names
        self.stopping = threading.Event()
        self.restarts: list[str] = []

    def run(self) -> None:
        while not self.stopping.wait(0.5):
            for name in self.names:
                service = self.host.services.get(name)
                if service is not None and not service.alive:
                    try:
                        service.start()
                        self.restarts.append(name)
                    except RuntimeError as exc:
                        self.restarts.append(f"{name} (failed: {exc})")

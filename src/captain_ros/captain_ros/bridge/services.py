"""The rollout host's helper processes (policy server, recording proxy, shipper, receiver) as services that
can be started, killed (fault injection) and restarted on the same port and store."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from captain_ros.stack import start_ready


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def signal_group(proc: subprocess.Popen, sig: int, wait_s: float) -> bool:
    """`sig` to the process group of `proc` (started with start_new_session), then wait up to `wait_s`;
    returns whether it has exited."""
    if proc.poll() is not None:
        return True
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return True
    try:
        proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        return False
    return True


def wait_for_port(port: int, proc: subprocess.Popen, what: str, log: Path, timeout_s: float = 120.0) -> None:
    """Until something listens on 127.0.0.1:port (a service without a READY line)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the {what} exited with {proc.returncode} while starting; see {log}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)  # poll interval
    raise RuntimeError(f"the {what} did not listen on port {port} within {timeout_s:.0f} s; see {log}")


class Service:
    """One child process. `module` and `args` make its command line (`python -m module args...`); with
    `ready=True` it prints `READY <url>` when it serves (stdout), else it is waited for on `port` if given."""

    def __init__(
        self,
        name: str,
        module: str,
        args: list[str],
        log_dir: Path,
        *,
        ready: bool = True,
        port: int | None = None,
        env: dict[str, str] | None = None,
    ):
        self.name, self.module, self.args = name, module, args
        self.log_dir, self.ready, self.port = Path(log_dir), ready, port
        self.env = env or dict(os.environ)
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.starts = 0

    @property
    def argv(self) -> list[str]:
        return [sys.executable, "-m", self.module, *self.args]

    def start(self) -> str:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        log = self.log_dir / f"{self.name}.log" if self.starts == 1 else self.log_dir / f"{self.name}.{self.starts}.log"
        if self.ready:
            self.proc, self.url = start_ready(self.argv, self.env, log, self.name)
        else:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
            )
            if self.port is not None:
                wait_for_port(self.port, self.proc, self.name, log)
        return self.url

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.alive else None

    def kill(self) -> None:
        """SIGKILL the service and its children (fault injection)."""
        self._signal(signal.SIGKILL, 30.0)

    def stop(self) -> None:
        if self.alive:
            self._signal(signal.SIGTERM, 20.0)
        if self.alive:
            self.kill()

    def restart(self) -> str:
        self.stop()
        return self.start()

    def _signal(self, sig: int, wait_s: float) -> None:
        if self.proc is not None:
            signal_group(self.proc, sig, wait_s)

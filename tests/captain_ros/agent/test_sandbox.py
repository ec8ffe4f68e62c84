"""The agent's sandbox with real bubblewrap: a persistent session, robot calls over the pipe, and what a hostile cell
cannot do (processes, network, the host's files and environment, signals, memory, output, time)."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from captain_ros.agent.sandbox import (
    CellResult,
    Sandbox,
    SandboxError,
    SandboxLimits,
    _python_dirs,
    build_seccomp_filter,
)

REPO = Path(__file__).resolve().parents[3]
ALLOWED = ["move_to", "observe", "finish"]
# What the session's own /tmp shows: nothing, but the folders its interpreter and venv are bound at when they live
# under the host's /tmp (a clone there): empty mount points in the sandbox's tmpfs.
OWN_TMP = sorted({Path(d).parts[2] for d in _python_dirs(sys.executable) if Path(d).parts[:2] == ("/", "tmp")})


class Recorder:
    """A plain on_call: remembers every call and echoes it back."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list, dict]] = []
        self.fail_with: Exception | None = None

    def __call__(self, name: str, args: list, kwargs: dict) -> dict:
        self.calls.append((name, args, kwargs))
        if self.fail_with is not None:
            raise self.fail_with
        return {"ok": True, "name": name, "args": args, "kwargs": kwargs, "nan": float("nan")}


def run(sandbox: Sandbox, code: str) -> CellResult:
    return sandbox.run_cell(textwrap.dedent(code))


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One session for the tests that leave it usable."""
    recorder = Recorder()
    with Sandbox(tmp_path_factory.mktemp("scratch"), recorder, ALLOWED) as sandbox:
        yield sandbox, recorder


@pytest.fixture
def make(tmp_path):
    """Fresh sandboxes for the tests that crash, restart or limit one."""
    made: list[Sandbox] = []

    def factory(**limits) -> Sandbox:
        sandbox = Sandbox(tmp_path / f"scratch{len(made)}", Recorder(), ALLOWED, SandboxLimits(**limits))
        sandbox.start()
        made.append(sandbox)
        return sandbox

    yield factory
    for sandbox in made:
        sandbox.close()


def _gone_or_zombie(pid: int) -> bool:
    """The process has exited (a zombie is waiting for whoever inherited it to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def host_is_fine() -> None:
    """The agent's machine can still start processes."""
    assert subprocess.run(["true"], timeout=30).returncode == 0


# --- the session --------------------------------------------------------------------------------------------------


def test_variables_functions_and_imports_persist_across_cells(shared):
    sandbox, _ = shared
    assert run(sandbox, "counter = 41\ndef bump(x):\n    return x + 1\nimport math").status == "ok"
    result = run(sandbox, "counter = bump(counter)\nprint(counter, math.pi > 3)")
    assert (result.status, result.output, result.error, result.restarted) == ("ok", "42 True\n", "", False)


def test_last_expression_is_echoed_like_a_repl(shared):
    sandbox, _ = shared
    assert run(sandbox, "x_echo = [1, 2]\nx_echo + [3]").output == "[1, 2, 3]\n"
    assert run(sandbox, "None").output == ""
    long = run(sandbox, "'a' * 100_000").output
    assert len(long) < 5000 and "more characters" in long


@pytest.mark.slow
def test_numpy_scipy_and_pillow_import_and_work(shared):
    sandbox, _ = shared
    result = run(
        sandbox,
        """
        import numpy as np, scipy.linalg, PIL.Image
        a = np.arange(9.0).reshape(3, 3) + np.eye(3)
        image = PIL.Image.new("RGB", (4, 3))
        print(round(float(np.linalg.det(scipy.linalg.expm(np.zeros((2, 2))))), 6), image.size, a.shape)
        """,
    )
    assert result.status == "ok", result.error
    assert result.output == "1.0 (4, 3) (3, 3)\n"


def test_environment_identity_and_limits_inside(shared):
    sandbox, _ = shared
    result = run(
        sandbox,
        """
        import os, resource
        status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines())
        print(os.getuid(), os.getgid(), os.getcwd(), os.environ["HOME"], os.getpid())
        print(status["CapEff"].strip(), status["NoNewPrivs"].strip(), status["Seccomp"].strip())
        print([resource.getrlimit(getattr(resource, n)) for n in ("RLIMIT_AS", "RLIMIT_NOFILE", "RLIMIT_FSIZE",
               "RLIMIT_CORE", "RLIMIT_CPU", "RLIMIT_NPROC")])
        """,
    )
    limits = SandboxLimits()
    lines = result.output.splitlines()
    assert lines[0] == "65534 65534 /scratch /scratch 1"
    assert lines[1] == "0000000000000000 1 2"  # no capabilities, no new privileges, a seccomp filter
    expected = [
        (limits.memory_bytes,) * 2,
        (limits.max_open_files,) * 2,
        (limits.max_file_bytes,) * 2,
        (0, 0),
        (limits.cpu_time_s,) * 2,
        (limits.max_threads,) * 2,
    ]
    assert lines[2] == str(expected)


def test_syntax_error_reports_message_and_line(shared):
    sandbox, _ = shared
    result = run(sandbox, "x_ok = 1\ny = (\n")
    assert result.status == "error" and not result.restarted
    assert "SyntaxError" in result.error and "line 2" in result.error
    assert run(sandbox, "return 5").status == "error"  # a compile-time error, not a parse error


def test_traceback_shows_cell_frames_only(shared):
    sandbox, _ = shared
    run(sandbox, "def divide(a):\n    return a / 0\n")
    result = run(sandbox, "value = 3\ndivide(value)")
    assert result.status == "error" and not result.restarted
    assert "ZeroDivisionError: division by zero" in result.error
    assert "return a / 0" in result.error  # the source line of a function defined in an earlier cell
    assert "<cell" in result.error and "/sandbox/" not in result.error and "child.py" not in result.error


# --- robot calls --------------------------------------------------------------------------------------------------


def test_robot_calls_round_trip_nested_values_nan_and_numpy(shared):
    sandbox, recorder = shared
    recorder.calls.clear()
    result = run(
        sandbox,
        """
        import numpy as np
        reply = robot.move_to(np.array([0.1, 0.2, 0.3]), (1, 2), frame={"name": "base", "pose": {"z": np.float32(0.5),
                              "n": np.int64(3), "ok": np.bool_(True)}}, speed=float("nan"), limit=float("inf"))
        print(sorted(reply), reply["nan"] != reply["nan"], reply["kwargs"]["frame"]["pose"]["n"])
        done = finish(success=True)
        """,
    )
    assert result.status == "ok", result.error
    assert result.output == "['args', 'kwargs', 'name', 'nan', 'ok'] True 3\n"
    (name, args, kwargs), finish_call = recorder.calls
    assert name == "move_to" and args == [[0.1, 0.2, 0.3], [1, 2]]
    assert kwargs["frame"] == {"name": "base", "pose": {"z": 0.5, "n": 3, "ok": True}}
    assert math.isnan(kwargs["speed"]) and kwargs["limit"] == math.inf
    assert finish_call == ("finish", [], {"success": True})


def test_unknown_robot_function_lists_the_allowed_ones(shared):
    sandbox, recorder = shared
    recorder.calls.clear()
    result = run(sandbox, "robot.self_destruct()")
    assert result.status == "error"
    assert "AttributeError" in result.error and all(name in result.error for name in ALLOWED)
    assert run(sandbox, "sorted(dir(robot))").output == f"{sorted(ALLOWED)}\n"
    assert recorder.calls == []


def test_arguments_that_are_not_json_give_a_clear_type_error(shared):
    sandbox, recorder = shared
    recorder.calls.clear()
    for argument in ("object()", "b'bytes'", "{1, 2}"):
        result = run(sandbox, f"robot.observe({argument})")
        assert result.status == "error" and "TypeError" in result.error and "cannot be sent" in result.error
    assert recorder.calls == []


def test_a_failing_callback_becomes_an_error_in_the_cell(shared):
    sandbox, recorder = shared
    recorder.fail_with = ValueError("the arm is unreachable")
    try:
        result = run(sandbox, "robot.observe()")
    finally:
        recorder.fail_with = None
    assert result.status == "error" and "the arm is unreachable" in result.error and not result.restarted
    assert run(sandbox, "robot.observe()['ok']").output == "True\n"


def test_forged_messages_cannot_call_functions_outside_the_allow_list(shared):
    sandbox, recorder = shared
    recorder.calls.clear()
    result = run(
        sandbox,
        """
        import json, os, struct
        body = json.dumps({"op": "call", "name": "self_destruct", "args": [], "kwargs": {}}).encode()
        robot.observe()  # a real call first: the channel is open while a cell runs
        os.write(4, struct.pack(">I", len(body)) + body)
        size, = struct.unpack(">I", os.read(3, 4))
        print(json.loads(os.read(3, size)))
        """,
    )
    assert result.status == "ok", result.error
    assert "robot has no function 'self_destruct'" in result.output
    assert [name for name, _, _ in recorder.calls] == ["observe"]


# --- processes and threads ----------------------------------------------------------------------------------------


def test_fork_subprocess_and_multiprocessing_are_refused(shared):
    sandbox, _ = shared
    result = run(
        sandbox,
        """
        import multiprocessing, os, subprocess
        refused = []
        for attempt in (os.fork, lambda: subprocess.run(["ls"]), lambda: subprocess.Popen(["/bin/true"]),
                        lambda: os.posix_spawn("/bin/true", ["true"], {}),
                        lambda: multiprocessing.Process(target=print).start()):
            try:
                attempt()
            except OSError as exc:
                refused.append(exc.errno)
        children = 0
        for _ in range(1000):  # a fork bomb
            try:
                if os.fork() == 0:
                    os._exit(0)
                children += 1
            except OSError:
                pass
        print(refused, children)
        """,
    )
    assert result.status == "ok", result.error
    assert result.output == "[1, 1, 1, 1, 1] 0\n"  # EPERM every time
    host_is_fine()


def test_threads_and_numpy_threads_work(shared):
    sandbox, _ = shared
    result = run(
        sandbox,
        """
        import threading, numpy as np
        results = []
        workers = [threading.Thread(target=lambda i=i: results.append(i * i)) for i in range(8)]
        [w.start() for w in workers]; [w.join() for w in workers]
        a = np.random.default_rng(0).standard_normal((400, 400))
        print(sorted(results), np.allclose(a @ np.linalg.inv(a), np.eye(400), atol=1e-6))
        """,
    )
    assert result.status == "ok", result.error
    assert result.output == "[0, 1, 4, 9, 16, 25, 36, 49] True\n"


def test_a_thread_bomb_is_stopped(make):
    sandbox = make(max_threads=64)
    result = run(
        sandbox,
        """
        import threading, time
        threading.stack_size(65536)
        started = 0
        try:
            while True:
                threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
                started += 1
        except RuntimeError:
            print("refused after", started)
        """,
    )
    if os.getuid() == 0:  # the kernel does not apply RLIMIT_NPROC to host root: the watchdog stops it
        assert result.status == "crashed" and "more than 64 threads" in result.error and result.restarted
    else:
        assert result.status == "ok" and result.output.startswith("refused after")
    assert run(sandbox, "'next'").output == "'next'\n"
    host_is_fine()


# --- network ------------------------------------------------------------------------------------------------------


def test_no_network_tcp_or_unix_sockets_to_the_host(shared, tmp_path):
    sandbox, _ = shared
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    unix_path = tmp_path / "host.sock"
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(str(unix_path))
    unix.listen()
    abstract_name = f"\0captain-sandbox-test-{uuid.uuid4().hex}"
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind(abstract_name)
    abstract.listen()
    try:
        port = listener.getsockname()[1]
        result = run(
            sandbox,
            f"""
            import socket
            outcomes = []
            for family, address in ((socket.AF_INET, ("127.0.0.1", {port})), (socket.AF_INET, ("1.1.1.1", 53)),
                                    (socket.AF_INET6, ("::1", {port})), (socket.AF_UNIX, {str(unix_path)!r}),
                                    (socket.AF_UNIX, {abstract_name!r})):
                try:
                    with socket.socket(family, socket.SOCK_STREAM) as s:
                        s.settimeout(3)
                        s.connect(address)
                    outcomes.append("connected")
                except OSError as exc:
                    outcomes.append(type(exc).__name__)
            for family in (socket.AF_NETLINK, socket.AF_PACKET):
                try:
                    socket.socket(family, socket.SOCK_RAW)
                    outcomes.append("created")
                except OSError as exc:
                    outcomes.append(type(exc).__name__)
            print(outcomes)
            """,
        )
        assert result.status == "ok", result.error
        outcomes = eval(result.output)
        assert "connected" not in outcomes and "created" not in outcomes
        assert outcomes[:3] == ["PermissionError"] * 3  # seccomp refuses IP sockets
        with pytest.raises(BlockingIOError):
            listener.accept()
        unix.setblocking(False)
        abstract.setblocking(False)
        for server in (unix, abstract):
            with pytest.raises(BlockingIOError):
                server.accept()
    finally:
        for server in (listener, unix, abstract):
            server.close()


@pytest.mark.slow
def test_rclpy_gets_no_channel_out(make):
    sandbox = make()  # its own session: Fast DDS keeps printing errors from a thread of its own afterwards
    result = run(
        sandbox,
        """
        try:
            import rclpy
            rclpy.init()
            node = rclpy.create_node("escape")
            print("participant created")
        except Exception as exc:
            print("refused:", type(exc).__name__)
        """,
    )
    assert result.status == "ok", result.error
    assert "refused:" in result.output and "participant created" not in result.output


# --- the host's files, environment and processes -------------------------------------------------------------------


def _host_paths_that_must_be_hidden(tmp_path: Path) -> list[str]:
    interpreter = {Path(p) for p in (sys.prefix, sys.base_prefix)}
    needed = {parent for path in interpreter for parent in (path, *path.parents)}
    paths = [REPO / "pyproject.toml", REPO / "src", REPO / ".git", Path("/etc/shadow"), Path("/etc/hostname"), tmp_path]
    for folder in (Path("/root"), Path("/home")):
        try:
            paths += [entry for entry in folder.iterdir() if entry not in needed]
        except OSError:
            pass
    return [str(path) for path in paths if path.exists() or path.is_symlink()]


def test_host_files_outside_the_scratch_folder_are_hidden(shared, tmp_path):
    sandbox, _ = shared
    hidden = _host_paths_that_must_be_hidden(tmp_path)
    assert len(hidden) >= 4
    result = run(sandbox, f"import os\n[p for p in {hidden!r} if os.path.exists(p) or os.path.islink(p)]")
    assert (result.status, result.output) == ("ok", "[]\n")
    result = run(sandbox, "open('/etc/shadow').read()")
    assert result.status == "error" and "FileNotFoundError" in result.error


def test_writes_outside_scratch_fail_and_the_host_is_unchanged(shared, tmp_path):
    sandbox, _ = shared
    name = f"captain-sandbox-{uuid.uuid4().hex}.txt"
    host_tmp_file = Path("/tmp") / name
    host_tmp_file.write_text("host")
    repo_target = REPO / name
    try:
        targets = [str(repo_target), f"/usr/{name}", "/etc/passwd", "/sandbox/child.py", f"/{name}", f"/dev/{name}",
                   "/proc/sys/kernel/hostname", str(sys.prefix) + f"/{name}"]  # fmt: skip
        result = run(
            sandbox,
            f"""
            import os
            failed = []
            for path in {targets!r}:
                try:
                    with open(path, "w") as f:
                        f.write("sandbox")
                except OSError:
                    failed.append(path)
            with open("/tmp/{name}", "w") as f:  # the sandbox's own /tmp: a tmpfs no host path backs
                f.write("sandbox")
            with open("/scratch/note.txt", "w") as f:
                f.write("mine")
            print(len(failed))
            """,
        )
        assert result.status == "ok", result.error
        bound = _python_dirs(sys.executable)  # read-only wherever they are
        in_own_tmp = sum(t.startswith("/tmp/") and not any(t.startswith(f"{d}/") for d in bound) for t in targets)
        assert result.output == f"{len(targets) - in_own_tmp}\n"
        assert host_tmp_file.read_text() == "host"
        assert not repo_target.exists() and not Path(sys.prefix, name).exists()
        assert run(sandbox, f"open('/tmp/{name}').read()").output == "'sandbox'\n"
        assert not list(sandbox.scratch_dir.rglob(name))
        assert (sandbox.scratch_dir / "note.txt").read_text() == "mine"
    finally:
        host_tmp_file.unlink()


def test_kernel_settings_and_internals_are_out_of_reach(shared):
    sandbox, _ = shared
    sysctls = ["/proc/sys/kernel/core_pattern", "/proc/sys/kernel/pid_max", "/proc/sys/vm/drop_caches"]
    result = run(
        sandbox,
        f"""
        import os
        print([os.access(p, os.W_OK) for p in {sysctls!r}])  # access() only: a regression must not write them
        try:
            open("/proc/sys/kernel/hostname", "w").write("escaped")  # its own UTS namespace even if it worked
        except OSError as exc:
            print(type(exc).__name__)
        for path in ("/proc/kcore", "/proc/kallsyms", "/proc/kpageflags"):
            try:
                open(path, "rb").read(1)
                print("read", path)
            except OSError:
                pass
        """,
    )
    assert (result.status, result.output) == ("ok", "[False, False, False]\nOSError\n")


def test_setuid_and_setgid_bits_are_refused(shared):
    sandbox, _ = shared
    result = run(
        sandbox,
        """
        import os
        refused = []
        for mode in (0o4755, 0o2755):
            for attempt in (lambda: os.close(os.open(f"suid{mode:o}", os.O_CREAT | os.O_WRONLY, mode)),
                            lambda: os.chmod("plain", mode), lambda: os.mknod(f"node{mode:o}", mode | 0o100000)):
                open("plain", "w").close()
                try:
                    attempt()
                except PermissionError:
                    refused.append(mode)
        os.chmod("plain", 0o755)
        print(len(refused), oct(os.stat("plain").st_mode & 0o7777))
        """,
    )
    assert (result.status, result.output) == ("ok", "6 0o755\n")


def test_the_agents_environment_is_invisible(make, monkeypatch):
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    monkeypatch.setenv("CAPTAIN_SANDBOX_TEST_SECRET", secret)
    sandbox = make()
    result = run(
        sandbox,
        f"""
        import os
        seen = [k for k, v in os.environ.items() if {secret!r} in v or k == "CAPTAIN_SANDBOX_TEST_SECRET"]
        for entry in os.listdir("/proc"):
            for leaf in ("environ", "cmdline"):
                try:
                    if {secret!r}.encode() in open(f"/proc/{{entry}}/{{leaf}}", "rb").read():
                        seen.append(entry + "/" + leaf)
                except OSError:
                    pass
        print(seen, os.path.exists("/proc/{os.getpid()}/environ"))
        """,
    )
    assert (result.status, result.output) == ("ok", "[] False\n")
    assert secret not in result.output + result.error


def test_proc_shows_only_the_sandbox_itself(shared):
    sandbox, _ = shared
    result = run(sandbox, "import os\nprint([p for p in os.listdir('/proc') if p.isdigit()], os.getppid())")
    assert result.output == "['1'] 0\n"


def test_signals_cannot_reach_the_agent_or_other_processes(shared):
    sandbox, _ = shared
    victim = subprocess.Popen(["sleep", "60"])
    try:
        result = run(
            sandbox,
            f"""
            import ctypes, os, signal
            outcomes = []
            for pid in ({os.getpid()}, {victim.pid}, {os.getppid()}):
                try:
                    os.kill(pid, signal.SIGKILL)
                    outcomes.append("sent")
                except ProcessLookupError:
                    outcomes.append("no such process")
            outcomes.append(ctypes.CDLL(None).kill({os.getpid()}, 9))
            os.kill(1, signal.SIGKILL)  # itself, pid 1 of its namespace: ignored
            try:
                os.kill(-1, signal.SIGKILL)  # every process it may signal
            except ProcessLookupError:
                outcomes.append("none to signal")
            survivor = "still here"
            print(outcomes)
            """,
        )
        assert result.status == "ok", result.error
        assert result.output == "['no such process', 'no such process', 'no such process', -1, 'none to signal']\n"
        assert victim.poll() is None
        assert run(sandbox, "survivor").output == "'still here'\n"
    finally:
        victim.kill()
        victim.wait()


# --- crashes, exits and tampering ---------------------------------------------------------------------------------


def test_a_segfault_through_ctypes_is_reported_and_the_session_restarts(make):
    sandbox = make()
    run(sandbox, "kept = 1")
    result = run(sandbox, "import ctypes\nctypes.string_at(0)")
    assert result.status == "crashed" and result.restarted and "SIGSEGV" in result.error
    after = run(sandbox, "kept")
    assert after.status == "error" and "NameError" in after.error and not after.restarted
    assert run(sandbox, "1 + 1").output == "2\n"


def test_sys_exit_keeps_the_session_and_os_exit_restarts_it(make):
    sandbox = make()
    run(sandbox, "kept = 'yes'")
    for code in ("import sys; sys.exit(3)", "raise SystemExit", "raise KeyboardInterrupt"):
        result = run(sandbox, code)
        assert result.status == "error" and not result.restarted
    assert run(sandbox, "kept").output == "'yes'\n"
    result = run(sandbox, "import os; os._exit(0)")
    assert result.status == "crashed" and result.restarted and "status 0" in result.error
    assert run(sandbox, "'fresh'").output == "'fresh'\n"


def test_closing_stdio_or_the_channel_never_confuses_the_agent(make):
    sandbox = make()
    run(sandbox, "kept = 5")
    run(sandbox, "import os\nfor fd in (0, 1, 2):\n    os.close(fd)")
    result = run(sandbox, "print('printing again'); kept")
    assert (result.status, result.output, result.restarted) == ("ok", "printing again\n5\n", False)
    result = run(sandbox, "import os\nos.close(3); os.close(4)")
    assert result.status == "crashed" and result.restarted
    result = run(sandbox, "import os\nos.write(4, b'\\xff\\xff\\xff\\xff garbage')\nimport time; time.sleep(5)")
    assert result.status == "crashed" and result.restarted and "protocol" in result.error
    assert run(sandbox, "'fine'").output == "'fine'\n"


@pytest.mark.parametrize(
    "tampering",
    [
        "import sys; sys.modules.clear()",
        "import json; json.dumps = json.loads = None",
        "import os; os.write = os.read = None",
        "import os, sys; sys.stdout = sys.stderr = open(os.devnull, 'w')",
        "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)",
    ],
)
def test_tampering_with_the_session_does_not_break_it(make, tampering):
    sandbox = make()
    run(sandbox, "kept = 1")
    assert run(sandbox, tampering).status == "ok"
    result = run(sandbox, "kept, robot.observe()['ok']")  # the echo, the robot channel and the variables work
    assert (result.status, result.output, result.restarted) == ("ok", "(1, True)\n", False)


def test_breaking_the_session_for_good_costs_a_restart(make):
    sandbox = make()
    result = run(sandbox, "import os\nos.dup2(0, 4)  # the channel to the agent now leads to /dev/null")
    assert result.status == "crashed" and result.restarted and "channel" in result.error
    assert run(sandbox, "print('clean')").output == "clean\n"


def test_a_session_that_died_between_cells_is_restarted_and_said_so(make):
    sandbox = make()
    pid = sandbox.child_pid
    run(sandbox, "import os, threading\nthreading.Timer(0.2, os._exit, (7,)).start()")
    deadline = time.monotonic() + 60
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    result = run(sandbox, "'runs'")
    assert (result.status, result.output, result.restarted) == ("ok", "'runs'\n", True)
    assert "status 7" in result.error and "fresh session" in result.error


# --- resources ----------------------------------------------------------------------------------------------------


def test_huge_allocations_raise_memory_error(shared):
    sandbox, _ = shared
    for code in ("import numpy as np\nnp.ones(10**11)", "bytearray(8 * 10**9)", "b'x' * (3 * 1024**3)"):
        result = run(sandbox, code)
        assert result.status == "error" and "MemoryError" in result.error and not result.restarted
    assert run(sandbox, "len(bytearray(10**8))").output == "100000000\n"  # 100 MB is fine


def test_an_output_flood_is_cut_and_the_cell_stopped(make):
    sandbox = make()
    cap = SandboxLimits().max_output_bytes
    run(sandbox, "kept = 'state'")
    for code in ("while True:\n    print('flood' * 20)", "import os\nwhile True:\n    os.write(1, b'x' * 4096)"):
        result = run(sandbox, code)
        assert result.status == "output_limit" and not result.restarted
        assert cap - 4096 < len(result.output.encode()) <= cap
        assert str(cap) in result.error
    assert run(sandbox, "kept").output == "'state'\n"


def test_an_output_flood_that_ignores_interrupts_is_killed(make):
    sandbox = make(interrupt_grace_s=1.0)
    result = run(
        sandbox, "while True:\n    try:\n        print('x' * 1000)\n    except KeyboardInterrupt:\n        pass"
    )
    assert result.status == "output_limit" and result.restarted
    assert run(sandbox, "'next'").output == "'next'\n"


@pytest.mark.slow
def test_an_infinite_loop_times_out_and_the_next_cell_works(make):
    sandbox = make(cell_timeout_s=3.0)
    run(sandbox, "kept = 1")
    result = run(sandbox, "while True:\n    pass")
    assert result.status == "timeout" and result.restarted and result.duration_s >= 3.0
    after = run(sandbox, "'alive'")
    assert (after.status, after.output) == ("ok", "'alive'\n")


@pytest.mark.slow
def test_the_cpu_time_limit_stops_a_busy_session(make):
    sandbox = make(cpu_time_s=2, cell_timeout_s=60.0)
    result = run(sandbox, "while True:\n    pass")
    assert result.status == "crashed" and result.restarted and "CPU time" in result.error
    assert run(sandbox, "'alive'").output == "'alive'\n"


def test_a_file_stops_at_the_file_size_limit(make):
    sandbox = make(max_file_bytes=16 * 1024**2)
    result = run(
        sandbox,
        """
        with open("big.bin", "wb") as f:
            for _ in range(1024):
                f.write(b"0" * 1024**2)  # 1 GB
        """,
    )
    assert result.status == "error" and "File too large" in result.error
    assert (sandbox.scratch_dir / "big.bin").stat().st_size == 16 * 1024**2


# --- life cycle ---------------------------------------------------------------------------------------------------


def test_close_kills_the_session_and_is_idempotent(tmp_path):
    with Sandbox(tmp_path, Recorder(), ALLOWED) as sandbox:
        pid = sandbox.child_pid
        assert run(sandbox, "1").output == "1\n"
    assert _gone_or_zombie(pid)
    sandbox.close()
    with pytest.raises(SandboxError):
        sandbox.run_cell("1")


def test_a_sandbox_started_from_a_short_lived_thread_survives_it(tmp_path):
    sandbox = Sandbox(tmp_path, Recorder(), ALLOWED)
    try:
        starter = threading.Thread(target=sandbox.start)
        starter.start()
        starter.join()
        time.sleep(0.2)
        result = run(sandbox, "'alive'")
        assert (result.output, result.restarted) == ("'alive'\n", False)
    finally:
        sandbox.close()


@pytest.mark.slow
def test_the_session_dies_with_the_agent(tmp_path):
    script = textwrap.dedent(
        f"""
        import sys, time
        from captain_ros.agent.sandbox import Sandbox
        sandbox = Sandbox({str(tmp_path)!r}, lambda *a: {{}}, ["observe"])
        sandbox.start()
        print(sandbox.child_pid, flush=True)
        time.sleep(120)
        """
    )
    agent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(agent.stdout.readline())
        assert Path(f"/proc/{pid}").exists()
    finally:
        agent.send_signal(signal.SIGKILL)
        agent.wait()
    deadline = time.monotonic() + 30
    while not _gone_or_zombie(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone_or_zombie(pid), "the sandbox outlived the agent"


def test_missing_bwrap_gives_an_actionable_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SandboxError, match="apt-get install bubblewrap"):
        Sandbox(tmp_path / "scratch", Recorder(), ALLOWED).start()


def test_robot_function_names_must_be_public_identifiers(tmp_path):
    for bad in ("_private", "not valid", "__class__"):
        with pytest.raises(ValueError):
            Sandbox(tmp_path, Recorder(), [bad])


def test_the_seccomp_program_is_well_formed():
    for machine in ("x86_64", "aarch64"):
        program = build_seccomp_filter(machine)
        assert len(program) % 8 == 0 and 40 < len(program) // 8 < 256
    with pytest.raises(SandboxError):
        build_seccomp_filter("riscv64")
    assert json.dumps(SandboxLimits().__dict__)  # the limits can be saved next to a run's outputs


# --- links a cell plants in scratch, through restarts; what the host does with scratch ------------------------------

ESCAPE_CELLS = [  # the escape of issue 30: a link at scratch/tmp to the host's /, then a restart
    "import os; os.symlink('/', '/scratch/tmp'); os._exit(3)",
    "import os; print(sorted(os.listdir('/tmp'))); print(os.path.exists('/tmp/etc/passwd'))",
]


@pytest.fixture
def host_canary(tmp_path):
    """A host folder outside scratch with a file in it, and a check that both are untouched."""
    folder = tmp_path / "host-secret"
    folder.mkdir(mode=0o750)
    (folder / "secret.txt").write_text("host only")
    os.chmod(folder / "secret.txt", 0o640)

    def untouched() -> None:
        assert sorted(p.name for p in folder.iterdir()) == ["secret.txt"]
        assert (folder / "secret.txt").read_text() == "host only"
        assert oct(folder.stat().st_mode & 0o777) == oct(0o750)
        assert oct((folder / "secret.txt").stat().st_mode & 0o777) == oct(0o640)

    return folder, untouched


def test_a_link_planted_at_scratch_tmp_reaches_nothing_after_a_crash_restart(make):
    sandbox = make()
    crashed = run(sandbox, ESCAPE_CELLS[0])
    assert crashed.status == "crashed" and crashed.restarted
    after = run(sandbox, ESCAPE_CELLS[1])
    assert after.status == "ok", after.error
    assert after.output == f"{OWN_TMP}\nFalse\n"  # a fresh /tmp of the session's own; the host's / is nowhere
    result = run(sandbox, "open('/tmp/etc/shadow', 'rb').read()")
    assert result.status == "error" and "FileNotFoundError" in result.error


def test_a_link_planted_then_a_timeout_restart_reaches_nothing(make, host_canary):
    folder, untouched = host_canary
    sandbox = make(cell_timeout_s=3)
    planted = run(
        sandbox,
        f"""
        import os, time
        os.symlink({str(folder)!r}, '/scratch/tmp')
        os.symlink('/', '/scratch/root-link')
        time.sleep(60)
        """,
    )
    assert planted.status == "timeout" and planted.restarted
    after = run(
        sandbox,
        f"""
        import os
        for path in ['/tmp/secret.txt', '/scratch/tmp/secret.txt', '/scratch/root-link{folder}/secret.txt']:
            try:
                open(path, 'r+').write('x')
                print('wrote', path)
            except OSError as exc:
                print(type(exc).__name__)
        print(os.listdir('/tmp'))
        """,
    )
    assert after.output == f"FileNotFoundError\nFileNotFoundError\nFileNotFoundError\n{OWN_TMP}\n", after.error
    untouched()


def test_a_dangling_link_where_tmp_was_does_not_stop_the_next_session(make):
    sandbox = make()
    crashed = run(sandbox, "import os; os.symlink('/nowhere/at/all', '/scratch/tmp'); os._exit(3)")
    assert crashed.status == "crashed"
    again = run(sandbox, "import os; os.symlink('/nowhere', '/scratch/scratch'); os._exit(4)")
    assert again.status == "crashed" and again.restarted
    assert run(sandbox, "'alive'").output == "'alive'\n"


def test_a_scratch_folder_that_is_a_link_is_refused_and_its_target_untouched(tmp_path, host_canary):
    folder, untouched = host_canary
    for target in (folder, tmp_path / "nowhere"):
        link = tmp_path / f"scratch-link-{target.name}"
        link.symlink_to(target)
        with pytest.raises(SandboxError, match="symbolic link"):
            Sandbox(link, Recorder(), ALLOWED).start()
    untouched()


def test_a_scratch_folder_others_can_write_is_refused(tmp_path):
    scratch = tmp_path / "shared"
    scratch.mkdir()
    os.chmod(scratch, 0o777)
    with pytest.raises(SandboxError, match="writable by every user"):
        Sandbox(scratch, Recorder(), ALLOWED).start()


@pytest.mark.parametrize("where", ["tmp", "a", "a/b", "a/b/c/d"])
def test_links_planted_at_each_level_of_scratch_stay_inside_through_sessions_and_removal(tmp_path, host_canary, where):
    """Every host-side operation on scratch (bind at start, bind at restart, removal) with links at one level: to a
    host folder, to a host file, to / and dangling, planted by a cell and planted on the host beforehand."""
    from captain_ros.agent.sandbox import remove_scratch

    folder, untouched = host_canary
    scratch = tmp_path / "scratch"
    level = scratch / where
    level.mkdir(parents=True)
    for name, target in [("dir", folder), ("file", folder / "secret.txt"), ("root", Path("/")), ("none", "/none")]:
        (level / f"host-{name}").symlink_to(target)
    sandbox = Sandbox(scratch, Recorder(), ALLOWED)
    try:
        inside = f"/scratch/{where}"
        cell = f"""
            import os
            for name, target in [('dir', {str(folder)!r}), ('file', {str(folder / "secret.txt")!r}), ('root', '/')]:
                os.symlink(target, '{inside}/cell-' + name)
            seen = []
            for name in sorted(os.listdir('{inside}')):
                suffix = '/secret.txt' if 'dir' in name else '{folder}/secret.txt' if 'root' in name else ''
                path = '{inside}/' + name + suffix
                try:
                    open(path, 'r+').write('x')
                    seen.append(name)
                except OSError:
                    pass
            print(seen)
            os._exit(5)
            """
        first = run(sandbox, cell)
        assert first.status == "crashed" and first.output.startswith("[]\n"), first.output
        second = run(sandbox, "import os; print(sorted(os.listdir('/tmp')), os.path.exists('/tmp/etc'))")
        assert second.output == f"{OWN_TMP} False\n", second.error
    finally:
        sandbox.close()
    untouched()
    remove_scratch(scratch)
    assert not scratch.exists() and not scratch.is_symlink()
    untouched()


def test_removing_scratch_opens_up_locked_folders_and_any_depth_but_never_a_link(tmp_path, host_canary):
    from captain_ros.agent.sandbox import remove_scratch

    folder, untouched = host_canary
    scratch = tmp_path / "scratch"
    with Sandbox(scratch, Recorder(), ALLOWED) as sandbox:
        result = run(
            sandbox,
            f"""
            import os
            deep = '/scratch/deep'
            for i in range(80):
                deep += '/d'
            os.makedirs(deep)
            os.symlink({str(folder)!r}, deep + '/host')
            os.makedirs('/scratch/locked/inner')
            open('/scratch/locked/inner/f', 'w').write('x')
            os.symlink({str(folder)!r}, '/scratch/locked/inner/host')
            os.chmod('/scratch/locked/inner', 0)
            os.chmod('/scratch/locked', 0)
            print('ok')
            """,
        )
        assert result.output == "ok\n", result.error
    remove_scratch(scratch)
    assert not scratch.exists()
    untouched()
    link = tmp_path / "scratch-link"
    link.symlink_to(folder)
    with pytest.raises(OSError, match="cannot be removed"):
        remove_scratch(link)
    untouched()
    remove_scratch(tmp_path / "never-made")  # nothing there: nothing to do


def test_the_episode_scratch_is_removed_when_the_episode_ends(tmp_path, host_canary):
    """The episode loop's scratch goes through remove_scratch: links a cell left there do not lead the removal out."""
    from captain_ros.agent.episode import _Episode

    folder, untouched = host_canary

    class Runner:
        config = type("C", (), {"agent": None, "budgets": None})()
        link = None
        clock = staticmethod(time.monotonic)

        @staticmethod
        def sandbox_factory(scratch, on_call, allowed):
            box = Sandbox(scratch, on_call, allowed)
            box.start()
            return box

    episode = _Episode(Runner(), "scratch-test")
    episode._open_sandbox()
    scratch = episode._scratch
    assert run(episode.sandbox, f"import os; os.symlink({str(folder)!r}, '/scratch/tmp'); 'ok'").status == "ok"
    episode.close()
    assert not scratch.exists()
    untouched()


# --- a session that breaks itself, and what it sends -------------------------------------------------------------


def test_a_session_whose_builtins_a_cell_broke_is_restarted_with_a_notice(make):
    sandbox = make()
    assert run(sandbox, "kept = 1").status == "ok"
    broken = run(sandbox, "import builtins; builtins.print = None")
    assert broken.restarted and "print" in broken.error and "restarted" in broken.error
    after = run(sandbox, "print('works'); 'kept' in globals()")
    assert (after.status, after.output, after.restarted) == ("ok", "works\nFalse\n", False)
    deleted = run(sandbox, "import builtins; del builtins.len")
    assert deleted.restarted and "len" in deleted.error
    assert run(sandbox, "len([1, 2])").output == "2\n"


def test_arguments_nested_too_deep_are_refused_and_the_session_goes_on(make):
    sandbox = make()
    result = run(
        sandbox,
        """
        deep = x = {}
        for _ in range(900):
            x['a'] = {}
            x = x['a']
        robot.observe(cameras=deep)
        """,
    )
    assert result.status == "error" and "nested more than" in result.error
    assert sandbox.on_call.calls == []
    assert run(sandbox, "robot.observe(cameras=[['head']])").status == "ok"
    assert len(sandbox.on_call.calls) == 1


def test_the_agent_refuses_deep_arguments_whatever_the_session_checks(make):
    """The child's check is a courtesy: a cell that writes to the channel itself meets the agent's own check."""
    sandbox = make()
    result = run(
        sandbox,
        """
        import json, struct, os
        deep = []
        for _ in range(40):
            deep = [deep]
        body = json.dumps({'op': 'call', 'name': 'observe', 'args': [deep], 'kwargs': {}}).encode()
        os.write(4, struct.pack('>I', len(body)) + body)
        size = struct.unpack('>I', os.read(3, 4))[0]
        print(json.loads(os.read(3, size))['error'])
        """,
    )
    assert "nested more than" in result.output, (result.output, result.error)
    assert sandbox.on_call.calls == []


def test_a_file_cut_at_the_size_limit_without_an_error_is_reported(make):
    sandbox = make(max_file_bytes=1024**2)
    result = run(
        sandbox,
        """
        open('/tmp/cut.bin', 'w').write('x' * (1024**2 + 1))  # closed by the garbage collector: no error raised
        open('/scratch/whole.bin', 'w').write('x' * 1000)
        import os
        print(os.path.getsize('/tmp/cut.bin'))
        """,
    )
    assert result.status == "ok"
    assert result.output.startswith(f"{1024**2}\n")
    assert "/tmp/cut.bin reached the file size limit (1 MiB)" in result.output
    assert "whole.bin" not in result.output
    assert "reached" not in run(sandbox, "1").output  # said once


def test_recursion_that_runs_out_of_memory_says_so(make):
    sandbox = make(memory_bytes=512 * 1024**2)
    result = run(sandbox, "import sys; sys.setrecursionlimit(10**8)\ndef f(n): return f(n + 1)\nf(0)")
    assert result.status in ("error", "crashed")
    if result.status == "error":
        assert result.error.rstrip().endswith(")") and ("recursion" in result.error or "memory" in result.error)
        assert "SystemError" not in result.error or "ran out of the sandbox's memory" in result.error
    assert run(sandbox, "'alive'").output == "'alive'\n"


def test_mountinfo_shows_no_writable_host_path_but_scratch(shared):
    sandbox, _ = shared
    result = run(sandbox, "print(open('/proc/self/mountinfo').read())")
    writable = {}
    for line in result.output.splitlines():
        fields = line.split()
        if len(fields) > 5 and "rw" in fields[5].split(","):
            writable[fields[4]] = (fields[3], fields[fields.index("-") + 1])  # root in its filesystem, its type
    devices = {f"/dev/{name}" for name in ("null", "zero", "full", "random", "urandom", "tty")}
    assert set(writable) == {"/tmp", "/scratch", "/dev/pts", *devices}, writable
    assert writable["/tmp"] == ("/", "tmpfs")  # the root of a tmpfs of its own, not a host folder
    assert writable["/dev/pts"] == ("/", "devpts")  # a new instance: no host terminal
    assert all(writable[device] == (device.removeprefix("/dev"), "devtmpfs") for device in devices)
    assert writable["/scratch"][0] == str(sandbox.scratch_dir)


# --- where the interpreter lives, and who runs the agent ---------------------------------------------------------


def test_a_venv_under_the_hosts_tmp_works_inside(tmp_path_factory):
    """The sandbox's /tmp is its own tmpfs; an interpreter or venv that lives under the host's /tmp (a clone there)
    is bound on top of it."""
    import venv

    home = Path("/tmp") / f"captain-venv-{uuid.uuid4().hex[:8]}"
    try:
        venv.EnvBuilder(symlinks=True, with_pip=False).create(home / "venv")
        python = str(home / "venv" / "bin" / "python")
        with Sandbox(tmp_path_factory.mktemp("scratch"), Recorder(), ALLOWED, python=python) as sandbox:
            result = run(
                sandbox, "import sys, os; print(sys.prefix); open('/tmp/mine', 'w').write('x'); robot.observe()"
            )
        assert result.status == "ok", result.error
        assert result.output.splitlines()[0] == str(home / "venv")
        assert not (home / "mine").exists() and not Path("/tmp/mine").exists()
    finally:
        import shutil

        shutil.rmtree(home, ignore_errors=True)


UNPRIVILEGED_AGENT = """
import json, os, sys, textwrap
sys.path.insert(0, sys.argv[1])
from captain_ros.agent.sandbox import Sandbox, remove_scratch

scratch, secret = sys.argv[2], sys.argv[3]
box = Sandbox(scratch, lambda name, args, kwargs: {"ok": True}, ["observe"])
box.start()
results = {"agent_uid": os.getuid(), "child_pid": box.child_pid}
print(json.dumps(results), flush=True)
sys.stdin.readline()  # the test reads the child's host uid meanwhile
cells = [
    "import os; print(os.getuid())",
    "import os; os.symlink('/', '/scratch/tmp'); os.symlink(%r, '/scratch/secret'); os._exit(3)" % secret,
    "import os; print(os.listdir('/tmp'), os.path.exists('/scratch/secret'))",
]
for index, code in enumerate(cells):
    result = box.run_cell(code)
    results[f"cell{index}"] = [result.status, result.output, result.restarted]
box.close()
remove_scratch(scratch)
results["scratch_left"] = os.path.exists(scratch)
print(json.dumps(results), flush=True)
"""


def test_a_session_runs_as_an_unprivileged_user(tmp_path, host_canary):
    """The deployment default (docs/deployment.md): the agent as a normal user, whose uid the child has on the host."""
    import shutil
    import tempfile

    python = "/usr/bin/python3"
    if os.geteuid() != 0 or not os.path.exists(python):
        pytest.skip("needs root to become another user, and the system's /usr/bin/python3")
    nobody = {"user": 65534, "group": 65534, "extra_groups": [], "env": {"PATH": "/usr/bin:/bin"}}
    probe = subprocess.run(
        ["bwrap", "--unshare-all", "--ro-bind", "/", "/", "true"], capture_output=True, text=True, **nobody
    )
    if probe.returncode != 0:
        pytest.skip(f"unprivileged user namespaces are off on this machine: {probe.stderr.strip()}")
    folder, untouched = host_canary
    home = Path(tempfile.mkdtemp(prefix="captain-unprivileged-"))
    try:
        os.chmod(home, 0o755)
        package = REPO / "src" / "captain_ros" / "captain_ros"
        for relative in ("__init__.py", "agent/__init__.py", "agent/sandbox.py", "agent/sandbox_child.py"):
            (home / "captain_ros" / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(package / relative, home / "captain_ros" / relative)
        for path in [home, *home.rglob("*")]:
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        (home / "work").mkdir()
        os.chown(home / "work", 65534, 65534)
        scratch = home / "work" / "scratch"  # made by the agent, as an episode's is
        agent = subprocess.Popen(
            [python, "-I", "-c", UNPRIVILEGED_AGENT, str(home), str(scratch), str(folder / "secret.txt")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=home,
            **nobody,
        )
        try:
            first = json.loads(agent.stdout.readline() or "{}")
            assert first.get("agent_uid") == 65534, agent.stderr.read()
            status = Path(f"/proc/{first['child_pid']}/status").read_text()
            host_uid = next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:"))
            out, err = agent.communicate("go\n", timeout=120)
        finally:
            agent.kill()
        assert host_uid == "65534"  # the cells run as the agent's unprivileged user on the host, never as root
        assert out.strip(), err
        results = json.loads(out.strip().splitlines()[-1])
        assert results["cell0"] == ["ok", "65534\n", False]
        assert results["cell1"][0] == "crashed" and results["cell1"][2]
        assert results["cell2"] == ["ok", "[] False\n", False], err
        assert results["scratch_left"] is False
        untouched()
    finally:
        shutil.rmtree(home, ignore_errors=True)

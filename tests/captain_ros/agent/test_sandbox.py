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

from captain_ros.agent.sandbox import CellResult, Sandbox, SandboxError, SandboxLimits, build_seccomp_filter

REPO = Path(__file__).resolve().parents[3]
ALLOWED = ["move_to", "observe", "finish"]


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
            with open("/tmp/{name}", "w") as f:  # the sandbox's own /tmp: the scratch folder's tmp/
                f.write("sandbox")
            with open("/scratch/note.txt", "w") as f:
                f.write("mine")
            print(len(failed))
            """,
        )
        assert result.status == "ok", result.error
        assert result.output == f"{len(targets)}\n"
        assert host_tmp_file.read_text() == "host"
        assert not repo_target.exists() and not Path(sys.prefix, name).exists()
        assert (sandbox.scratch_dir / "tmp" / name).read_text() == "sandbox"
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
        "import builtins; del builtins.print",
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

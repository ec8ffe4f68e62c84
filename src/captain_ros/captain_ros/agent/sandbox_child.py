"""The program that runs inside the sandbox (see sandbox.py): one persistent Python session for an episode's cells.

bubblewrap starts it as `python -I -B -u /sandbox/child.py CONFIG_JSON`; the agent never imports it. It talks to
the agent over two inherited pipes (length-prefixed JSON, moved to fds 3 and 4 at start-up): the agent sends
`run` (a cell), `reply` (the answer to a robot call) and `ping`; the child sends `ready`, `call`, `done` and `pong`.
What the cells print goes to fds 1 and 2, a third pipe that the agent reads and bounds. Only the standard library
is imported here, so the cells' own imports are the only third-party code loaded.

Everything in this process is untrusted once a cell has run: a cell can rewrite any of it. The agent side relies on
none of it for safety; the code here only makes the normal case pleasant (tracebacks without these frames, a REPL
echo, numpy arguments converted, a clean stdout for every cell).
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import faulthandler
import fcntl
import json
import linecache
import os
import resource
import signal
import struct
import sys
import threading
import traceback
import types
from collections.abc import Iterator
from typing import Any

HEADER = struct.Struct(">I")
READ_FD = 3
WRITE_FD = 4
STDOUT_COPY_FD = 5
THIS_FILE = __file__
MAIN_THREAD = threading.get_ident()
EXIT_CHANNEL_BROKEN = 70


class _State:
    """What the SIGINT handler and the robot client need to know about the running cell."""

    user_code = False  # True while a cell's own code runs in the main thread
    cell_running = False  # True from a cell's start until its `done` is about to be sent
    in_protocol = 0  # >0 while the main thread reads or writes the channel
    pending_interrupt = False


# Captured now: a cell that replaces json.dumps or os.write changes its own session, not how this file talks.
_dumps, _loads, _os_read, _os_write = json.dumps, json.loads, os.read, os.write
_scandir, _sorted, _str = os.scandir, sorted, str
# The built-in names as the session started: a cell that replaces or deletes one (builtins.print = None) breaks every
# later cell, so the agent is told and restarts the session. This file's own functions, all defined below, look their
# built-ins up in this private copy (a function takes its globals' __builtins__ when it is made), so they keep
# working until then.
BUILTINS_AT_START = dict(builtins.__dict__)
__builtins__ = dict(BUILTINS_AT_START)
_MISSING = object()

STATE = _State()
CALL_LOCK = threading.Lock()
CONFIG: dict[str, Any] = {}
CHANNEL: dict[int, tuple[int, int]] = {}  # fd -> (device, inode) at start-up


def _exit_channel_broken() -> None:
    os._exit(EXIT_CHANNEL_BROKEN)


def _write_all(data: bytes) -> None:
    view = memoryview(data)
    try:
        while view:
            written = _os_write(WRITE_FD, view)
            view = view[written:]
    except OSError:
        _exit_channel_broken()


def _read_exact(size: int) -> bytes:
    buffer = bytearray()
    try:
        while len(buffer) < size:
            chunk = _os_read(READ_FD, size - len(buffer))
            if not chunk:
                os._exit(0)  # the agent closed the channel: the session is over
            buffer += chunk
    except OSError:
        _exit_channel_broken()
    return bytes(buffer)


def send(message: dict[str, Any]) -> None:
    body = _dumps(message, allow_nan=True).encode()
    _write_all(HEADER.pack(len(body)) + body)


def receive() -> dict[str, Any]:
    (size,) = HEADER.unpack(_read_exact(HEADER.size))
    message = _loads(_read_exact(size))
    if not isinstance(message, dict):
        _exit_channel_broken()
    return message


@contextlib.contextmanager
def _protocol() -> Iterator[None]:
    """Holds back a SIGINT (KeyboardInterrupt) while the main thread is in the middle of a message."""
    main = threading.get_ident() == MAIN_THREAD
    if main:
        STATE.in_protocol += 1
    try:
        yield
    finally:
        if main:
            STATE.in_protocol -= 1
            if STATE.in_protocol == 0 and STATE.pending_interrupt:
                STATE.pending_interrupt = False
                if STATE.user_code:
                    raise KeyboardInterrupt


def _on_sigint(signum: int, frame: Any) -> None:
    # The agent sends SIGINT to stop a cell that floods its output; between cells it is ignored.
    if not STATE.user_code:
        return
    if STATE.in_protocol:
        STATE.pending_interrupt = True
        return
    raise KeyboardInterrupt


# --- the robot client -------------------------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    """json.dumps fallback: numpy arrays and scalars become lists and Python numbers; anything else is refused."""
    tolist = getattr(value, "tolist", None)
    if callable(tolist) and type(value).__module__.split(".")[0] == "numpy":
        return tolist()
    raise TypeError(
        f"an argument of type {type(value).__name__} cannot be sent to the robot: "
        "pass numbers, strings, booleans, None, lists and dicts (numpy arrays and numbers are converted)"
    )


def _too_deep(value: Any, limit: int) -> bool:
    """Lists and dicts nested more than `limit` levels (the agent refuses them too; this only says so sooner)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list | tuple):
            if depth >= limit:
                return True
            stack += [(child, depth + 1) for child in item]
    return False


def _call(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if _too_deep([list(args), kwargs], CONFIG["max_argument_depth"]):
        raise ValueError(f"robot.{name}(): the arguments are nested more than {CONFIG['max_argument_depth']} levels")
    try:
        body = _dumps({"op": "call", "name": name, "args": list(args), "kwargs": kwargs}, default=_jsonable)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"robot.{name}(): {exc}") from None
    except RecursionError:
        raise ValueError(f"robot.{name}(): the arguments are nested too deeply to send") from None
    data = body.encode()
    if len(data) > CONFIG["max_message_bytes"]:
        raise ValueError(f"robot.{name}(): the arguments are {len(data)} bytes, over {CONFIG['max_message_bytes']}")
    with CALL_LOCK:
        if not STATE.cell_running:
            raise RuntimeError(f"robot.{name}() can only be called while a cell runs")
        with _protocol():
            _write_all(HEADER.pack(len(data)) + data)
            reply = receive()
    if reply.get("op") != "reply":
        _exit_channel_broken()
    if "error" in reply:
        raise RuntimeError(f"robot.{name}() failed: {reply['error']}")
    return reply.get("result")


class Robot:
    """The robot, as the agent offers it: `robot.<name>(...)` runs <name> in the agent and returns its reply."""

    def __init__(self, allowed: list[str]) -> None:
        self.__dict__["_allowed"] = tuple(allowed)

    def __getattr__(self, name: str) -> Any:
        if name in self._allowed:

            def call(*args: Any, **kwargs: Any) -> Any:
                return _call(name, args, kwargs)

            call.__name__ = call.__qualname__ = name
            return call
        raise AttributeError(f"robot has no function {name!r}; the allowed ones are: {', '.join(self._allowed)}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("robot's functions cannot be replaced")

    def __dir__(self) -> list[str]:
        return list(self._allowed)

    def __repr__(self) -> str:
        return f"<robot: {', '.join(self._allowed)}>"


# --- running a cell ---------------------------------------------------------------------------------------------


def _strip_internal_frames(exc_info: traceback.TracebackException, seen: set[int]) -> None:
    if id(exc_info) in seen:
        return
    seen.add(id(exc_info))
    frames = [frame for frame in exc_info.stack if frame.filename != THIS_FILE]
    exc_info.stack = traceback.StackSummary.from_list(frames[-CONFIG["max_traceback_frames"] :])
    for linked in (exc_info.__cause__, exc_info.__context__, *(getattr(exc_info, "exceptions", None) or ())):
        if linked is not None:
            _strip_internal_frames(linked, seen)


def _tail(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"[... {len(text) - limit} characters cut ...]\n" + text[-limit:]


def format_exception(exc: BaseException) -> str:
    try:
        exc_info = traceback.TracebackException.from_exception(exc)
        _strip_internal_frames(exc_info, set())
        text = "".join(exc_info.format())
    except Exception:
        text = f"{type(exc).__name__} (its traceback could not be formatted)\n"
    if isinstance(exc, SystemExit):
        text += "(sys.exit() does not end the session: its variables are kept)\n"
    elif isinstance(exc, SystemError) and "without exception set" in _str(exc):
        text += (
            "(the interpreter failed without saying why; in a cell this is most often recursion so deep that Python "
            "ran out of the sandbox's memory for its frames: recurse less, or keep sys.setrecursionlimit low)\n"
        )
    return _tail(text, CONFIG["max_error_chars"])


def _echo(value: Any) -> None:
    if value is None:
        return
    text = repr(value)
    limit = CONFIG["max_repr_chars"]
    if len(text) > limit:
        text = text[:limit] + f"... [{len(text) - limit} more characters]"
    sys.stdout.write(text + "\n")


def _reset_stdio() -> None:
    """Every cell starts with fds 1 and 2 on the agent's pipe and sys.stdout/stderr on them, whatever ran before."""
    for fd in (1, 2):
        try:
            os.dup2(STDOUT_COPY_FD, fd)
        except OSError:
            pass
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, f"__{name}__", None)
        if stream is None or stream.closed:
            stream = open(fd, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
            setattr(sys, f"__{name}__", stream)
        setattr(sys, name, stream)


def run_cell(code: str, index: int, namespace: dict[str, Any]) -> tuple[str, str]:
    """Runs one cell in the session's namespace; returns (status, error) with status "ok" or "error"."""
    filename = f"<cell {index}>"
    try:
        tree = ast.parse(code, filename, "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        body = compile(tree, filename, "exec")
        tail = compile(last, filename, "eval") if last is not None else None
    except (SyntaxError, ValueError, OverflowError, RecursionError) as exc:
        return "error", _tail("".join(traceback.format_exception_only(type(exc), exc)), CONFIG["max_error_chars"])
    linecache.cache[filename] = (len(code), None, code.splitlines(keepends=True), filename)
    try:
        STATE.user_code = True
        try:
            exec(body, namespace)
            if tail is not None:
                _echo(eval(tail, namespace))
        finally:
            STATE.user_code = False
    except BaseException as exc:
        STATE.user_code = False
        return "error", format_exception(exc)
    return "ok", ""


def _flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:
            pass


def damaged_builtins() -> list[str]:
    """The built-in names a cell replaced or deleted (at most 10)."""
    current = builtins.__dict__
    return _sorted(name for name, value in BUILTINS_AT_START.items() if current.get(name, _MISSING) is not value)[:10]


def files_cut_at_limit(seen: set) -> list[str]:
    """Files in /scratch and /tmp that reached the file size limit since the last check: a write past the limit fails,
    but a buffered file closed by the garbage collector loses its tail without a word (release builds of Python ignore
    errors of an implicit close)."""
    limit, found, budget = CONFIG["max_file_bytes"], [], 4000
    folders = ["/scratch", "/tmp"]
    while folders and budget > 0:
        try:
            entries = _scandir(folders.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                budget -= 1
                if budget <= 0:
                    break
                try:
                    if entry.is_dir(follow_symlinks=False):
                        folders.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        info = entry.stat(follow_symlinks=False)
                        key = (entry.path, info.st_ino, info.st_mtime_ns)
                        if info.st_size >= limit and key not in seen:
                            seen.add(key)
                            found.append(entry.path)
                except OSError:
                    continue
    return found


def _note(text: str) -> None:
    try:
        _os_write(STDOUT_COPY_FD, text.encode(errors="replace"))
    except OSError:
        _exit_channel_broken()


def serve(namespace: dict[str, Any]) -> None:
    index = 0
    cut_files: set = set()
    while True:
        message = receive()
        op = message.get("op")
        if op == "ping":
            send({"op": "pong"})
        elif op == "run":
            index += 1
            _reset_stdio()
            signal.signal(signal.SIGINT, _on_sigint)
            STATE.pending_interrupt = False
            STATE.cell_running = True
            status, error = run_cell(str(message.get("code", "")), index, namespace)
            _flush_stdio()
            _check_channel()
            for path in files_cut_at_limit(cut_files):
                mib = CONFIG["max_file_bytes"] / 1024**2
                _note(f"[sandbox] {path} reached the file size limit ({mib:g} MiB): what was written past it is lost\n")
            with CALL_LOCK:  # no robot call is in flight once `done` is sent, and none starts after it
                STATE.cell_running = False
                send({"op": "done", "status": status, "error": error, "damaged": damaged_builtins()})
        # anything else (a stale reply) is ignored


# --- start-up -----------------------------------------------------------------------------------------------------


def _take_fds(read_fd: int, write_fd: int) -> None:
    """Moves the channel to fds 3 and 4 and a copy of stdout to 5; closes every other inherited fd."""
    read_copy, write_copy = (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (read_fd, write_fd))
    os.dup2(read_copy, READ_FD, inheritable=False)
    os.dup2(write_copy, WRITE_FD, inheritable=False)
    os.dup2(1, STDOUT_COPY_FD, inheritable=False)
    os.closerange(STDOUT_COPY_FD + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    CHANNEL.update({fd: _fd_identity(fd) for fd in (READ_FD, WRITE_FD, STDOUT_COPY_FD)})


def _fd_identity(fd: int) -> tuple[int, int]:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino


def _check_channel() -> None:
    """Ends the session when a cell closed or replaced the channel or the stdout copy: the agent then restarts it."""
    try:
        if any(_fd_identity(fd) != identity for fd, identity in CHANNEL.items()):
            _exit_channel_broken()
    except OSError:
        _exit_channel_broken()


def _set_limits(limits: dict[str, int]) -> None:
    for name, wanted in limits.items():
        which = getattr(resource, name)
        _, hard = resource.getrlimit(which)
        value = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(which, (value, value))  # soft = hard: a cell cannot raise it again


def main() -> None:
    CONFIG.update(json.loads(sys.argv[1]))
    _take_fds(CONFIG["read_fd"], CONFIG["write_fd"])
    _set_limits(CONFIG["rlimits"])
    if CONFIG["nice"]:
        os.nice(CONFIG["nice"])
    faulthandler.enable()  # a segfault in a cell prints the cell's line before the process dies
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    robot = Robot(CONFIG["allowed"])
    session = types.ModuleType("__main__", "The sandbox session: the cells' variables live here.")
    session.__dict__["__builtins__"] = builtins
    session.__dict__["robot"] = robot
    if "finish" in CONFIG["allowed"]:
        session.__dict__["finish"] = robot.finish
    sys.modules["__main__"] = session
    send({"op": "ready"})
    serve(session.__dict__)


if __name__ == "__main__":
    main()

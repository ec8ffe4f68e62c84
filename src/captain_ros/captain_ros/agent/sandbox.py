"""The agent's sandbox: the language model's code cells run in one persistent Python process per episode,
isolated by the operating system (not by Python tricks), and reach the robot only through the agent.

What isolates what
- bubblewrap gives the child its own user, mount, pid, network, IPC, UTS and cgroup namespaces, a new session
  (no terminal), no capabilities, no new privileges, uid/gid 65534 inside its user namespace, and kills it when
  the agent dies. Its environment is built from scratch: nothing of the agent's environment reaches it, and the
  child is pid 1 of its namespace, so /proc shows no other process.
- Files: it sees /usr, the Python interpreter and the virtual environment read-only (wherever they live, /tmp
  included); the episode's scratch folder read-write at /scratch (its cwd and HOME), bound by a file descriptor the
  agent opened with O_NOFOLLOW; its own /tmp, a size-capped tmpfs in memory that no host path backs (it is lost at a
  restart, /scratch is not); a read-only /proc of its own pid namespace with the kernel's internals (kcore,
  kallsyms, kpage*, keys, ...) masked; a minimal read-only /dev. The rest of the host (/home, /root, /etc, the
  repository, the host's /tmp and its sockets) does not exist in there.
- Nothing a cell can write is ever resolved by the host as a path: no mount source lies inside scratch, the agent
  opens nothing there, and the scratch folder is removed (`remove_scratch`, after the session is gone) by directory
  fds that never follow a link. A link a cell plants anywhere in scratch (at /scratch/tmp, or deeper) therefore
  points only inside the sandbox's own view, restart after restart.
- Network: its network namespace has only a loopback of its own; the seccomp filter also refuses every socket
  family except AF_UNIX, and a Unix socket finds no host socket (no path, and abstract names are per namespace).
- seccomp (a classic-BPF program built here, loaded by bwrap): no new processes (fork, vfork, clone without
  CLONE_THREAD; clone3 answers ENOSYS so glibc falls back to clone for threads, which keep working), no namespaces,
  ptrace, mounts, keyrings, bpf, perf, io_uring, kernel modules, clocks, SysV shared memory and message queues,
  memfd, no set-user/group-ID file modes; another syscall ABI kills the process.
- rlimits, set by the child before any cell runs and not raisable afterwards: CPU seconds per session, address
  space, open files, file size, no core dumps, threads (RLIMIT_NPROC).
- The agent side: a wall-clock timeout per cell (the session is then killed and restarted), a cap on each cell's
  output (the cell is interrupted, or killed if it does not stop), caps on every message, and the allow-list of
  robot functions checked again before `on_call` runs. The child's only channel is a pair of pipes carrying
  length-prefixed JSON; anything it sends is treated as untrusted input.

What is NOT protected
- CPU contention: a cell may keep its CPUs busy for its wall-time limit (it runs at a lower priority, `nice`).
- Disk space: each file in scratch is capped, the number of files is not. A write past the cap fails, but Python
  silently drops the tail of a buffered file that the garbage collector closes: the session then says which file
  reached the cap after the cell.
- Information about the host: the paths of the interpreter and the virtual environment (a venv only works at its own
  path; `sys.executable` shows them as /proc/self/mountinfo does, which also shows the scratch folder's host path),
  the kernel version and the CPU. All of it is read-only.
- When the agent runs as root, the child's host uid is 0 too (the user namespace maps 65534 to the caller): the
  kernel then does not enforce RLIMIT_NPROC, so a thread bomb is stopped by the agent's watchdog, which counts the
  child's threads every 50 ms; the files it writes in scratch are root's; file permission checks treat it as the
  owner of root's files, which is why /proc is read-only and nothing else writable is mounted. Run the agent as an
  unprivileged user (the deployment default, docs/deployment.md): the child is then that user, with no privilege on
  the host even if every layer above failed; tests/captain_ros/agent/test_sandbox.py runs a session that way.
- The kernel itself: namespaces and seccomp shrink its attack surface, they do not remove it.
- What the robot callback does with the (validated) requests: `on_call` is the policy's real power. Its arguments
  are JSON nested at most MAX_ARGUMENT_DEPTH levels, at most `max_message_bytes`.
- A cell that breaks its own session (replacing built-ins, closing its channel) is restarted with a notice; one
  that merely misleads itself (rebinding a module's function) keeps the consequences until it restarts.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import os
import platform
import queue
import select
import selectors
import shutil
import signal
import stat
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

SCRATCH_IN_SANDBOX = "/scratch"
TMP_IN_SANDBOX = "/tmp"
CHILD_IN_SANDBOX = "/sandbox/child.py"
SANDBOX_UID = 65534
SANDBOX_GID = 65534
_HEADER = struct.Struct(">I")
_CHILD_SOURCE = Path(__file__).with_name("sandbox_child.py")
_EXIT_CHANNEL_BROKEN = 70  # sandbox_child.EXIT_CHANNEL_BROKEN


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandbox session (units in the names)."""

    cell_timeout_s: float = 120.0  # wall time of one cell, robot calls included; then the session is restarted
    cpu_time_s: int = 1200  # CPU seconds of a session, all threads (RLIMIT_CPU); a restart starts a new budget
    memory_bytes: int = 2 * 1024**3  # address space (RLIMIT_AS): a bigger allocation raises MemoryError
    max_open_files: int = 256  # RLIMIT_NOFILE
    max_file_bytes: int = 64 * 1024**2  # largest file a cell can write (RLIMIT_FSIZE)
    tmp_bytes: int = 256 * 1024**2  # the session's own /tmp, a tmpfs in memory (gone at a restart)
    max_output_bytes: int = 64 * 1024  # stdout+stderr kept per cell; more stops the cell
    max_threads: int = 256  # threads of the session (RLIMIT_NPROC, and the agent's watchdog when it runs as root)
    blas_threads: int = 4  # OPENBLAS/OMP/MKL_NUM_THREADS inside
    nice: int = 10  # priority decrease of the session, so a busy cell does not starve the robot's controllers
    start_timeout_s: float = 60.0  # from bwrap's start until the session is ready
    interrupt_grace_s: float = 3.0  # after an output flood: time the cell gets to stop before it is killed
    max_message_bytes: int = 16 * 1024**2  # one robot call's JSON
    max_repr_chars: int = 4000  # the echoed value of a cell's last expression
    max_error_chars: int = 8000  # a cell's traceback
    max_traceback_frames: int = 12
    watchdog_period_s: float = 0.05

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if name != "nice" and not value > 0:
                raise ValueError(f"SandboxLimits.{name} must be positive, got {value!r}")


@dataclass
class CellResult:
    """What one cell did."""

    status: str  # "ok" | "error" | "timeout" | "crashed" | "output_limit"
    output: str  # stdout+stderr interleaved as the cell produced them, at most max_output_bytes
    error: str  # the traceback (status "error"), the reason the cell was stopped, or a note about a restart
    restarted: bool  # the session was restarted while handling this cell: earlier variables and imports are lost
    duration_s: float


class SandboxError(RuntimeError):
    """The sandbox cannot (re)start a session (bwrap missing, user namespaces disabled, a scratch folder that is not a
    plain folder of the agent's, ...). Whatever stopped a start, it arrives as this and nothing else."""


# --- seccomp ------------------------------------------------------------------------------------------------------

# Syscall numbers from the kernel's uapi headers: x86_64's own table and the generic one of aarch64.
_SYSCALLS: dict[str, dict[str, int]] = {
    "x86_64": {
        "fork": 57, "vfork": 58, "clone": 56, "clone3": 435, "socket": 41, "socketpair": 53,
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "mount": 165, "umount2": 166,
        "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308, "keyctl": 250, "add_key": 248,
        "request_key": 249, "bpf": 321, "perf_event_open": 298, "kexec_load": 246, "kexec_file_load": 320,
        "init_module": 175, "finit_module": 313, "delete_module": 176, "reboot": 169, "swapon": 167,
        "swapoff": 168, "acct": 163, "userfaultfd": 323, "open_by_handle_at": 304, "name_to_handle_at": 303,
        "iopl": 172, "ioperm": 173, "modify_ldt": 154, "syslog": 103, "quotactl": 179, "quotactl_fd": 443,
        "lookup_dcookie": 212, "personality": 135, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
        "move_mount": 429, "open_tree": 428, "fspick": 433, "mount_setattr": 442, "pidfd_getfd": 438,
        "pidfd_open": 434, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "kcmp": 312,
        "settimeofday": 164, "clock_settime": 227, "clock_adjtime": 305, "adjtimex": 159, "sethostname": 170,
        "setdomainname": 171, "migrate_pages": 256, "move_pages": 279, "uselib": 134, "_sysctl": 156,
        "nfsservctl": 180, "shmget": 29, "shmat": 30, "msgget": 68, "memfd_create": 319, "memfd_secret": 447,
    },
    "aarch64": {
        "clone": 220, "clone3": 435, "socket": 198, "socketpair": 199, "ptrace": 117, "process_vm_readv": 270,
        "process_vm_writev": 271, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "unshare": 97,
        "setns": 268, "keyctl": 219, "add_key": 217, "request_key": 218, "bpf": 280, "perf_event_open": 241,
        "kexec_load": 104, "kexec_file_load": 294, "init_module": 105, "finit_module": 273, "delete_module": 106,
        "reboot": 142, "swapon": 224, "swapoff": 225, "acct": 89, "userfaultfd": 282, "open_by_handle_at": 265,
        "name_to_handle_at": 264, "syslog": 116, "quotactl": 60, "quotactl_fd": 443, "lookup_dcookie": 18,
        "personality": 92, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "move_mount": 429, "open_tree": 428,
        "fspick": 433, "mount_setattr": 442, "pidfd_getfd": 438, "pidfd_open": 434, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "kcmp": 272, "settimeofday": 170, "clock_settime": 112,
        "clock_adjtime": 266, "adjtimex": 171, "sethostname": 161, "setdomainname": 162, "migrate_pages": 238,
        "move_pages": 239, "nfsservctl": 42, "shmget": 194, "shmat": 196, "msgget": 186, "memfd_create": 279,
        "memfd_secret": 447,
    },
}  # fmt: skip
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}  # EM_* | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE
# Syscalls that take a file mode, and which argument it is: a set-user-ID or set-group-ID bit is refused (when the
# agent runs as root, the child's files are root's on the host: a setuid-root program in scratch would be a way up).
_MODE_ARGUMENT = {
    "x86_64": {"open": (2, 2), "creat": (85, 1), "mknod": (133, 1), "chmod": (90, 1), "fchmod": (91, 1),
               "openat": (257, 3), "mknodat": (259, 2), "fchmodat": (268, 2), "fchmodat2": (452, 2)},
    "aarch64": {"fchmod": (52, 1), "fchmodat": (53, 2), "openat": (56, 3), "mknodat": (33, 2), "fchmodat2": (452, 2)},
}  # fmt: skip
_OPENAT2 = 437  # its mode hides in a struct the filter cannot read: ENOSYS (glibc's open() does not use it)
_S_ISUID_ISGID = 0o6000
_SPECIAL = {"clone", "clone3", "socket", "socketpair"}
_CLONE_THREAD = 0x00010000
_CLONE_NAMESPACES = 0x7E020080  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME
_AF_UNIX = 1
_X32_SYSCALL_BIT = 0x40000000
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL_PROCESS = 0x80000000
_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, ..., BPF_RET|K
_OFFSET_NR, _OFFSET_ARCH = 0, 4  # struct seccomp_data


def _arg(index: int) -> int:
    """Offset of syscall argument `index`'s low 32 bits in struct seccomp_data (little-endian)."""
    return 16 + 8 * index


def build_seccomp_filter(machine: str | None = None) -> bytes:
    """The sandbox's seccomp program (an array of struct sock_filter) for `machine` (default: this one)."""
    machine = machine or platform.machine()
    if machine not in _SYSCALLS:
        raise SandboxError(f"the sandbox's seccomp filter knows x86_64 and aarch64, not {machine!r}")
    numbers = _SYSCALLS[machine]
    program: list[tuple[int, int | str, int | str, int]] = [
        (_LD_W_ABS, 0, 0, _OFFSET_ARCH),
        (_JEQ, 0, "kill", _AUDIT_ARCH[machine]),
        (_LD_W_ABS, 0, 0, _OFFSET_NR),
    ]
    if machine == "x86_64":
        program.append((_JGE, "kill", 0, _X32_SYSCALL_BIT))
    program += [
        (_JEQ, "clone", 0, numbers["clone"]),
        (_JEQ, "enosys", 0, numbers["clone3"]),
        (_JEQ, "enosys", 0, _OPENAT2),
        (_JEQ, "socket", 0, numbers["socket"]),
        (_JEQ, "socket", 0, numbers["socketpair"]),
    ]
    program += [(_JEQ, f"mode{index}", 0, number) for number, index in _MODE_ARGUMENT[machine].values()]
    program += [(_JEQ, "eperm", 0, number) for name, number in sorted(numbers.items()) if name not in _SPECIAL]
    program.append((_RET, 0, 0, _RET_ALLOW))
    blocks = [
        ("clone", [(_LD_W_ABS, 0, 0, _arg(0)), (_JSET, "eperm", 0, _CLONE_NAMESPACES)]),
        ("clone_thread", [(_JSET, "allow", "eperm", _CLONE_THREAD)]),
        ("socket", [(_LD_W_ABS, 0, 0, _arg(0)), (_JEQ, "allow", "eperm", _AF_UNIX)]),
        *(
            (f"mode{index}", [(_LD_W_ABS, 0, 0, _arg(index)), (_JSET, "eperm", "allow", _S_ISUID_ISGID)])
            for index in sorted({index for _, index in _MODE_ARGUMENT[machine].values()})
        ),
        ("allow", [(_RET, 0, 0, _RET_ALLOW)]),
        ("eperm", [(_RET, 0, 0, _RET_ERRNO | errno.EPERM)]),
        ("enosys", [(_RET, 0, 0, _RET_ERRNO | errno.ENOSYS)]),
        ("kill", [(_RET, 0, 0, _RET_KILL_PROCESS)]),
    ]
    labels: dict[str, int] = {}
    for label, block in blocks:
        labels[label] = len(program)
        program += block

    def offset(target: int | str, index: int) -> int:
        if isinstance(target, int):
            return target
        jump = labels[target] - index - 1
        if not 0 <= jump <= 255:
            raise AssertionError(f"seccomp jump to {target} out of range: {jump}")
        return jump

    return b"".join(
        struct.pack("=HBBI", code, offset(jt, i), offset(jf, i), k) for i, (code, jt, jf, k) in enumerate(program)
    )


# --- the interpreter's files --------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _python_dirs(python: str) -> tuple[str, ...]:
    """The folders `python` needs, read-only: its prefix (the venv) and base prefix (the interpreter)."""
    if os.path.abspath(python) == os.path.abspath(sys.executable):  # not realpath: venvs share their interpreter
        paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    else:
        script = (
            "import json, sys; print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]))"
        )
        try:
            done = subprocess.run([python, "-I", "-c", script], capture_output=True, text=True, timeout=60)
            paths = json.loads(done.stdout.strip().splitlines()[-1])
        except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
            raise SandboxError(f"cannot run the sandbox's Python {python!r}: {exc}") from exc
    paths += [os.path.dirname(os.path.abspath(python)), os.path.dirname(os.path.realpath(python))]
    dirs: list[str] = []
    for path in sorted({os.path.abspath(p) for p in paths}, key=len):
        if path == "/usr" or path.startswith("/usr/") or any(path.startswith(d.rstrip("/") + "/") for d in dirs):
            continue
        if path in ("/", "/etc", "/home", "/root", "/tmp", "/proc", "/dev"):
            raise SandboxError(f"the sandbox's Python lives in {path!r}, which cannot be exposed read-only as a whole")
        dirs.append(path)
    return tuple(dirs)


# Kernel internals that a child with host uid 0 could read by file mode alone (addresses, page frames, keys, logs).
_PROC_MASKED = (
    "kcore", "kmsg", "keys", "key-users", "kallsyms", "kpagecount", "kpageflags", "kpagecgroup", "slabinfo", "iomem",
    "ioports", "timer_list", "sched_debug", "latency_stats", "timer_stats", "vmallocinfo", "sysrq-trigger",
)  # fmt: skip


def _proc_masks() -> list[str]:
    """/dev/null over _PROC_MASKED (on a nodev mount: opening one is refused)."""
    present = [f"/proc/{name}" for name in _PROC_MASKED if os.path.exists(f"/proc/{name}")]
    return [arg for path in present for arg in ("--ro-bind", "/dev/null", path)]


def _top_level_links() -> list[str]:
    """/bin, /lib, /lib64 ...: symlinks into /usr on merged-/usr systems, real folders elsewhere."""
    args: list[str] = []
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = f"/{name}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


# --- the scratch folder on the host -------------------------------------------------------------------------------
# Cells write anything under scratch, links included; the host only ever touches it through these two functions,
# which never follow a link: the folder itself is opened with O_NOFOLLOW and bound by its fd, and the removal walks
# it by directory fds. Nothing else on the host (no mount source, no folder the agent creates) lies inside it.

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_scratch(path: Path) -> int:
    """An O_PATH fd of the episode's scratch folder (made, parents too, when missing), which bwrap binds at /scratch;
    SandboxError when it is a symbolic link, not a folder, not the agent's own or writable by others."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        kind = "a symbolic link" if path.is_symlink() else "not a usable folder"
        raise SandboxError(f"the scratch folder {str(path)!r} is {kind} ({exc.strerror}): refused") from None
    info = os.fstat(fd)
    problem = ""
    if info.st_uid != os.geteuid():
        problem = f"owned by uid {info.st_uid}, not the agent's {os.geteuid()}"
    elif info.st_mode & 0o002:
        problem = "writable by every user"
    if problem:
        os.close(fd)
        raise SandboxError(f"the scratch folder {str(path)!r} is {problem}: refused")
    return fd


def remove_scratch(path: Path) -> None:
    """Removes a scratch folder and everything a cell left in it, following no link (call it once the sandbox is
    closed: nothing may write there meanwhile). Folders a cell made unreadable are opened up first; nesting of any
    depth is handled with a bounded number of open fds (deep folders are moved up to the top and removed from there).
    A path that is a link or not a folder is left alone."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):  # a cell may have made /scratch itself unreadable
            with contextlib.suppress(OSError):
                os.chmod(path, 0o700)
        top = os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OSError(f"the scratch folder {str(path)!r} cannot be removed ({exc.strerror})") from None
    try:
        moved = 0
        pending = [None]  # folders right under the top still to empty (None: the top itself)
        while pending:
            name = pending.pop()
            fd = top if name is None else os.open(name, _DIR_FLAGS, dir_fd=top)
            try:
                moved = _empty_folder(top, fd, 0, pending, moved)
            finally:
                if fd != top:
                    os.close(fd)
            if name is not None:
                os.rmdir(name, dir_fd=top)
    finally:
        os.close(top)
    os.rmdir(path)


_MAX_REMOVE_DEPTH = 32


def _empty_folder(top: int, fd: int, depth: int, pending: list, moved: int) -> int:
    for entry in list(os.scandir(fd)):
        if not entry.is_dir(follow_symlinks=False):
            os.unlink(entry.name, dir_fd=fd)
            continue
        with contextlib.suppress(OSError, ValueError, NotImplementedError):  # a folder a cell made unreadable
            os.chmod(entry.name, 0o700, dir_fd=fd, follow_symlinks=False)
        if depth >= _MAX_REMOVE_DEPTH:
            moved += 1
            name = f".captain-removing-{moved}"
            os.rename(entry.name, name, src_dir_fd=fd, dst_dir_fd=top)
            pending.append(name)
            continue
        sub = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
        try:
            moved = _empty_folder(top, sub, depth + 1, pending, moved)
        finally:
            os.close(sub)
        os.rmdir(entry.name, dir_fd=fd)
    return moved


# --- one session: one bwrap process -------------------------------------------------------------------------------


class _ProtocolError(Exception):
    pass


MAX_ARGUMENT_DEPTH = 16  # lists and dicts in a robot call's arguments; the API's deepest is a list of poses (3)


def _nested_deeper_than(value: Any, limit: int) -> bool:
    """True when lists and dicts in `value` nest more than `limit` levels (iteratively: any depth is safe)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            if depth >= limit:
                return True
            stack += [(child, depth + 1) for child in item]
    return False


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, 0)  # not inheritable; pass_fds makes it so in bwrap only
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _read_proc(pid: int) -> tuple[int, float] | None:
    """(threads, CPU seconds) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            threads = next(int(line.split()[1]) for line in status if line.startswith(b"Threads:"))
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, IndexError, ValueError):
        return None
    return threads, cpu_s


def _read(fd: int) -> bytes | None:
    """Up to 64 KiB from a non-blocking fd: b"" at its end, None when nothing is there now."""
    try:
        return os.read(fd, 65536)
    except BlockingIOError:
        return None
    except OSError:
        return b""


class _Spawner:
    """Starts bwrap from one long-lived thread: --die-with-parent ties the sandbox to the *thread* that forked it,
    so a sandbox started from a short-lived thread (a thread pool, a ROS callback) would die with that thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def popen(self, argv: list[str], **kwargs: Any) -> subprocess.Popen:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="sandbox-spawner", daemon=True)
                self._thread.start()
        answer: queue.SimpleQueue = queue.SimpleQueue()
        self._requests.put((argv, kwargs, answer))
        ok, value = answer.get()
        if not ok:
            raise value
        return value

    def _serve(self) -> None:
        while True:
            argv, kwargs, answer = self._requests.get()
            try:
                answer.put((True, subprocess.Popen(argv, **kwargs)))
            except BaseException as exc:
                answer.put((False, exc))


_SPAWNER = _Spawner()


class _Session:
    """One bwrap process and its pipes. Everything the child sends is untrusted."""

    def __init__(self, argv: list[str], env: dict[str, str], child_fds: list[int], fds: dict[str, int]) -> None:
        self.died_because: str | None = None  # set when the agent side killed it, with why
        self.pid: int | None = None  # the child's host pid, from bwrap's info fd
        self.cpu_s = 0.0
        self._pidfd: int | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._inbox = bytearray()
        self._outbox = bytearray()
        self.to_child, self.from_child, self.output, self.info = (
            fds["to_child"], fds["from_child"], fds["output"], fds["info"]
        )  # fmt: skip
        self.proc = _SPAWNER.popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=fds["output_child"],
            stderr=fds["output_child"],
            pass_fds=child_fds,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
        for fd in (self.to_child, self.from_child, self.output, self.info):
            os.set_blocking(fd, False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.output, selectors.EVENT_READ, "output")
        self.selector.register(self.from_child, selectors.EVENT_READ, "from_child")

    # life cycle

    def wait_ready(self, timeout_s: float) -> str | None:
        """Waits for the child's pid (from bwrap) and its `ready`; returns None, or what went wrong with its output."""
        deadline = time.monotonic() + timeout_s
        info = bytearray()
        output = bytearray()
        ready = False
        self.selector.register(self.info, selectors.EVENT_READ, "info")
        while not (ready and self.pid is not None):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return f"it did not start within {timeout_s:g} s. {output.decode(errors='replace')}"
            for key, _ in self.selector.select(min(remaining, 0.25)):
                chunk = _read(key.fd)
                if chunk is None:
                    continue
                if key.data == "info":
                    info += chunk
                    if not chunk:
                        self.selector.unregister(self.info)
                    if self.pid is None and not self._set_pid(info) and not chunk:
                        return f"bwrap did not say the child's pid: {info.decode(errors='replace')!r}"
                elif key.data == "output":
                    output += chunk[: 65536 - len(output)]
                elif chunk:
                    self._inbox += chunk
                    try:
                        ready = ready or any(message["op"] == "ready" for message in self.messages(65536))
                    except _ProtocolError as exc:
                        return f"its first message was not `ready` ({exc})"
                else:
                    self.wait_exit(5.0)
                    return output.decode(errors="replace").strip() or f"bwrap exited with {self.proc.returncode}"
            if self.proc.poll() is not None:
                output += _read(self.output) or b""
                return output.decode(errors="replace").strip() or f"bwrap exited with {self.proc.returncode}"
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(self.info)
        return None

    def _set_pid(self, info: bytes) -> bool:
        """bwrap's --info-fd gives the child's host pid; a pidfd makes later signals immune to pid reuse."""
        try:
            self.pid = int(json.loads(bytes(info))["child-pid"])
        except (ValueError, TypeError, KeyError):
            return False
        with contextlib.suppress(OSError, AttributeError):
            self._pidfd = os.pidfd_open(self.pid)
        return True

    def start_watchdog(self, max_threads: int, period_s: float) -> None:
        """Counts the child's threads (the kernel's RLIMIT_NPROC does not apply to host root) and its CPU time."""
        self._watchdog = threading.Thread(
            target=self._watch, args=(max_threads, period_s), name="sandbox-watchdog", daemon=True
        )
        self._watchdog.start()

    def _watch(self, max_threads: int, period_s: float) -> None:
        while not self._stop.wait(period_s) and self.pid is not None and self.proc.poll() is None:
            sample = _read_proc(self.pid)
            if sample is None:
                return
            threads, self.cpu_s = sample
            if threads > max_threads:
                self.kill(f"it ran more than {max_threads} threads")
                return

    def alive(self) -> bool:
        """False once the child or bwrap is gone (bwrap outlives its child by a moment)."""
        return self.died_because is None and self.proc.poll() is None and not self._child_exited()

    def _child_exited(self) -> bool:
        with self._lock:
            if self._pidfd is None:
                return False
            with contextlib.suppress(OSError, ValueError):
                return bool(select.select([self._pidfd], [], [], 0)[0])  # a pidfd reads ready once it exits
            return True

    def interrupt(self) -> None:
        """SIGINT to the child: a KeyboardInterrupt in the running cell."""
        with self._lock:
            if self._pidfd is not None and self.proc.poll() is None:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(self._pidfd, signal.SIGINT)

    def kill(self, because: str | None = None) -> None:
        """SIGKILL to the child and to bwrap; safe from any thread and more than once."""
        with self._lock:
            if because and self.died_because is None:
                self.died_because = because
            if self.proc.poll() is None:
                if self._pidfd is not None:
                    with contextlib.suppress(OSError):
                        signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
                with contextlib.suppress(OSError):
                    os.killpg(self.proc.pid, signal.SIGKILL)  # bwrap; --die-with-parent takes the child too

    def wait_exit(self, timeout_s: float) -> int | None:
        """bwrap's exit status, or None if it still runs after `timeout_s`."""
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        self.kill()
        self.proc.wait()
        if self._pidfd is not None:  # bwrap is gone; wait (briefly) until the child has exited too
            with contextlib.suppress(OSError, ValueError):
                select.select([self._pidfd], [], [], 5.0)
        self._stop.set()
        if self._watchdog is not None:
            self._watchdog.join(5.0)
        self.selector.close()
        with self._lock:
            for fd in (self.to_child, self.from_child, self.output, self.info, self._pidfd):
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            self._pidfd = None

    def exit_reason(self, cpu_time_s: int) -> str:
        """Why the child is gone, in words (waits for bwrap to exit)."""
        code = self.wait_exit(5.0)
        if code is None:
            self.kill()
            code = self.proc.wait()
        signal_number = code - 128 if 128 < code < 128 + signal.NSIG else None
        if self.died_because:
            reason = self.died_because
        elif self.cpu_s >= cpu_time_s - 1:
            reason = f"it used up the session's CPU time ({cpu_time_s} s)"
        elif code < 0:
            reason = f"bwrap was killed by {signal.Signals(-code).name}"
        elif signal_number is not None:
            reason = f"the process was killed by {_SIGNAL_WORDS.get(signal_number, f'signal {signal_number}')}"
        elif code == _EXIT_CHANNEL_BROKEN:
            reason = "the cell broke the session's channel to the agent"
        else:
            reason = f"the process exited with status {code} (os._exit, or a fatal error)"
        return reason

    # messages

    def read_output(self) -> bytes | None:
        return _read(self.output)

    def read_messages(self, max_message_bytes: int) -> list[dict[str, Any]] | None:
        """The messages complete so far; None at the end of the channel."""
        chunk = _read(self.from_child)
        if chunk == b"":
            return None
        self._inbox += chunk or b""
        return self.messages(max_message_bytes)

    def messages(self, max_message_bytes: int) -> list[dict[str, Any]]:
        found = []
        while len(self._inbox) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._inbox)
            if size > max_message_bytes:
                raise _ProtocolError(f"a message of {size} bytes, over {max_message_bytes}")
            if len(self._inbox) < _HEADER.size + size:
                break
            body = bytes(self._inbox[_HEADER.size : _HEADER.size + size])
            del self._inbox[: _HEADER.size + size]
            try:
                message = json.loads(body)
            except (ValueError, RecursionError) as exc:
                raise _ProtocolError(f"a message that is not JSON ({exc})") from None
            if not isinstance(message, dict) or not isinstance(message.get("op"), str):
                raise _ProtocolError("a message without an op")
            found.append(message)
        return found

    def send(self, message: dict[str, Any]) -> None:
        body = json.dumps(message, allow_nan=True).encode()
        self._outbox += _HEADER.pack(len(body)) + body
        self.flush()

    def flush(self) -> None:
        """Writes what the pipe takes now, the rest when the selector says: a child that never reads blocks nothing."""
        while self._outbox:
            try:
                written = os.write(self.to_child, self._outbox[:65536])
            except BlockingIOError:
                break
            except OSError:
                self._outbox.clear()  # the child is gone; the end of its channel will tell
                break
            del self._outbox[:written]
        registered = self.to_child in self.selector.get_map()
        if self._outbox and not registered:
            self.selector.register(self.to_child, selectors.EVENT_WRITE, "to_child")
        elif not self._outbox and registered:
            self.selector.unregister(self.to_child)


_SIGNAL_WORDS = {
    signal.SIGSEGV: "a segmentation fault (SIGSEGV)",
    signal.SIGBUS: "a bus error (SIGBUS)",
    signal.SIGABRT: "an abort (SIGABRT)",
    signal.SIGSYS: "a forbidden system call (SIGSYS, seccomp)",
    signal.SIGKILL: "SIGKILL (out of memory, or a kernel limit)",
    signal.SIGXCPU: "SIGXCPU (the CPU time limit)",
    signal.SIGFPE: "a floating point exception (SIGFPE)",
    signal.SIGILL: "an illegal instruction (SIGILL)",
}


# --- the sandbox --------------------------------------------------------------------------------------------------


@dataclass
class _Cell:
    """The agent's side of one running cell."""

    deadline: float
    output: bytearray = field(default_factory=bytearray)
    output_bytes: int = 0
    output_closed: bool = False
    interrupted_at: float | None = None  # monotonic time of the SIGINT sent after an output flood
    done: dict[str, Any] | None = None
    finished: bool = False  # `done` received, and the `pong` after it when the cell was interrupted


class _Stop(Exception):
    """The session must be killed and restarted; `status` and `reason` go into the cell's result."""

    def __init__(self, status: str, reason: str | None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class Sandbox:
    """One persistent, OS-isolated Python session for an episode's cells (see the module's docstring).

    `on_call(name, args, kwargs) -> dict` runs in the caller's thread while a cell waits for it; `allowed` names the
    robot functions a cell may call. `run_cell` never raises for anything a cell does; it raises SandboxError only
    when the sandbox cannot be (re)started, or after `close`. One thread at a time may use a Sandbox.
    """

    def __init__(
        self,
        scratch_dir: Path,
        on_call: Callable[[str, list, dict], dict],
        allowed: Sequence[str],
        limits: SandboxLimits = SandboxLimits(),
        python: str = sys.executable,
    ) -> None:
        allowed = list(dict.fromkeys(allowed))
        for name in allowed:
            if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
                raise ValueError(f"robot function names must be public identifiers, got {name!r}")
        self.scratch_dir = Path(scratch_dir).absolute()
        self.on_call = on_call
        self.allowed = tuple(allowed)
        self.limits = limits
        self.python = python
        self._session: _Session | None = None
        self._closed = False

    # public API

    def start(self) -> None:
        """Starts the session (nothing happens when it runs already); SandboxError when it cannot start."""
        if self._closed:
            raise SandboxError("the sandbox is closed")
        if self._session is None:
            self._session = self._start_session()

    def run_cell(self, code: str) -> CellResult:
        """Runs `code` in the session; variables, functions and imports stay for the next cell."""
        if not isinstance(code, str):
            raise TypeError(f"a cell is a str, not {type(code).__name__}")
        started = time.monotonic()
        self.start()
        assert self._session is not None
        note = ""
        if not self._session.alive():
            reason = self._session.exit_reason(self.limits.cpu_time_s)
            note = f"The session had stopped since the last cell ({reason}); this cell ran in a fresh session."
            self._restart()
        result = self._run(self._session, code)
        if note:
            result.restarted = True
            result.error = f"{note}\n{result.error}".strip()
        result.duration_s = time.monotonic() - started
        return result

    def close(self) -> None:
        """Kills the session; safe to call more than once."""
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            session.close()

    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def child_pid(self) -> int | None:
        """The host pid of the session's Python process (for tests and diagnostics)."""
        return self._session.pid if self._session is not None else None

    # starting

    def _start_session(self) -> _Session:
        """A new session; any failure on the way (OSError included) is a SandboxError."""
        try:
            return self._try_start_session()
        except SandboxError:
            raise
        except Exception as exc:  # an OSError from a pipe, the scratch folder, ...: this session only
            raise SandboxError(f"the sandbox cannot start: {type(exc).__name__}: {exc}") from exc

    def _try_start_session(self) -> _Session:
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise SandboxError(
                "bubblewrap (bwrap) is not installed or not on PATH; the agent runs model-written code only inside "
                "it. Install it: `sudo apt-get install bubblewrap` (Debian/Ubuntu) or `sudo dnf install bubblewrap`."
            )
        if not os.path.exists(self.python):
            raise SandboxError(f"the sandbox's Python {self.python!r} does not exist")
        scratch_fd = open_scratch(self.scratch_dir)
        fds: dict[str, int] = {}
        child_fds = [scratch_fd]
        try:
            to_child_r, fds["to_child"] = os.pipe()
            fds["from_child"], from_child_w = os.pipe()
            fds["output"], output_w = os.pipe()
            fds["info"], info_w = os.pipe()
            child_fds += [to_child_r, from_child_w, output_w, info_w]
            passwd = f"sandbox:x:{SANDBOX_UID}:{SANDBOX_GID}:sandbox:{SCRATCH_IN_SANDBOX}:/usr/sbin/nologin\n"
            data = {
                "seccomp": build_seccomp_filter(),
                "child": _CHILD_SOURCE.read_bytes(),
                "passwd": passwd.encode(),
                "group": f"sandbox:x:{SANDBOX_GID}:\n".encode(),
            }
            memfds = {}
            for name, content in data.items():
                memfds[name] = _memfd(f"sandbox-{name}", content)
                child_fds.append(memfds[name])
            argv = [
                bwrap,
                *self._bwrap_args(info_w, memfds, scratch_fd),
                *self._child_command(to_child_r, from_child_w),
            ]
            env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}  # bwrap's own environment: nothing of ours
            try:
                session = _Session(argv, env, child_fds, {**fds, "output_child": output_w})
            except OSError as exc:
                raise SandboxError(f"cannot run bwrap ({bwrap}): {exc}") from exc
        except BaseException:
            for fd in fds.values():
                with contextlib.suppress(OSError):
                    os.close(fd)
            raise
        finally:
            for fd in child_fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        problem = session.wait_ready(self.limits.start_timeout_s)
        if problem is not None:
            session.close()
            raise SandboxError(self._explain(problem))
        session.start_watchdog(self.limits.max_threads, self.limits.watchdog_period_s)
        return session

    @staticmethod
    def _explain(problem: str) -> str:
        hint = ""
        lowered = problem.lower()
        if "namespace" in lowered or "operation not permitted" in lowered or "permission denied" in lowered:
            hint = (
                " This usually means unprivileged user namespaces are off: `sysctl user.max_user_namespaces` must be "
                "> 0 and, on Debian, `kernel.unprivileged_userns_clone` 1; on Ubuntu 23.10+ set "
                "`kernel.apparmor_restrict_unprivileged_userns=0` or give bwrap an AppArmor profile; in Docker, run "
                "with `--security-opt seccomp=unconfined --security-opt apparmor=unconfined`. Check with "
                "`bwrap --unshare-all --ro-bind / / true`."
            )
        return f"the sandbox cannot start: {problem}{hint}"

    def _bwrap_args(self, info_fd: int, memfds: dict[str, int], scratch_fd: int) -> list[str]:
        args = [
            "--unshare-all",
            "--unshare-user",
            "--disable-userns",
            "--uid", str(SANDBOX_UID),
            "--gid", str(SANDBOX_GID),
            "--hostname", "sandbox",
            "--die-with-parent",
            "--new-session",
            "--as-pid-1",
            "--cap-drop", "ALL",
            "--info-fd", str(info_fd),
            "--seccomp", str(memfds["seccomp"]),
            "--ro-bind", "/usr", "/usr",
            *_top_level_links(),
            # /tmp first, so an interpreter or venv that lives under the host's /tmp is bound on top of it
            "--perms", "1777", "--size", str(self.limits.tmp_bytes), "--tmpfs", TMP_IN_SANDBOX,
        ]  # fmt: skip
        for path in _python_dirs(self.python):
            args += ["--ro-bind", path, path]
        args += [
            "--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache",
            "--ro-bind-try", "/etc/localtime", "/etc/localtime",
            "--perms", "0444", "--ro-bind-data", str(memfds["passwd"]), "/etc/passwd",
            "--perms", "0444", "--ro-bind-data", str(memfds["group"]), "/etc/group",
            "--perms", "0444", "--ro-bind-data", str(memfds["child"]), CHILD_IN_SANDBOX,
            "--proc", "/proc",
            *_proc_masks(),
            "--dev", "/dev",
            "--bind-fd", str(scratch_fd), SCRATCH_IN_SANDBOX,
            "--remount-ro", "/proc",  # when the agent is root, so is the child to /proc/sys's permission checks
            "--remount-ro", "/dev",
            "--remount-ro", "/",
            "--chdir", SCRATCH_IN_SANDBOX,
            "--clearenv",
        ]  # fmt: skip
        threads = str(self.limits.blas_threads)
        environment = {
            "HOME": SCRATCH_IN_SANDBOX,
            "TMPDIR": TMP_IN_SANDBOX,
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "USER": "sandbox",
            "LOGNAME": "sandbox",
            "MPLBACKEND": "Agg",
            "MALLOC_ARENA_MAX": "2",
            **dict.fromkeys(
                ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"), threads
            ),
        }
        for name, value in environment.items():
            args += ["--setenv", name, value]
        return args

    def _child_command(self, read_fd: int, write_fd: int) -> list[str]:
        limits = self.limits
        config = {
            "read_fd": read_fd,
            "write_fd": write_fd,
            "allowed": list(self.allowed),
            "nice": limits.nice,
            "rlimits": {
                "RLIMIT_CPU": int(limits.cpu_time_s),
                "RLIMIT_AS": int(limits.memory_bytes),
                "RLIMIT_NOFILE": int(limits.max_open_files),
                "RLIMIT_FSIZE": int(limits.max_file_bytes),
                "RLIMIT_CORE": 0,
                "RLIMIT_NPROC": int(limits.max_threads),
            },
            "max_message_bytes": limits.max_message_bytes,
            "max_file_bytes": limits.max_file_bytes,
            "max_argument_depth": MAX_ARGUMENT_DEPTH,
            "max_repr_chars": limits.max_repr_chars,
            "max_error_chars": limits.max_error_chars,
            "max_traceback_frames": limits.max_traceback_frames,
        }
        return [self.python, "-I", "-B", "-u", CHILD_IN_SANDBOX, json.dumps(config)]

    def _restart(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
        self._session = self._start_session()

    # running

    def _run(self, session: _Session, code: str) -> CellResult:
        cell = _Cell(deadline=time.monotonic() + self.limits.cell_timeout_s)
        session.send({"op": "run", "code": code})
        try:
            while not cell.finished:
                self._step(session, cell)
        except _Stop as stop:
            return self._stop(session, cell, stop.status, stop.reason)
        except _ProtocolError as exc:
            return self._stop(session, cell, "crashed", f"the session broke the protocol ({exc})")
        output = cell.output.decode(errors="replace")
        if cell.output_bytes > self.limits.max_output_bytes:
            return CellResult(
                "output_limit", output, f"{self._flood()}; it was stopped and its output cut there", False, 0
            )
        assert cell.done is not None
        error = cell.done["error"][-2 * self.limits.max_error_chars :]
        result = CellResult(cell.done["status"], output, error, restarted=False, duration_s=0.0)
        damaged = cell.done.get("damaged")
        if damaged:  # the session's own runtime is broken: every later cell would fail
            names = ", ".join(str(name)[:40] for name in damaged[:10]) if isinstance(damaged, list) else "?"
            reason = f"the cell replaced or deleted built-in names the session relies on ({names})"
            session.kill(reason)
            self._restart()
            result.restarted = True
            result.error = (
                f"{result.error}\n{reason}; the session was restarted so that later cells work: variables and "
                "imports from earlier cells are lost"
            ).strip()
        return result

    def _step(self, session: _Session, cell: _Cell) -> None:
        """Waits up to 0.25 s for the child and handles what it did; raises _Stop when the session must go."""
        now = time.monotonic()
        if not session.alive():
            self._drain_output(session, cell)
            raise _Stop("crashed", None)
        if now >= cell.deadline:
            raise _Stop("timeout", f"the cell ran longer than {self.limits.cell_timeout_s:g} s")
        wake = cell.deadline
        if cell.interrupted_at is not None:
            wake = min(wake, cell.interrupted_at + self.limits.interrupt_grace_s)
            if now >= wake:
                raise _Stop("output_limit", f"{self._flood()} and did not stop when interrupted")
        for key, _ in session.selector.select(max(0.0, min(wake - now, 0.25))):
            if key.data == "output":
                self._take_output(session, cell, session.read_output())
            elif key.data == "to_child":
                session.flush()
            elif key.data == "from_child":
                messages = session.read_messages(self.limits.max_message_bytes)
                if messages is None:  # the child is gone, or it closed its end of the channel
                    if session.wait_exit(2.0) is None:
                        session.kill("the cell closed the session's channel to the agent")
                    self._drain_output(session, cell)
                    raise _Stop("crashed", None)
                for message in messages:
                    self._handle(session, cell, message)

    def _handle(self, session: _Session, cell: _Cell, message: dict[str, Any]) -> None:
        op = message["op"]
        if op == "call" and cell.done is None:
            session.send(self._answer(message, refuse=cell.interrupted_at is not None))
        elif op == "done" and cell.done is None:
            if message.get("status") not in ("ok", "error") or not isinstance(message.get("error"), str):
                raise _ProtocolError("a malformed `done`")
            cell.done = message
            self._drain_output(session, cell)
            if cell.interrupted_at is None:
                cell.finished = True
            else:
                session.send({"op": "ping"})  # the SIGINT must be spent before the next cell starts
        elif op == "pong" and cell.done is not None and cell.interrupted_at is not None:
            cell.finished = True
        else:
            raise _ProtocolError(f"an unexpected {op!r}")

    def _answer(self, message: dict[str, Any], refuse: bool) -> dict[str, Any]:
        """Runs a robot call for the cell; whatever goes wrong becomes an error the cell sees as RuntimeError."""
        name, args, kwargs = message.get("name"), message.get("args"), message.get("kwargs")
        if refuse:
            return {"op": "reply", "error": "the cell is being stopped (too much output)"}
        if name not in self.allowed:
            return {"op": "reply", "error": f"robot has no function {name!r}"}
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            return {"op": "reply", "error": "malformed call"}
        if _nested_deeper_than([args, kwargs], MAX_ARGUMENT_DEPTH):
            return {"op": "reply", "error": f"the arguments are nested more than {MAX_ARGUMENT_DEPTH} levels deep"}
        try:
            result = self.on_call(name, args, kwargs)
            if not isinstance(result, dict):
                raise TypeError(f"on_call returned {type(result).__name__}, not dict")
            reply = {"op": "reply", "result": result}
            json.dumps(reply, allow_nan=True)
        except Exception as exc:
            logger.exception("robot call %s failed in the agent", name)
            return {"op": "reply", "error": f"{type(exc).__name__}: {exc}"}
        return reply

    def _flood(self) -> str:
        return f"the cell wrote more than {self.limits.max_output_bytes} bytes of output"

    def _take_output(self, session: _Session, cell: _Cell, chunk: bytes | None) -> None:
        if chunk is None:
            return
        if chunk == b"":
            cell.output_closed = True
            with contextlib.suppress(KeyError, ValueError):
                session.selector.unregister(session.output)
            return
        cell.output_bytes += len(chunk)
        room = self.limits.max_output_bytes - len(cell.output)
        if room > 0:
            cell.output += chunk[:room]
        if cell.output_bytes > self.limits.max_output_bytes and cell.interrupted_at is None and cell.done is None:
            cell.interrupted_at = time.monotonic()
            session.interrupt()

    def _drain_output(self, session: _Session, cell: _Cell) -> None:
        """Reads what the child wrote before its last message (it is in the pipe already), a bounded number of times."""
        for _ in range(1024):
            chunk = None if cell.output_closed else session.read_output()
            if chunk is None:
                return
            self._take_output(session, cell, chunk)

    def _stop(self, session: _Session, cell: _Cell, status: str, reason: str | None) -> CellResult:
        """Kills the session, restarts it, and says so in the cell's result."""
        if reason is None:
            reason = f"the session died: {session.exit_reason(self.limits.cpu_time_s)}"
        session.kill(reason)
        self._restart()
        error = f"{reason}; the session was restarted: variables and imports from earlier cells are lost"
        return CellResult(status, cell.output.decode(errors="replace"), error, restarted=True, duration_s=0.0)


__all__ = [
    "SCRATCH_IN_SANDBOX",
    "CellResult",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "build_seccomp_filter",
    "open_scratch",
    "remove_scratch",
]

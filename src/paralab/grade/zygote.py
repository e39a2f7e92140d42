"""The grader's zygote: a pristine process that has imported torch and forks one fresh process
per submission, so no submission pays an `import torch` of its own and none shares a process
with another.

Why it looks the way it does:

- Only under bubblewrap (Linux): without it a submission's process starts fresh, as before.
- It never runs a submission's code. It imports the standard library and torch, reads requests
  from the grader's socket only, and forks; what a submission runs begins in the fork, after the
  fork has made itself what a sandbox of its own would have been.
- The zygote lives in a bubblewrap sandbox whose only job is to hold it: its mounts are the
  submissions' (the Python installation and /usr read-only, the grader's package copies
  read-only at `/grading/batch`). It serves every batch its grader process grades: it holds
  nothing of any of them. Each submission's fork then enters new mount, PID, network,
  IPC and UTS namespaces and, before the student's process exists, mounts a fresh /tmp,
  /dev/shm and /proc of its own, binds its own package copy read-only at `/grading/src`, hides
  the other copies, makes everything else read-only, brings up its own loopback and drops every
  capability. That is what `sandbox._bwrap_command` gives a process started fresh;
  `tests/test_grade_attacks.py` checks that a fork sees the same.
- Two processes per submission stand between the zygote and the student's: a supervisor that
  reports the exit status and kills on the grader's word, and the PID namespace's first
  process, which reaps and, when the student's process ends, ends, taking every process the
  student started with it (as bubblewrap's own init does).
- Run from its file (`runpy.run_path`), never imported through `paralab`: the package the
  student's process imports is its own copy, so the zygote holds none of it.
- Standard library only, besides torch; `ctypes` for the four calls Python 3.11 lacks
  (unshare, mount, prctl, capset).
"""

from __future__ import annotations

import ctypes
import fcntl
import importlib
import json
import os
import random
import re
import resource
import runpy
import select
import signal
import socket
import struct
import sys
import traceback

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
NAMESPACES = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWPID | CLONE_NEWNET
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
READ_ONLY = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV
"""A bind made read-only, keeping the nosuid and nodev that bubblewrap's mounts carry (in a user
namespace of its own, a grader that is not root, a remount may not drop them)."""
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 1, 24, 47, 4
PR_SET_NO_NEW_PRIVS, PR_SET_DUMPABLE, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 4, 22, 2
CAPABILITY_VERSION_3 = 0x20080522
SIOCSIFFLAGS, IFF_UP, IFF_LOOPBACK, IFF_RUNNING = 0x8914, 0x1, 0x8, 0x40
PROC_COVERED = ("sys", "sysrq-trigger", "irq", "bus")
"""Under /proc, bound read-only over themselves, as bubblewrap does: the kernel's settings."""
RESULT_FD = 3
"""Where the student's process finds its result pipe (`--result-fd`)."""
REQUEST_FDS = 4  # the job (stdin), the output file, the result pipe, the report socket

_libc = ctypes.CDLL(None, use_errno=True)


def _call(name: str, *args: object) -> None:
    if getattr(_libc, name)(*args) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{name}{args!r}: {os.strerror(errno)}")


def _mount(source: str | None, target: str, kind: str | None, flags: int, data: str = "") -> None:
    encode = lambda s: None if s is None else s.encode()  # noqa: E731
    _call("mount", encode(source), target.encode(), encode(kind), flags, encode(data or None))


def serve(control: socket.socket) -> None:
    """Fork a supervisor per request until the grader closes the socket."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # supervisors are reaped by the kernel
    while True:
        message, fds, _, _ = socket.recv_fds(control, 1 << 16, REQUEST_FDS)
        if not message:  # the grader's empty message, or its end closed
            return
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            supervisor = os.fork()
        except OSError:  # no process to spare: this request's sockets close, the grader says so
            traceback.print_exc()
            supervisor = -1
        if supervisor == 0:
            code = 1
            try:
                control.close()
                _supervise(json.loads(message), fds)
                code = 0
            except BaseException:  # noqa: BLE001 - said on the zygote's output, for the grader
                traceback.print_exc()
            finally:
                os._exit(code)
        for fd in fds:
            os.close(fd)


def _supervise(request: dict, fds: list[int]) -> None:
    """Start the student's process in fresh namespaces; report how it ended, or kill it (and
    everything it started) when the grader says so or goes away."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _call("prctl", PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    *process_fds, report_fd = fds
    report = socket.socket(fileno=report_fd)
    _call("unshare", NAMESPACES)
    status_read, status_write = os.pipe()
    first = os.fork()  # PID 1 of the new PID namespace
    if first == 0:
        report.close()
        os.close(status_read)
        try:
            _first_process(request, process_fds, status_write)
        except BaseException:  # noqa: BLE001 - the cause, on the submission's own output
            try:
                os.dup2(process_fds[1], 2)
            except OSError:  # already moved there by the student's process
                pass
            traceback.print_exc()
        finally:
            os._exit(1)
    for fd in (*process_fds, status_write):
        os.close(fd)
    ready, _, _ = select.select([os.pidfd_open(first), report], [], [])
    killed = report in ready  # the grader's word ("kill") or the grader gone (end of file)
    if killed:
        os.kill(first, signal.SIGKILL)  # and with it every process in the namespace
    _, status = os.waitpid(first, 0)
    told = os.read(status_read, 64)  # the student's process's own status, passed on by the
    returncode = int(told) if re.fullmatch(rb"-?\d+", told) else os.waitstatus_to_exitcode(status)
    try:
        report.sendall(json.dumps({"returncode": returncode, "killed": killed}).encode())
    except OSError:  # the grader is gone
        pass


def _first_process(request: dict, process_fds: list[int], status_write: int) -> None:
    """PID 1 of the new namespace: make the mounts, drop every capability, start the student's
    process, reap whatever is left to it, and end (which ends every process in the namespace)
    when the student's process does, passing its status on."""
    _call("prctl", PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as PID 1: ignored from inside, like bwrap's
    # Not the zygote's output, limits or memory to a student's process: it writes where the
    # submission writes, under the same caps, and cannot be traced or read (/proc/1) from inside.
    for where in (1, 2):
        os.dup2(process_fds[1], where)
    _limit(request)
    _call("prctl", PR_SET_DUMPABLE, 0, 0, 0, 0)
    _mounts(request["copy"], request["tmpfs_bytes"], request["python_under_tmp"])
    _loopback_up()
    _drop_capabilities()
    _deny_keyrings()
    student = os.fork()
    if student == 0:
        os.close(status_write)
        _call("prctl", PR_SET_DUMPABLE, 1, 0, 0, 0)  # as any process of its own
        _student_process(request, process_fds)
    for fd in process_fds:
        os.close(fd)
    while True:
        pid, status = os.wait()
        if pid == student:
            os.write(status_write, str(os.waitstatus_to_exitcode(status)).encode())
            os._exit(0)


def _mounts(copy: str, tmpfs_bytes: int, under_tmp: list[str]) -> None:
    """This submission's file system: its own /tmp, /dev/shm, /dev/pts, /proc and package; the rest
    read-only; the other submissions' copies hidden. `under_tmp`: the Python installation's
    folders that live under /tmp (a venv made there), bound back read-only over the fresh one."""
    fresh = f"size={tmpfs_bytes},mode=0755"
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing mounted here reaches the zygote
    for place in ("/", "/dev"):
        _mount(None, place, None, READ_ONLY)
    held = [os.open(root, os.O_PATH | os.O_DIRECTORY) for root in under_tmp]  # before hidden
    for place in ("/tmp", "/dev/shm"):
        _mount("tmpfs", place, "tmpfs", MS_NOSUID | MS_NODEV, fresh)
    for root, fd in zip(under_tmp, held):
        os.makedirs(root, exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", root, None, MS_BIND | MS_REC)
        _mount(None, root, None, READ_ONLY | _noexec(fd))
    _mount(
        "devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620"
    )
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for name in PROC_COVERED:
        path = f"/proc/{name}"
        if os.path.exists(path):
            _mount(path, path, None, MS_BIND | MS_REC)
            _mount(None, path, None, READ_ONLY)
    _mount(copy, "/grading/src", None, MS_BIND | MS_REC)
    _mount(None, "/grading/src", None, READ_ONLY | _noexec(os.open(copy, os.O_PATH)))
    _mount("tmpfs", "/grading/batch", "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4096")


def _noexec(fd: int) -> int:
    """MS_NOEXEC where the folder open at `fd` lies on a noexec mount (a /tmp mounted so): the
    remount may not drop it either. Closes `fd`."""
    try:
        return MS_NOEXEC if os.fstatvfs(fd).f_flag & os.ST_NOEXEC else 0
    finally:
        os.close(fd)


def _loopback_up() -> None:
    """The namespace's own loopback, which the gloo ranks use (a new one starts down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as any_socket:
        flags = struct.pack("16sH22x", b"lo", IFF_UP | IFF_LOOPBACK | IFF_RUNNING)
        fcntl.ioctl(any_socket, SIOCSIFFLAGS, flags)


def _drop_capabilities() -> None:
    """None left, none to gain: the bounding and ambient sets emptied, then the rest."""
    with open("/proc/sys/kernel/cap_last_cap") as last:
        for capability in range(int(last.read()) + 1):
            _call("prctl", PR_CAPBSET_DROP, capability, 0, 0, 0)
    _call("prctl", PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(CAPABILITY_VERSION_3, 0)
    _call("capset", header, (ctypes.c_uint32 * 6)())
    _call("prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def _limit(request: dict) -> None:
    """The caps every process of a submission runs under (`sandbox._limits`)."""
    memory = request["memory_bytes"]
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (request["output_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


KEYRING_CALLS = {"x86_64": (0xC000003E, (248, 249, 250)), "aarch64": (0xC00000B7, (217, 218, 219))}
"""(audit architecture, the numbers of add_key, request_key and keyctl) per machine."""


def _deny_keyrings() -> None:
    """The kernel's keyrings refused (EPERM). Every fork shares the zygote's user namespace and
    with it the user's keyring, which a fresh sandbox (a user namespace of its own) does not
    share: left open, it would carry a note from one submission to the next. Any other
    architecture's system calls (i386, x32) are refused too."""
    arch, numbers = KEYRING_CALLS[os.uname().machine]
    load, jump_eq, jump_set, ret = 0x20, 0x15, 0x45, 0x06
    deny, allow = 0x00050000 | 1, 0x7FFF0000  # SECCOMP_RET_ERRNO | EPERM, SECCOMP_RET_ALLOW
    program = [
        (load, 0, 0, 4),  # seccomp_data.arch
        (jump_eq, 1, 0, arch),
        (ret, 0, 0, deny),
        (load, 0, 0, 0),  # seccomp_data.nr
        (jump_set, 4, 0, 0x40000000),  # x32: to the last line
        *((jump_eq, 3 - i, 0, number) for i, number in enumerate(numbers)),
        (ret, 0, 0, allow),
        (ret, 0, 0, deny),
    ]
    filters = (ctypes.c_uint64 * len(program))(
        *(code | jt << 16 | jf << 24 | k << 32 for code, jt, jf, k in program)
    )
    fprog = struct.pack("HxxxxxxP", len(program), ctypes.addressof(filters))
    _call("prctl", PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.c_char_p(fprog), 0, 0)


def _student_process(request: dict, process_fds: list[int]) -> None:
    """What `python -m MODULE --result-fd 3` would be, started fresh in the sandbox: its own
    session, environment, folder and package path (its limits are its first process's)."""
    os.setsid()
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in process_fds]
    for fd in process_fds:
        os.close(fd)
    job, output, result = high
    for fd, where in ((job, 0), (output, 1), (output, 2), (result, RESULT_FD)):
        os.dup2(fd, where)
    for fd in high:
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["environment"], PWD=request["workdir"])
    os.chdir(request["workdir"])
    sys.path[:] = [request["package"], *(p for p in sys.path if p)]
    importlib.invalidate_caches()
    random.seed()  # a fresh process's own, not the zygote's
    sys.argv = [request["module"], "--result-fd", str(RESULT_FD)]
    code = 0
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # noqa: BLE001 - as Python itself reports an uncaught exception
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    # Nothing a submission can write is ever on the zygote's path or its folder: `-c` put the
    # working folder first on sys.path, and a fork's first process could reach it (/proc/1/cwd).
    sys.path[:] = [p for p in sys.path if p]
    os.chdir("/")
    import torch  # noqa: F401 - the import every submission's process would pay for

    serve(socket.socket(fileno=int(os.environ.pop("PARALAB_ZYGOTE_FD"))))

"""Run a submission's code where it can hurt neither the grader nor a classmate.

On Linux with bubblewrap (`bwrap`, the Debian package `bubblewrap`), the student's process sees:

- the Python installation and the system libraries, bound read-only;
- this submission's own copy of the package with every solution stubbed, read-only;
- a fresh, size-capped tmpfs as /tmp and its working directory, gone when it ends;
- no network (only its own loopback, which the gloo ranks use), its own PID namespace
  (the grader and every other process are invisible; when its first process ends, every process
  it started is killed), its own session, no capabilities;

and never the instructor's checkout, its solutions, the other submissions, the seed, or the
score files. Its results come back over a pipe the grader opened; its output goes to a file the
grader opened, capped by RLIMIT_FSIZE; its memory is capped by RLIMIT_AS per process; the grader
kills it when its time budget is spent.

Without bubblewrap (macOS, or a Linux without it) the same process runs with the same limits,
pipe and budget, in its own session and working directory, against its own package copy, with a
cleared environment; but its file system, network and signals are NOT isolated: it can read and
write whatever the grader's user can, and a child that starts its own session outlives the
kill. `isolation()` says which applies; the grader prints it.

Under bubblewrap the student's process is not started fresh but forked from a `Zygote` that has
imported torch once (`paralab.grade.zygote`); the fork makes itself the sandbox above first.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

MEMORY_BYTES = 3 << 30
"""Default address space per process (`--memory`): torch with gloo ranks needs about 0.9 GiB."""
MIN_MEMORY_BYTES = 1 << 30
"""Below this a submission's process cannot even import torch and start its ranks."""
OUTPUT_BYTES = 8 << 20
"""Largest file the student's processes may write (their captured output included)."""
RESULT_BYTES = 64 << 20
"""Largest result the grader reads back; beyond it the result is refused."""
TMPFS_BYTES = 256 << 20
INSIDE_PACKAGE = "/grading/src"
INSIDE_BATCH = "/grading/batch"
INSIDE_TMP = "/tmp"


@dataclass
class Isolation:
    """Which sandbox applies, and what it does and does not isolate."""

    kind: str
    isolated: str
    not_isolated: str

    def describe(self) -> str:
        text = f"sandbox: {self.kind}; isolated: {self.isolated}"
        return text + (f"; NOT isolated: {self.not_isolated}" if self.not_isolated else "")


BUBBLEWRAP = Isolation(
    "bubblewrap",
    "files (read-only system and package copy, fresh tmpfs), network, processes (own PID "
    "namespace and session), memory, output, time",
    "",
)
PROCESS_ONLY = Isolation(
    "process limits only (bubblewrap not found)",
    "memory, output, time, environment, the package copy on the path",
    "files (it can read and write whatever the grader's user can), network, processes that "
    "start their own session, signals to the grader",
)


@functools.cache
def bwrap() -> str | None:
    """The bubblewrap executable, if this machine has one that works. Probed once a process: a
    submission's package copy is hard links to the batch's pristine one only under bubblewrap,
    which binds it read-only, so the copy and the run that uses it must make the same choice."""
    path = shutil.which("bwrap")
    if path is None or not sys.platform.startswith("linux"):
        return None
    probe = subprocess.run(
        [path, "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "true"],
        capture_output=True,
        check=False,
    )
    return path if probe.returncode == 0 else None


def gibibytes(size: int) -> str:
    return f"{size / (1 << 30):g} GiB"


def isolation() -> Isolation:
    return BUBBLEWRAP if bwrap() else PROCESS_ONLY


@dataclass
class SandboxRun:
    """What came back: the bytes the student's process wrote to the result pipe, its output tail."""

    result: bytes
    output_tail: str
    returncode: int | None
    timed_out: bool
    overflowed: bool
    seconds: float


def _site_packages() -> list[str]:
    import site

    found = list(site.getsitepackages())
    if site.ENABLE_USER_SITE and site.getusersitepackages():
        found.append(site.getusersitepackages())
    return found


def _python_roots() -> list[str]:
    """The folders the interpreter and its installed packages live in (bound read-only)."""
    roots = {sys.base_prefix, sys.prefix, *_site_packages()}
    roots.add(str(Path(sys.executable).resolve().parent.parent))
    kept = sorted(r for r in roots if Path(r).exists())
    return [r for r in kept if not any(r != o and r.startswith(o + os.sep) for o in kept)]


SANDBOX_OWN = ("/", INSIDE_TMP, "/dev/shm")
"""Folders the sandbox replaces with fresh ones: a Python installed at one of them could only be
bound by handing the student the host's folder (every other grader's temporary files) instead."""
SANDBOX_TREES = ("/proc", "/dev", "/grading")
"""Trees the sandbox mounts whole: no Python can be bound inside them."""


def unusable_python() -> str | None:
    """Why the sandbox cannot run this interpreter (one line for the instructor), or None.
    A Python under /tmp (a venv made there) is fine: it is bound back over the fresh /tmp."""
    for root in _python_roots():
        inside = any(root == t or root.startswith(t + "/") for t in SANDBOX_TREES)
        if root in SANDBOX_OWN or inside:
            return (
                f"the grader's Python lives at {root}, which the sandbox replaces with a folder "
                "of its own: install it (or make its venv) elsewhere, e.g. under /opt or $HOME"
            )
    return None


def preflight() -> str | None:
    """Why no submission could run here (one line, before any is graded), or None: the sandbox
    starts this interpreter once, so a fault of the grader's own is never a student's zero."""
    why = unusable_python() if bwrap() else None
    if why:
        return why
    executable = bwrap()
    command = [sys.executable, "-c", "pass"]
    with tempfile.TemporaryDirectory(prefix="paralab-preflight-") as empty:
        if executable:
            command = _bwrap_command(executable, Path(empty)) + command
        probe = subprocess.run(command, capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        cause = (probe.stderr.strip().splitlines() or [f"exit {probe.returncode}"])[-1]
        return f"the sandbox cannot start this Python ({sys.executable}): {cause}"
    return None


def _bwrap_command(executable: str, package: Path, zygote: bool = False) -> list[str]:
    command = [executable]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            command += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            command += ["--ro-bind", top, top]
    command += ["--ro-bind", "/usr", "/usr"]
    for name in ("ld.so.cache", "hosts", "passwd", "group", "nsswitch.conf", "localtime"):
        command += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    command += ["--size", str(TMPFS_BYTES), "--tmpfs", INSIDE_TMP]
    command += ["--size", str(TMPFS_BYTES), "--tmpfs", "/dev/shm"]
    command += ["--proc", "/proc", "--dev", "/dev"]
    # After the fresh /tmp: an interpreter or venv that lives under /tmp is bound back on top of
    # it (mounts apply in order, so bound before, the tmpfs would hide it).
    for root in _python_roots():
        command += ["--ro-bind", root, root]
    for packages in _site_packages():  # a non-editable install of paralab holds its solutions
        if (Path(packages) / "paralab" / "__init__.py").exists():
            hider = str(Path(packages) / "paralab")  # empty and read-only: nothing to share
            command += ["--size", "4096", "--tmpfs", hider, "--remount-ro", hider]
    if zygote:  # `package` is the batch's folder: each fork binds its own copy from it
        command += ["--ro-bind", str(package), INSIDE_BATCH, "--dir", INSIDE_PACKAGE]
    else:
        command += ["--ro-bind", str(package), INSIDE_PACKAGE]
    command += ["--unshare-all", "--die-with-parent", "--new-session"]
    # The zygote keeps its capabilities (in its own user namespace) to give each fork its
    # namespaces and mounts; each fork drops every one before the student's process starts.
    command += ["--cap-add" if zygote else "--cap-drop", "ALL"]
    command += ["--chdir", INSIDE_TMP, "--clearenv"]
    for key, value in _environment(INSIDE_PACKAGE, INSIDE_TMP).items():
        command += ["--setenv", key, value]
    return command


def _environment(package: str, home: str) -> dict[str, str]:
    """All the student's process gets: no seed, no instructor paths, no credentials."""
    return {
        "PYTHONPATH": package,
        "HOME": home,
        "TMPDIR": home,
        "PATH": "/usr/bin:/bin",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1",
        "LANG": "C.UTF-8",
    }


def _limits(memory_bytes: int) -> None:
    """In the child, before it runs anything: cap its memory and the files it writes."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (OUTPUT_BYTES, OUTPUT_BYTES))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _read_capped(fd: int, into: bytearray, flags: dict) -> None:
    """Drain the result pipe; past RESULT_BYTES keep reading (so the writer never blocks) but drop."""
    with os.fdopen(fd, "rb", buffering=0) as pipe:
        while chunk := pipe.read(1 << 16):
            if len(into) + len(chunk) > RESULT_BYTES:
                flags["overflowed"] = True
                continue
            into += chunk


def _start_reading(read_end: int) -> tuple[threading.Thread, bytearray, dict]:
    result, flags = bytearray(), {"overflowed": False}
    reader = threading.Thread(target=_read_capped, args=(read_end, result, flags), daemon=True)
    reader.start()
    return reader, result, flags


def _tail(output: IO[bytes]) -> str:
    """The last 4 KiB written, read without moving the offset a writer may share."""
    size = os.fstat(output.fileno()).st_size
    return os.pread(output.fileno(), 4096, max(0, size - 4096)).decode("utf-8", "replace")


def _kill(process: subprocess.Popen) -> None:
    """The whole session the sandbox started (bubblewrap takes its PID namespace down with it)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def run_sandboxed(
    package: Path,
    module: str,
    job: bytes,
    budget_s: float,
    memory_bytes: int = MEMORY_BYTES,
    zygote: Zygote | None = None,
) -> SandboxRun:
    """`python -m module --result-fd N` on `job` (its stdin) in the sandbox, within `budget_s`,
    each of its processes within `memory_bytes` of address space: forked from `zygote` where
    one is given and bubblewrap works, else started fresh."""
    executable = bwrap()
    if zygote is not None and executable:
        return zygote.run(package, module, job, budget_s, memory_bytes)
    read_end, write_end = os.pipe()
    with tempfile.TemporaryDirectory(prefix="paralab-sandbox-") as tmp:
        workdir = Path(tmp) / "work"
        workdir.mkdir()
        output_path, job_path = Path(tmp) / "output.txt", Path(tmp) / "job"
        job_path.write_bytes(job)
        if executable:
            command = _bwrap_command(executable, package)
            command += [sys.executable, "-m", module, "--result-fd", str(write_end)]
            env = None
        else:
            command = [sys.executable, "-m", module, "--result-fd", str(write_end)]
            env = _environment(str(package), str(workdir))
        started = time.monotonic()
        with output_path.open("wb") as output, job_path.open("rb") as stdin:
            process = subprocess.Popen(
                command,
                stdin=stdin,
                stdout=output,
                stderr=subprocess.STDOUT,
                cwd=workdir,
                env=env if env is not None else {"PATH": "/usr/bin:/bin"},
                pass_fds=(write_end,),
                start_new_session=True,
                preexec_fn=functools.partial(_limits, memory_bytes),
            )
        os.close(write_end)
        reader, result, flags = _start_reading(read_end)
        timed_out = False
        try:
            process.wait(timeout=budget_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        _kill(process)  # also every process it left behind in its session
        reader.join(timeout=10)
        seconds = time.monotonic() - started
        with output_path.open("rb") as output:
            tail = _tail(output)
    return SandboxRun(
        bytes(result), tail, process.returncode, timed_out, flags["overflowed"], seconds
    )


KILL_WAIT_S = 30
"""How long the grader waits for a killed submission's supervisor to say it is gone."""


class Zygote:
    """A zygote (`paralab.grade.zygote`, under bubblewrap): every submission's process is a fork
    of one pristine process that has imported torch, in namespaces of its own, instead of a
    fresh interpreter that imports torch again (about 2 CPU-s a submission). Its sandbox binds
    `root` read-only, so the package copies it runs must lie there. Started at the first run
    (again if it died); `close` stops it and removes `root`."""

    def __init__(self) -> None:
        self._owner = os.getpid()  # a process forked from this one holds copies, not the zygote
        self.root = Path(tempfile.mkdtemp(prefix="paralab-grading-"))
        shutil.copy(Path(__file__).with_name("zygote.py"), self.root / "zygote.py")
        self._process: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self._log: IO[bytes] | None = None

    def __enter__(self) -> Zygote:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _start(self, executable: str) -> None:
        self._stop()
        here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        command = _bwrap_command(executable, self.root, zygote=True)
        command += ["--setenv", "PARALAB_ZYGOTE_FD", str(there.fileno()), sys.executable, "-c"]
        command += [
            f"import runpy; runpy.run_path('{INSIDE_BATCH}/zygote.py', run_name='__main__')"
        ]
        self._log = tempfile.TemporaryFile()  # its own output: why, if it dies
        self._process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={"PATH": "/usr/bin:/bin"},
            pass_fds=(there.fileno(),),
            start_new_session=True,
        )
        there.close()
        self._control = here

    def run(
        self, package: Path, module: str, job: bytes, budget_s: float, memory_bytes: int
    ) -> SandboxRun:
        """`run_sandboxed`'s run, forked from the zygote: `package` is a copy under `root`."""
        if self._process is None or self._process.poll() is not None:
            self._start(bwrap() or "bwrap")
        request = {
            "copy": f"{INSIDE_BATCH}/{package.relative_to(self.root)}",
            "package": INSIDE_PACKAGE,
            "workdir": INSIDE_TMP,
            "environment": _environment(INSIDE_PACKAGE, INSIDE_TMP),
            "module": module,
            "memory_bytes": memory_bytes,
            "output_bytes": OUTPUT_BYTES,
            "tmpfs_bytes": TMPFS_BYTES,
            "python_under_tmp": [
                r for r in _python_roots() if r.startswith(INSIDE_TMP + "/")
            ],  # bound back over the fork's own /tmp, as `_bwrap_command` binds them
        }
        read_end, write_end = os.pipe()
        here, there = socket.socketpair()
        with tempfile.TemporaryFile() as output, tempfile.TemporaryFile() as stdin:
            stdin.write(job)
            stdin.seek(0)
            started = time.monotonic()
            try:
                fds = [stdin.fileno(), output.fileno(), write_end, there.fileno()]
                socket.send_fds(self._control, [json.dumps(request).encode()], fds)
            except OSError:  # the zygote is gone: no answer comes, and its output says why
                pass
            os.close(write_end)
            there.close()
            reader, result, flags = _start_reading(read_end)
            with here:
                answer, timed_out = _answer(here, budget_s)
            reader.join(timeout=10)
            seconds = time.monotonic() - started
            tail = _tail(output)
        if answer is None and self._log is not None:
            tail = tail or _tail(self._log)
        return SandboxRun(
            bytes(result),
            tail,
            answer["returncode"] if answer else None,
            timed_out,
            flags["overflowed"],
            seconds,
        )

    def _stop(self) -> None:
        if self._control is not None:
            # An empty message, not just our end closed: a process this one forked since (the
            # launcher's forkserver, for the references) holds a copy of the socket open.
            with contextlib.suppress(OSError):
                self._control.send(b"")
            self._control.close()
            self._control = None
        if self._process is not None:
            try:
                self._process.wait(timeout=KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                pass
            _kill(self._process)
            self._process = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def close(self) -> None:
        """Stop the zygote (its sandbox goes with it) and remove `root`; in the process that
        started it only (a fork of it that exits through `atexit` must not)."""
        if os.getpid() != self._owner:
            return
        self._stop()
        shutil.rmtree(self.root, ignore_errors=True)


@functools.cache
def shared_zygote() -> Zygote:
    """One zygote for every batch this process grades, stopped when the process exits: it holds
    nothing of any batch, and each fork is a sandbox of its own."""
    zygote = Zygote()
    atexit.register(zygote.close)
    return zygote


def _answer(report: socket.socket, budget_s: float) -> tuple[dict | None, bool]:
    """The supervisor's report of how the submission's process ended, and whether the budget ran
    out first (then the supervisor is told to kill it, and reports that)."""
    report.settimeout(budget_s)
    timed_out = False
    try:
        data = report.recv(4096)
    except TimeoutError:
        timed_out = True
        try:
            report.sendall(b"kill")
            report.settimeout(KILL_WAIT_S)
            data = report.recv(4096)
        except OSError:
            data = b""
    except OSError:
        data = b""
    return (json.loads(data) if data else None), timed_out

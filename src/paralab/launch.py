"""Run one function on N real `torch.distributed` ranks and get their results back.

`run(fn, world_size, ...)` starts `world_size` processes, initializes the
default process group in each (gloo on CPU, NCCL when there is a GPU per rank),
calls `fn(*args, **kwargs)` and returns the per-rank return values, index =
rank, to the caller — so a notebook compares and plots in its own process.

Why it looks the way it does:
- `fn` travels as cloudpickle bytes, so functions and classes defined in a
  notebook cell work (plain pickle cannot find them in `__main__`).
- Linux starts ranks from a `forkserver` with torch already imported: ~0.15 s
  per launch instead of ~1 s of `import torch` per rank. Elsewhere `spawn`.
  Never plain `fork`: it hangs once the parent has run a multi-threaded op.
- Every launch gets its own `file://` rendezvous in a fresh temp dir, so
  parallel test runs never collide on a port, and rendezvous opens no socket.
- gloo is pinned to the loopback interface (unless the caller set
  GLOO_SOCKET_IFNAME): the ranks all run on this machine, so they listen on
  127.0.0.1 only, never on the LAN address the hostname may resolve to (the
  classic macOS "gloo cannot connect" failure).
- One pipe per rank plus the process sentinels: the parent always knows
  whether a rank returned, raised, died, or is stuck, and kills every child
  before raising. No hang outlives `timeout`.
- Under `torchrun` (RANK and WORLD_SIZE set) `fn` runs in this process on this
  rank and all ranks' results are gathered as objects.
- `patches=` is the one way to hand the ranks other code than the package's (a
  learner's edit, a planted bug): it travels with `fn` and is applied on every
  rank around `fn` (`paralab.patches.patched`), under forkserver, spawn and
  torchrun alike. No lab needs a keyword argument of its own to smuggle a
  function onto the ranks.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from datetime import timedelta
from multiprocessing.connection import wait
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist

from paralab.patches import Patches, patched, validate

_GRACE_AFTER_ERROR_S = 5.0
FORKSERVER_PRELOAD = [
    "torch",
    "torch.distributed",
    "torch.distributed.fsdp",
    "torch._dynamo",
    "paralab.launch",
]
"""What the forkserver imports once, so every rank starts with it loaded. FSDP2 imports
torch._dynamo lazily at its first fully_shard: seconds per rank, paid once here instead.
It only saves time: what the ranks run is `fn`, the package, and `patches=`."""


class LaunchError(RuntimeError):
    """One or more ranks failed; the message names them and carries their tracebacks."""

    def __init__(self, message: str, failed_ranks: list[int], hung_ranks: list[int]) -> None:
        super().__init__(message)
        self.failed_ranks = failed_ranks
        self.hung_ranks = hung_ranks


class LaunchTimeout(LaunchError):
    """Some ranks did not finish within the timeout (typically: a collective their peers skipped)."""


def rank_device() -> torch.device:
    """The device this rank's tensors live on: its GPU under NCCL, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _default_start_method() -> str:
    return "forkserver" if sys.platform.startswith("linux") else "spawn"


def _context(start_method: str) -> mp.context.BaseContext:
    if start_method == "fork":
        raise ValueError(
            "start_method='fork' hangs once torch has run a multi-threaded op; use forkserver or spawn"
        )
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
    return ctx


def loopback_interface() -> str:
    """The loopback network interface's name: `lo0` on macOS and the BSDs, `lo` on Linux."""
    return "lo0" if sys.platform == "darwin" or "bsd" in sys.platform else "lo"


def _pick_backend(world_size: int) -> str:
    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size:
        return "nccl"
    return "gloo"


def _to_cpu(obj: Any) -> Any:
    """Results cross a process boundary: bring GPU tensors home first."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu() if obj.device.type != "cpu" else obj.detach()
    if isinstance(obj, list):
        return [_to_cpu(o) for o in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_to_cpu(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    return obj


def _init_rank(rank: int, world_size: int, init_method: str, backend: str, timeout: float) -> None:
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(
        backend=backend,
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout),
    )


def _worker(
    rank: int,
    world_size: int,
    init_method: str,
    backend: str,
    timeout: float,
    env: dict[str, str],
    payload: bytes,
    conn: Any,
    log_path: str,
) -> None:
    """Module-level trampoline: unpickle the function, run it, send back its result.

    The rank's stdout/stderr (C++ included) go to a log file: worker output in
    a notebook would arrive in random order, so the parent shows it only when
    the rank fails.
    """
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.environ.update(env)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    try:
        fn, args, kwargs, patches = cloudpickle.loads(payload)
        _init_rank(rank, world_size, init_method, backend, timeout)
        with patched(patches):
            result = _to_cpu(fn(*args, **kwargs))
        conn.send(("ok", cloudpickle.dumps(result)))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - every failure goes to the parent
        conn.send(("error", f"raised {type(exc).__name__}: {exc}", traceback.format_exc()))
    finally:
        conn.close()


def _run_under_torchrun(
    fn: Callable, world_size: int, args: tuple, kwargs: dict, timeout: float, patches: Patches
) -> list:
    env_world = int(os.environ["WORLD_SIZE"])
    if world_size != env_world:
        raise ValueError(
            f"run(..., world_size={world_size}) under torchrun with WORLD_SIZE={env_world}"
        )
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout))
    with patched(patches):
        result = _to_cpu(fn(*args, **kwargs))
    gathered: list = [None] * env_world
    dist.all_gather_object(gathered, result)
    return gathered


@contextlib.contextmanager
def _main_file_hidden_if_unreadable() -> Iterator[None]:
    """Ranks re-import the parent's `__main__` by path; `python - <script` has none to import.

    The function travels by value (cloudpickle), so the ranks never need it.
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None or os.path.exists(path):
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


def _stop(procs: list) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 2.0
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def run(
    fn: Callable,
    world_size: int,
    *args: Any,
    timeout: float = 60.0,
    backend: str | None = None,
    start_method: str | None = None,
    env: dict[str, str] | None = None,
    patches: Patches | None = None,
    **kwargs: Any,
) -> list:
    """Run `fn(*args, **kwargs)` on `world_size` ranks; return the results in rank order.

    `patches`, e.g. `{"paralab.cp.ring": {"ring_pass": my_ring_pass}}`, replaces those
    package attributes on every rank while `fn` runs (`paralab.patches`): the way to
    run an edited function or a planted bug on the ranks. It is checked here first.

    Raises `LaunchError` naming the failing ranks (with their tracebacks) when
    any rank raises or dies, and `LaunchTimeout` when ranks are still running
    after `timeout` seconds. No child process outlives the call.
    """
    if not callable(fn):
        raise TypeError(f"run() needs a callable to run on every rank, got {type(fn).__name__}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    patches = validate(patches) if patches else None
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return _run_under_torchrun(fn, world_size, args, kwargs, timeout, patches)
    try:
        payload = cloudpickle.dumps((fn, args, kwargs, patches))
    except Exception as exc:
        raise TypeError(
            f"run(): the function, an argument or a patch cannot be pickled for the ranks: {exc}"
        ) from exc

    backend = backend or _pick_backend(world_size)
    ctx = _context(start_method or _default_start_method())
    child_env = dict(env or {})
    for key in ("TORCH_DISTRIBUTED_DEBUG", "GLOO_SOCKET_IFNAME"):
        if key in os.environ:
            child_env.setdefault(key, os.environ[key])
    child_env.setdefault("GLOO_SOCKET_IFNAME", loopback_interface())

    with tempfile.TemporaryDirectory(prefix="paralab-rdzv-") as tmp:
        init_method = "file://" + os.path.join(tmp, "store")
        logs = [os.path.join(tmp, f"rank{r}.log") for r in range(world_size)]
        procs, conns = [], []
        try:
            with _main_file_hidden_if_unreadable():
                _start_ranks(
                    ctx,
                    world_size,
                    init_method,
                    backend,
                    timeout,
                    child_env,
                    payload,
                    logs,
                    procs,
                    conns,
                )
            results = _collect(procs, conns, logs, timeout)
            _join_clean_exit(procs)
            return results
        finally:
            _stop(procs)
            for c in conns:
                c.close()


def _start_ranks(
    ctx, world_size, init_method, backend, timeout, env, payload, logs, procs, conns
) -> None:
    """Start one process per rank, each with the write end of its own result pipe."""
    for rank in range(world_size):
        reader, writer = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_worker,
            args=(
                rank,
                world_size,
                init_method,
                backend,
                timeout,
                env,
                payload,
                writer,
                logs[rank],
            ),
            name=f"paralab-rank{rank}",
            daemon=True,
        )
        proc.start()
        writer.close()
        procs.append(proc)
        conns.append(reader)


# Messages of ranks that failed only because a peer went away or stalled.
_CONSEQUENCE_MARKERS = (
    "closed by peer",
    "reset by peer",
    "broken pipe",
    "timed out",
    "timeout",
    "connectfullmesh",
)


def _is_consequence(error: str) -> bool:
    low = error.lower()
    return any(marker in low for marker in _CONSEQUENCE_MARKERS)


def _log_tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:]).rstrip()
    except OSError:
        return ""


def _join_clean_exit(procs: list, wait_s: float = 5.0) -> None:
    """Let ranks finish their closing barrier and teardown before they are stopped."""
    deadline = time.monotonic() + wait_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))


def _collect(procs: list, conns: list, logs: list[str], timeout: float) -> list:
    world_size = len(procs)
    deadline = time.monotonic() + timeout
    results: dict[int, Any] = {}
    errors: dict[int, tuple[str, str]] = {}
    pending = set(range(world_size))
    while pending:
        now = time.monotonic()
        if now >= deadline:
            break
        by_conn = {conns[r]: r for r in pending}
        by_sentinel = {procs[r].sentinel: r for r in pending}
        for ready in wait(list(by_conn) + list(by_sentinel), timeout=deadline - now):
            rank = by_conn.get(ready, by_sentinel.get(ready))
            if rank not in pending:
                continue
            message = _receive(conns[rank], procs[rank])
            if message[0] == "ok":
                results[rank] = cloudpickle.loads(message[1])
            else:
                errors[rank] = (message[1], message[2])
            pending.discard(rank)
        if errors and pending:
            # Peers of a failed rank are usually blocked in a collective that
            # will never complete: give them a moment to fail too, then stop.
            deadline = min(deadline, time.monotonic() + _GRACE_AFTER_ERROR_S)
    if errors:
        raise _launch_error(errors, pending, results, logs, world_size)
    if pending:
        raise LaunchTimeout(
            f"ranks {sorted(pending)} of {world_size} did not finish within {timeout:g} s"
            + (f" while ranks {sorted(results)} had returned" if results else "")
            + ": a collective that only some ranks entered, or work too slow for the timeout;"
            " all ranks were stopped",
            [],
            sorted(pending),
        )
    return [results[r] for r in range(world_size)]


def _receive(conn: Any, proc: Any) -> tuple:
    if not conn.poll():
        proc.join(0.5)
    if conn.poll():
        try:
            return conn.recv()
        except EOFError:
            proc.join(1.0)
    return ("error", f"died without a result (exit code {proc.exitcode})", "")


def _launch_error(
    errors: dict, pending: set, results: dict, logs: list[str], world_size: int
) -> LaunchError:
    """One message: the rank that caused it first, then who failed or hung as a consequence."""
    order = list(errors)  # arrival order
    causes = [r for r in order if not _is_consequence(errors[r][0])] or order[:1]
    primary = causes[0]
    lines = [f"rank {r} {errors[r][0]}" for r in causes]
    followers = sorted(r for r in errors if r not in causes)
    if followers:
        lines.append(f"ranks {followers} failed as a consequence (a peer vanished or stalled)")
    if pending:
        lines.append(
            f"ranks {sorted(pending)} were blocked waiting for the failed ranks and were stopped"
        )
    if errors[primary][1]:
        lines.append(f"--- traceback of rank {primary} ---\n{errors[primary][1].rstrip()}")
    tail = _log_tail(logs[primary])
    if tail:
        lines.append(f"--- output of rank {primary} ---\n{tail}")
    header = f"{len(errors)} of {world_size} ranks failed; "
    return LaunchError(header + "\n".join(lines), sorted(errors), sorted(pending))

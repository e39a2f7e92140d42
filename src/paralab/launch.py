"""Run one function on N real `torch.distributed` ranks and get their results back.

`run(fn, world_size, ...)` starts `world_size` processes, initializes the
default process group in each (gloo on CPU, NCCL when there is a GPU per rank),
calls `fn(*args, **kwargs)` and returns the per-rank return values, index =
rank, to the caller — so a notebook compares and plots in its own process.

Why it looks the way it does:
- `fn` travels as cloudpickle bytes, so functions and classes defined in a
  notebook cell work (plain pickle cannot find them in `__main__`).
- Linux starts ranks from a `forkserver` with torch already imported: a warm
  launch of 8 ranks takes 0.1-0.14 s on 2 cores, instead of 1-3 s of `import
  torch` per rank. Elsewhere `spawn`. Most of what is left is the kernel's:
  forking a process that holds torch copies its page tables (5 ms a rank on
  a 2-core VM), and the rank's exit unmaps them again.
  Never plain `fork` of the caller per rank: a child that inherits a pool of
  intra-op threads hangs in its first parallel op.
- The forkserver itself is a fork of the caller, made at its first launch
  (`_fork_forkserver`), not a fresh interpreter: it already holds torch, which
  a fresh one imports again (seconds of CPU, in every kernel, every grader
  sandbox and every test worker that launches ranks). Forking is safe there
  because its first act is `torch.set_num_threads(1)`, before any op, and a
  one-thread op never touches the inherited pool. What a fresh interpreter
  gave for free is restored by hand: default signal handlers, the default
  RNG seed, plain stdout/stderr, no stdin, and `os._exit` so none of the
  caller's exit handlers run twice. Last, `gc.freeze()` (what Python's gc
  docs advise before a fork without exec): the objects the caller left move
  to gc's permanent generation, so a rank's full collection skips them
  instead of writing to every page it shares with the forkserver (measured
  on 2 cores: 0.17 s of CPU per rank and collection, against 0.1 ms). It
  falls back to the fresh interpreter where the fork would carry state the
  ranks must not see: CUDA initialized (it does not survive a fork), or a
  `patched` block active in the caller.
- The forkserver's socket lives in a dir of its own (`paralab-forkserver-*`), not in
  multiprocessing's `pymp-*`, which only a clean interpreter exit removes: Jupyter gives a
  kernel 2.5 s to exit, then SIGTERMs its process group, and a loaded machine's kernel
  died before its exit handlers ran. The dir goes when the caller exits cleanly, or when
  the forkserver stops: the caller gone (the forkserver's pipe from it closes) or SIGTERM.
- Ranks never import the parent's `__main__` again (multiprocessing's habit):
  `fn` travels by value, so they do not need it, and a script's imports are
  paid per rank (1.4 s for one `import nbformat`, whose jsonschema compiles a
  grammar). So a script needs no `if __name__ == "__main__":` guard either.
- Every launch gets its own `file://` rendezvous in a fresh temp dir, so
  parallel test runs never collide on a port, and rendezvous opens no socket.
- gloo is pinned to the loopback interface (unless the caller set
  GLOO_SOCKET_IFNAME): the ranks all run on this machine, so they listen on
  127.0.0.1 only, never on the LAN address the hostname may resolve to (the
  classic macOS "gloo cannot connect" failure).
- One pipe per rank plus the process sentinels: the parent always knows
  whether a rank returned, raised, died, or is stuck, and kills every child
  before raising. No hang outlives `timeout`.
- After the closing barrier nothing is in flight, and the rank process ends:
  under gloo its sockets close with it, so it skips `destroy_process_group()`
  (10-20 ms of CPU per rank, most of a warm launch on a laptop). NCCL's
  communicators are destroyed, as NCCL asks.
- Each rank's output goes to a log in the launch's temp dir, which is also the
  rank's TMPDIR: errors and timeouts quote its last lines (a few KB at most, even
  of a 10 MB line), and deleting that one dir leaves nothing behind.
- Under `torchrun` (RANK and WORLD_SIZE set) `fn` runs in this process on this
  rank and all ranks' results are gathered as objects. RANK and WORLD_SIZE
  without torchrun's other variables are left over, and `run` says so; a `run`
  inside a rank refuses (a rank cannot start ranks).
- `patches=` is the one way to hand the ranks other code than the package's (a
  learner's edit, a planted bug): it travels with `fn` and is applied on every
  rank around `fn` (`paralab.patches.patched`), under forkserver, spawn and
  torchrun alike. No lab needs a keyword argument of its own to smuggle a
  function onto the ranks.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import importlib
import multiprocessing as mp
import multiprocessing.forkserver as mp_forkserver
import multiprocessing.resource_tracker as mp_resource_tracker
import multiprocessing.spawn as mp_spawn
import multiprocessing.util as mp_util
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
import types
from collections.abc import Callable, Iterator
from datetime import timedelta
from multiprocessing.connection import wait
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist

from paralab.patches import Patches, active_patches, patched, validate

_GRACE_AFTER_ERROR_S = 5.0
_TERM_GRACE_S = 2.0
_RANK_MARKER = "PARALAB_RANK"
"""Set in every rank to "rank/world/pid": a `run()` inside a rank refuses instead of reusing it."""
_TAIL_BYTES = 4_000
"""How much of a rank's output, traceback or error text a message quotes (one line can be 10 MB)."""
_MESSAGE_BYTES = 24_000
"""The most a whole `LaunchError` message holds, however many ranks failed."""
_TORCHRUN_VARS = ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
FORKSERVER_PRELOAD = [
    "torch",
    "torch.distributed",
    "torch.fx.experimental.symbolic_shapes",
    "paralab.launch",
]
"""What the forkserver imports once, so every rank starts with it loaded. A rank's first
`backward(grad)` (a gradient passed in, as every sharded backward here does) imports
torch.fx.experimental.symbolic_shapes and sympy with it: 0.3 s of CPU per rank otherwise. It
only saves time: what the ranks run is `fn`, the package, and `patches=`."""
PRELOAD_IF_IMPORTED = (
    (
        ("torch.distributed.fsdp", "torch.distributed.tensor"),
        ["torch.distributed.fsdp", "torch._dynamo"],
    ),
    (("torch._dynamo",), ["functorch.compile", "torch._inductor.compile_fx"]),
)
"""(signs, modules): the modules are preloaded too where the caller has imported one of the signs.
FSDP or DTensor (which FSDP2 and TP share) in the caller: its ranks may shard with FSDP2, which
imports torch._dynamo lazily at its first `fully_shard`, about a second of CPU per rank. Dynamo in
the caller: its ranks may compile, and a rank's first `torch.compile` imports AOTAutograd and
inductor's compile_fx, 0.75 s per rank. Paid once per forkserver instead, and only there: a caller
with none of the signs (most grader sandboxes, the labs without FSDP) skips them."""


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
        ctx.set_forkserver_preload(_preload())
        _fork_forkserver()
    return ctx


_DEFAULT_SEED = 67280421310721
"""torch's default CPU generator seed, which a fresh interpreter's ranks started from."""


def _preload() -> list[str]:
    """`FORKSERVER_PRELOAD`, and what `PRELOAD_IF_IMPORTED` adds for this caller's imports."""
    extra = [
        module
        for signs, modules in PRELOAD_IF_IMPORTED
        if any(sign in sys.modules for sign in signs)
        for module in modules
    ]
    return FORKSERVER_PRELOAD + extra


def start_forkserver() -> None:
    """Fork the forkserver now, before this process runs what later ranks must not inherit
    (the grader, before a student's cells). `run` does it at its first launch otherwise."""
    if _default_start_method() == "forkserver":
        _fork_forkserver()


def _fork_forkserver() -> None:
    """Start multiprocessing's forkserver as a fork of this process (see the header), unless
    one runs already or this process holds state the ranks must not inherit. Filled in as
    `ForkServer.ensure_running` fills it, so a forkserver that dies is replaced the usual way."""
    server = mp_forkserver._forkserver
    if server._forkserver_pid is not None or torch.cuda.is_initialized() or active_patches():
        return
    with server._lock:
        mp_resource_tracker.ensure_running()
        socket_dir = tempfile.mkdtemp(prefix="paralab-forkserver-")
        # Removed by whichever ends first: this process at a clean exit, or the forkserver
        # when it stops (this process gone, or SIGTERM to the process group, as Jupyter
        # sends a kernel that is slow to exit).
        mp_util.Finalize(None, _remove_dir, args=(socket_dir,), exitpriority=-100)
        with socket.socket(socket.AF_UNIX) as listener:
            address = os.path.join(socket_dir, "socket")
            listener.bind(address)
            os.chmod(address, 0o600)
            listener.listen()
            alive_r, alive_w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the forkserver: it never returns from here
                try:
                    os.close(alive_w)
                    _serve_forks(listener.fileno(), alive_r, socket_dir)
                finally:
                    os._exit(0)
            os.close(alive_r)
        server._forkserver_address = address
        server._forkserver_alive_fd = alive_w
        server._forkserver_pid = pid


def _remove_dir(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _serve_forks(listener_fd: int, alive_r: int, socket_dir: str) -> None:
    """In the forked forkserver: one intra-op thread before any op, what a fresh interpreter
    would have, the preload, gc's permanent generation, then multiprocessing's own loop until
    the caller exits or SIGTERM arrives; last, its socket's dir goes."""
    torch.set_num_threads(1)
    mp_forkserver._forkserver._lock = threading.Lock()  # the caller held it while forking
    for number in signal.valid_signals():
        handler = signal.getsignal(number)
        if callable(handler) and handler is not signal.default_int_handler:
            signal.signal(number, signal.SIG_DFL)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.stdout = sys.__stdout__ or sys.stdout
    sys.stderr = sys.__stderr__ or sys.stderr
    torch.manual_seed(_DEFAULT_SEED)
    sys.modules["__main__"] = types.ModuleType("__main__")  # ranks never see the caller's
    mp_util._close_stdin()
    for name in _preload():
        importlib.import_module(name)
    gc.collect()
    gc.freeze()
    signal.signal(signal.SIGTERM, _stop_serving_on_sigterm(os.getpid()))
    try:
        mp_forkserver.main(listener_fd, alive_r, [])
    finally:
        _remove_dir(socket_dir)


def _stop_serving_on_sigterm(forkserver_pid: int) -> Callable:
    """SIGTERM ends the forkserver's loop, so its socket's dir goes with it (the default
    action would leave the dir). A rank forked before `_worker` resets the default dies of it
    as usual: the handler re-raises it there."""

    def handler(signum: int, frame: object) -> None:
        if os.getpid() == forkserver_pid:
            raise SystemExit(128 + signum)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    return handler


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
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the forkserver's handler is not a rank's
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    _line_buffered_output()
    faulthandler.enable(file=2, all_threads=True)  # a segfault or abort leaves its stack in the log
    os.environ.update(env)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    os.environ[_RANK_MARKER] = f"{rank}/{world_size}/{os.getpid()}"
    _private_tmpdir(os.path.join(os.path.dirname(log_path), f"tmp-rank{rank}"))
    try:
        fn, args, kwargs, patches = cloudpickle.loads(payload)
        _init_rank(rank, world_size, init_method, backend, timeout)
        with patched(patches):
            result = _to_cpu(fn(*args, **kwargs))
        try:
            message = ("ok", cloudpickle.dumps(result), _type_name(result))
        except Exception as exc:  # noqa: BLE001 - named as the return value, not as fn's failure
            message = (
                "error",
                f"returned a {_type_name(result)} that cannot be pickled to send it back: "
                f"{type(exc).__name__}: {exc}",
                traceback.format_exc(),
            )
        conn.send(message)  # then the closing barrier all the same: fn did finish on every rank
        dist.barrier()
        if backend != "gloo":
            dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - every failure goes to the parent
        why = f"raised {type(exc).__name__}: {exc}"
        if isinstance(exc, AttributeError) and "on <module '__main__'" in str(exc):
            why += (
                " (ranks do not import the parent's `__main__`: a function or class defined there "
                "travels by value, but what pickles by name, such as a functools.cache "
                "wrapper, must live in an importable module)"
            )
        conn.send(("error", why, traceback.format_exc()))
    finally:
        conn.close()


def _line_buffered_output() -> None:
    """A rank's last print before it hangs must reach its log before the rank is stopped."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)


def _private_tmpdir(path: str) -> None:
    """Whatever the rank puts in the temp dir (multiprocessing's `pymp-*` included) lives
    inside the launch's own temp dir, which the parent deletes even when it kills the rank."""
    os.makedirs(path, exist_ok=True)
    os.environ["TMPDIR"] = path
    tempfile.tempdir = path
    # A child inherits its parent's multiprocessing temp dir: forget it, so the rank makes its own.
    mp.current_process()._config.pop("tempdir", None)


def _type_name(obj: object) -> str:
    kind = type(obj)
    return (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )


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


_PREPARING = threading.Lock()
_MAIN_KEYS = ("init_main_from_name", "init_main_from_path")


@contextlib.contextmanager
def _ranks_skip_main() -> Iterator[None]:
    """While ranks start, the data each one prepares from names no `__main__` to import."""
    original = mp_spawn.get_preparation_data

    def without_main(name: str) -> dict:
        data = original(name)
        for key in _MAIN_KEYS:
            data.pop(key, None)
        return data

    with _PREPARING:
        mp_spawn.get_preparation_data = without_main
        try:
            yield
        finally:
            mp_spawn.get_preparation_data = original


def _stop(procs: list, grace_s: float) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def _clean_up(procs: list, conns: list, tmp: str) -> None:
    """Stop every rank, close the pipes, delete the temp dir, whatever arrives meanwhile.

    A Ctrl-C during the cleanup (ranks that ignore SIGTERM take the whole grace) only
    cuts the grace short: the cleanup starts over, kills, finishes, and then re-raises.
    """
    interrupt: BaseException | None = None
    while True:
        try:
            _stop(procs, 0.0 if interrupt else _TERM_GRACE_S)
            for c in conns:
                c.close()
            shutil.rmtree(tmp, ignore_errors=True)
            break
        except KeyboardInterrupt as exc:
            interrupt = exc
    if interrupt is not None:
        raise interrupt


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
    _refuse_inside_a_rank()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        _refuse_stale_torchrun_env()
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

    tmp = tempfile.mkdtemp(prefix="paralab-rdzv-")
    init_method = "file://" + os.path.join(tmp, "store")
    logs = [os.path.join(tmp, f"rank{r}.log") for r in range(world_size)]
    procs: list = []
    conns: list = []
    started = time.monotonic()
    try:
        with _ranks_skip_main():
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
        _clean_up(procs, conns, tmp)
        _log_launch(world_size, time.monotonic() - started)


@contextlib.contextmanager
def groups_freed() -> Iterator[None]:
    """On a rank: destroy, when the block ends, the process groups made inside it. A launch that
    runs case after case would otherwise keep every finished case's gloo groups alive, and live
    groups cost every rank CPU: 16 rows of tests/test_compose_runs.py on 8 ranks took 14-16 CPU-s
    freed, 18-25 kept."""
    before = set(dist.distributed_c10d._world.pg_map)
    try:
        yield
    finally:
        for group in set(dist.distributed_c10d._world.pg_map) - before:
            dist.destroy_process_group(group)


def _log_launch(world_size: int, seconds: float) -> None:
    """With PARALAB_LAUNCH_LOG set, one line per launch: how `_build_nb.py --profile` counts them."""
    path = os.environ.get("PARALAB_LAUNCH_LOG")
    if path:
        with open(path, "a") as log:
            log.write(f"{world_size}\t{seconds:.4f}\n")


def _refuse_inside_a_rank() -> None:
    """A rank cannot start ranks: refuse, whether it is bootstrapping or running `fn`."""
    marker = os.environ.get(_RANK_MARKER, "")
    rank, _, rest = marker.partition("/")
    world, _, pid = rest.partition("/")
    if pid == str(os.getpid()):
        raise RuntimeError(
            f"run() was called inside rank {rank} of a run() on {world} ranks: a rank cannot "
            f"start ranks of its own. The function already runs on all {world} ranks, so call "
            "its collectives directly, or call run() from the notebook or script instead."
        )


def _refuse_stale_torchrun_env() -> None:
    """RANK and WORLD_SIZE alone do not make a torchrun rank: fail now, not in a store timeout."""
    if dist.is_initialized():
        return
    missing = [name for name in _TORCHRUN_VARS if name not in os.environ]
    if missing:
        raise RuntimeError(
            f"run() took the torchrun path because RANK={os.environ['RANK']} and "
            f"WORLD_SIZE={os.environ['WORLD_SIZE']} are set in this process's environment, but "
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not: torchrun did not "
            "start this process, so the two are left over (an `export`, `%env`, or an earlier "
            "cell). Clear them: `del os.environ['RANK'], os.environ['WORLD_SIZE']` in Python or "
            "`unset RANK WORLD_SIZE` in the shell, then call run() again. Under another "
            "launcher, initialize the process group before calling run()."
        )


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


def _clip(text: str, limit: int = _TAIL_BYTES) -> str:
    """`text` cut to about `limit` bytes (head and tail kept): one rank can print 10 MB on a line."""
    data = text.encode("utf-8", errors="replace")
    if len(data) <= limit:
        return text
    half = limit // 2
    head = data[:half].decode("utf-8", errors="ignore")
    tail = data[-half:].decode("utf-8", errors="ignore")
    return f"{head}\n... [{len(data) - 2 * half} bytes cut] ...\n{tail}"


def _log_tail(path: str, lines: int = 15, limit: int = _TAIL_BYTES) -> str:
    """The last `lines` lines of a rank's log, less plumbing, and never more than `limit` bytes
    of it (read from the last 16 x `limit` bytes: a crash dump's plumbing can be long)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - 16 * limit))
            data = f.read()
    except OSError:
        return ""
    kept = _without_plumbing(data.decode("utf-8", errors="replace").splitlines(keepends=True))
    text = "".join(kept[-lines:])
    if len(text) > limit or size > 16 * limit:
        return ("... " + text[-limit:]).rstrip()
    return text.rstrip()


def _without_plumbing(lines: list[str]) -> list[str]:
    """A crash dump (faulthandler) without what no learner needs: the frames under the rank's
    `_worker` (multiprocessing's, and the caller's own stack, inherited by the forked
    forkserver) and the list of loaded extension modules."""
    kept, below_worker = [], False
    for line in lines:
        is_frame = line.startswith('  File "')
        if below_worker and is_frame:
            continue
        below_worker = (
            is_frame and 'launch.py", line ' in line and line.rstrip().endswith(" in _worker")
        )
        if line.startswith("Extension modules: "):
            continue
        kept.append(line)
    return kept


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
            message = _receive(conns[rank], procs[rank], logs[rank])
            if message[0] == "ok":
                try:
                    results[rank] = cloudpickle.loads(message[1])
                except Exception as exc:  # noqa: BLE001 - a rank's value, reported by rank
                    errors[rank] = (
                        f"returned a {message[2]} that cannot be unpickled here: "
                        f"{type(exc).__name__}: {exc}",
                        traceback.format_exc(),
                    )
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
        raise _launch_timeout(pending, results, logs, timeout)
    return [results[r] for r in range(world_size)]


def _launch_timeout(pending: set, results: dict, logs: list[str], timeout: float) -> LaunchTimeout:
    """Name the hung ranks, and quote what each printed last: its log goes with the temp dir."""
    hung = sorted(pending)
    lines = [
        f"ranks {hung} of {len(logs)} did not finish within {timeout:g} s"
        + (f" while ranks {sorted(results)} had returned" if results else "")
        + ": a collective that only some ranks entered, or work too slow for the timeout;"
        " all ranks were stopped"
    ]
    for rank in hung:
        tail = _log_tail(logs[rank], lines=5)
        if tail:
            lines.append(f"--- last output of rank {rank} ---\n{tail}")
    return LaunchTimeout(_clip("\n".join(lines), _MESSAGE_BYTES), [], hung)


def _receive(conn: Any, proc: Any, log_path: str) -> tuple:
    if not conn.poll():
        proc.join(0.5)
    if conn.poll():
        try:
            return conn.recv()
        except EOFError:
            proc.join(1.0)
    return ("error", _death(proc.exitcode, log_path), "")


def _death(exitcode: int | None, log_path: str) -> str:
    """Why a rank ended without a result: the signal by name, or a rank that never started."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"died without a result (exit code {exitcode}: killed by {name})"
    reason = f"died without a result (exit code {exitcode})"
    if os.path.exists(log_path):
        return reason
    return (
        f"{reason} while starting, before it could run the function; its error went to this "
        "process's stderr, not to the rank's log"
    )


def _launch_error(
    errors: dict, pending: set, results: dict, logs: list[str], world_size: int
) -> LaunchError:
    """One message: the rank that caused it first, then who failed or hung as a consequence."""
    order = list(errors)  # arrival order
    causes = [r for r in order if not _is_consequence(errors[r][0])] or order[:1]
    primary = causes[0]
    by_reason: dict[str, list[int]] = {}
    for r in causes:  # ranks that all failed the same way get one line
        by_reason.setdefault(errors[r][0], []).append(r)
    lines = [
        f"rank {ranks[0]} {_clip(reason)}"
        if len(ranks) == 1
        else f"ranks {sorted(ranks)} {_clip(reason)}"
        for reason, ranks in by_reason.items()
    ]
    followers = sorted(r for r in errors if r not in causes)
    if followers:
        lines.append(f"ranks {followers} failed as a consequence (a peer vanished or stalled)")
    if pending:
        lines.append(
            f"ranks {sorted(pending)} were blocked waiting for the failed ranks and were stopped"
        )
    if errors[primary][1]:
        traceback_text = _clip(errors[primary][1].rstrip(), 2 * _TAIL_BYTES)
        lines.append(f"--- traceback of rank {primary} ---\n{traceback_text}")
    tail = _log_tail(logs[primary])
    if tail:
        lines.append(f"--- output of rank {primary} ---\n{tail}")
    header = f"{len(errors)} of {world_size} ranks failed; "
    message = _clip(header + "\n".join(lines), _MESSAGE_BYTES)
    return LaunchError(message, sorted(errors), sorted(pending))

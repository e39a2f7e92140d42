"""paralab.launch.run: results, errors, hangs, cleanup, notebooks and torchrun.

Ranks unpickle this module's functions by reference, so each rank imports this
module: keep its top-level imports light (nbformat pulls in a jsonschema format
checker that is slow to import), or every launch pays for them.
"""

import multiprocessing.util
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

import paralab.cp.blocks as cp_blocks
from paralab.cp.ring import ring_attention  # a spawned rank loads it with this module, unpatched
from paralab.launch import LaunchError, LaunchTimeout, run, start_forkserver

MESSAGE_BYTES_AT_MOST = 30_000


def _ones_input(op, rank, n):
    """An 'edited' op_input: every rank contributes ones, so an all-reduce gives n."""
    return torch.ones(n if op == "reduce_scatter" else 1, dtype=torch.float64)


ONES_INPUT = {"paralab.collectives.runs": {"op_input": _ones_input}}


def _rank_and_sum():
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return dist.get_rank(), dist.get_world_size(), t.item(), torch.get_num_threads()


def _raise_on(bad_rank):
    if dist.get_rank() == bad_rank:
        raise ValueError(f"bad input on rank {bad_rank}")
    dist.all_reduce(torch.zeros(1))


def _skip_collective_on(skipping_rank):
    print(f"rank {dist.get_rank()} waits in all_reduce")
    if dist.get_rank() != skipping_rank:
        dist.all_reduce(torch.zeros(1))
    return dist.get_rank()


def _die_on(bad_rank):
    if dist.get_rank() == bad_rank:
        os._exit(3)
    dist.all_reduce(torch.zeros(1))


def _children_alive() -> list[str]:
    import multiprocessing

    return [p.name for p in multiprocessing.active_children() if p.name.startswith("paralab-rank")]


def _temp_root() -> Path:
    """A folder of its own for a test's temp files, which must be empty afterwards: no launch may
    leave a rendezvous dir, a rank's `pymp-*` or anything else behind.

    It sits right in the temp dir, not in the deeper `tmp_path`: a forkserver's socket
    lives in it, and a socket path may not exceed 107 bytes.
    """
    multiprocessing.util.get_temp_dir()  # this process's own, made once, removed at its exit
    start_forkserver()  # and its forkserver's socket dir, likewise
    return Path(tempfile.mkdtemp(prefix="launch-test-"))


def _left_in(root: Path) -> list[str]:
    """What is still in a `_temp_root`; torch's per-user compile cache is shared by every
    process and kept on purpose."""
    return sorted(p.name for p in root.iterdir() if not p.name.startswith("torchinductor_"))


@pytest.fixture(autouse=True)
def private_tmp(monkeypatch, tmp_path_factory) -> Path:
    """Every test's temp files go to a `_temp_root` of its own, empty afterwards."""
    tmp_path_factory.getbasetemp()  # pytest's, made once, before the temp dir moves
    root = _temp_root()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    monkeypatch.setenv("TMPDIR", str(root))
    try:
        yield root
        assert not _children_alive()
        assert _left_in(root) == []
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _ended_within(pid: int, seconds: float) -> bool:
    """Whether process `pid` (not a child of this one) ends within `seconds`: a pidfd wait."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([pidfd], [], [], seconds)[0])
    finally:
        os.close(pidfd)


def _script(tmp_path: Path, source: str) -> Path:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(source))
    return script


def _python_env(private_tmp: Path) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(private_tmp)}


def _run_script(
    script: Path, private_tmp: Path, input: str | None = None, env_extra: dict | None = None
) -> subprocess.CompletedProcess:
    """The script in a fresh interpreter, as a user runs it: its output and exit code."""
    return subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**_python_env(private_tmp), **(env_extra or {})},
        input=input,
    )


@pytest.mark.parametrize("world", [1, 2, 8])
def test_results_come_back_in_rank_order(world):
    results = run(_rank_and_sum, world)
    expected_sum = world * (world - 1) / 2
    assert results == [(r, world, expected_sum, 1) for r in range(world)]


def test_args_kwargs_and_tensors_travel_both_ways():
    def scale(x, *, factor):
        return x * factor + dist.get_rank()

    out = run(scale, 2, torch.arange(3.0), factor=2.0)
    assert torch.equal(out[0], torch.tensor([0.0, 2.0, 4.0]))
    assert torch.equal(out[1], torch.tensor([1.0, 3.0, 5.0]))


def test_a_raising_rank_is_named_with_its_traceback():
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        run(_raise_on, 4, 2, timeout=30)
    assert time.monotonic() - start < 15
    message = str(info.value)
    assert "rank 2 raised ValueError: bad input on rank 2" in message
    assert "traceback of rank 2" in message and "_raise_on" in message
    assert 2 in info.value.failed_ranks
    assert not _children_alive()


def test_a_dying_rank_is_reported():
    with pytest.raises(LaunchError, match="rank 1 died without a result \\(exit code 3\\)"):
        run(_die_on, 3, 1, timeout=30)
    assert not _children_alive()


def test_a_skipped_collective_times_out_instead_of_hanging():
    """And the timeout quotes what each hung rank printed last (one hang shows both)."""
    start = time.monotonic()
    with pytest.raises(LaunchTimeout) as info:
        run(_skip_collective_on, 4, 1, timeout=8)
    elapsed = time.monotonic() - start
    assert elapsed < 20
    message = str(info.value)
    assert "ranks [0, 2, 3] of 4 did not finish within 8 s while ranks [1] had returned" in message
    assert info.value.hung_ranks == [0, 2, 3]
    for rank in (0, 2, 3):
        assert f"--- last output of rank {rank} ---\nrank {rank} waits in all_reduce" in message
    assert "rank 1 waits" not in message  # rank 1 returned: not quoted
    assert not _children_alive()


def _listening_addresses():
    """The local addresses of this process's listening TCP sockets, read from /proc (Linux)."""
    import ipaddress

    dist.all_reduce(torch.zeros(1))  # every pair of ranks is connected by now
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    listening = []
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state != "0A" or inode not in inodes:  # 0A: LISTEN
                    continue
                raw = bytes.fromhex(local.split(":")[0])
                # /proc prints each 32-bit word of the address in host (little-endian) order
                packed = b"".join(raw[i : i + 4][::-1] for i in range(0, width, 4))
                listening.append(str(ipaddress.ip_address(packed)))
    return listening


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the socket tables in /proc")
def test_ranks_listen_on_loopback_only(monkeypatch):
    import ipaddress

    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    per_rank = run(_listening_addresses, 3, timeout=120)
    assert all(per_rank), f"no listening socket found for some rank: {per_rank}"
    for rank, addresses in enumerate(per_rank):
        outside = [a for a in addresses if not ipaddress.ip_address(a).is_loopback]
        assert not outside, f"rank {rank} listens on non-loopback addresses {outside}"


def test_bad_arguments_give_clear_errors():
    with pytest.raises(ValueError, match="world_size must be an int >= 1, got 0"):
        run(_rank_and_sum, 0)
    with pytest.raises(TypeError, match="needs a callable"):
        run(42, 2)
    lock = __import__("threading").Lock()
    with pytest.raises(TypeError, match="cannot be pickled"):
        run(_rank_and_sum, 2, lock)
    with pytest.raises(ValueError, match="fork"):
        run(_rank_and_sum, 2, start_method="fork")


def _marking_merge(*args):
    """A stand-in merge: the ring's output becomes all sevens wherever it merged two blocks."""
    out, lse = _MERGE(*args)
    return torch.full_like(out, 7.0), lse


_MERGE = cp_blocks.merge_partials
MARKING_MERGE = {"paralab.cp.blocks": {"merge_partials": _marking_merge}}


def _collectives_and_ring() -> tuple[list[float], bool]:
    """On each of 2 ranks: the package's collectives worker, and ring attention on a fixed input
    (this rank's output shard), which imported `merge_partials` from `paralab.cp.blocks`."""
    from paralab.collectives import runs

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 3, dtype=torch.float64) for _ in range(3))
    shard = slice(4 * dist.get_rank(), 4 * dist.get_rank() + 4)
    ring = ring_attention(q[:, :, shard], k[:, :, shard], v[:, :, shard])
    return runs.forward_job()["all_reduce"].tolist(), bool(torch.all(ring == 7.0))


def _timed_patched_launch(**kwargs) -> float:
    """The package's collectives and ring on 2 ranks, an edited `op_input` and a `merge_partials`
    patched by its defining module's key: both edits must reach every rank."""
    start = time.monotonic()
    edited = run(_collectives_and_ring, 2, patches={**ONES_INPUT, **MARKING_MERGE}, **kwargs)
    seconds = time.monotonic() - start
    assert edited == [([2.0], True), ([2.0], True)], kwargs
    return seconds


def test_warm_forkserver_launch_beats_spawn_and_patches_reach_spawned_ranks():
    """spawn pays `import torch` in every rank (~1 s each); the preloaded forkserver does not.
    The spawned launch also shows `patches=` reaching ranks under spawn, both an edit of the
    collectives and the defining-module key reaching the ring (`tests/test_patches.py` checks
    it under forkserver): spawned ranks cost an import each, so one spawned launch checks all."""
    from paralab.collectives import runs

    _timed_patched_launch()
    warm = min(_timed_patched_launch() for _ in range(2))
    spawned = _timed_patched_launch(start_method="spawn")
    assert warm < spawned / 3, f"warm forkserver {warm:.2f} s vs spawn {spawned:.2f} s"
    # the caller's process was never patched
    assert runs.op_input is not _ones_input and cp_blocks.merge_partials is _MERGE


@pytest.fixture(scope="module")
def kernel_cells(tmp_path_factory) -> Iterator[SimpleNamespace]:
    """One Jupyter kernel for every kernel-side claim: a notebook's cells run in it, each cell's
    printed line kept. The kernel's TMPDIR is a `_temp_root` of its own."""
    import nbformat
    from nbclient import NotebookClient

    cells = [
        """
        import sys, torch
        from paralab.launch import run

        SHAPES = "torch.fx.experimental.symbolic_shapes"
        before = SHAPES in sys.modules
        torch.ones(2, requires_grad=True).backward(torch.ones(2))
        print(before, SHAPES in sys.modules)
        """,
        """
        import torch.distributed as dist

        class Box:
            def __init__(self, value):
                self.value = value

        def gather_ranks(offset):
            t = torch.tensor([dist.get_rank() + offset])
            out = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
            dist.all_gather(out, t)
            return Box(torch.cat(out).tolist())

        print([b.value for b in run(gather_ranks, 3, 10)])
        """,
        """
        from paralab.collectives import runs

        def op_input(op, rank, n):  # a reader's edit of the shown function
            return torch.full((n if op == "reduce_scatter" else 1,), 7.0, dtype=torch.float64)

        edited = run(runs.forward_job, 2, patches={"paralab.collectives.runs": {"op_input": op_input}})
        print([r["all_reduce"].tolist() for r in edited])
        """,
        """
        def probe():
            import sys, torch
            from torch.distributed.fsdp import fully_shard
            started = "torch._dynamo" in sys.modules, "functorch.compile" in sys.modules
            fully_shard(torch.nn.Linear(2, 2))
            sharded = "torch._dynamo" in sys.modules
            torch.compile(lambda x: x + 1, backend="aot_eager")(torch.ones(2))
            return started, sharded, "functorch.compile" in sys.modules

        print(run(probe, 1, timeout=120)[0])
        """,
        """
        import multiprocessing.forkserver
        print(multiprocessing.forkserver._forkserver._forkserver_pid)
        """,
    ]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(textwrap.dedent(cell)) for cell in cells]
    path = tmp_path_factory.mktemp("notebook")  # the kernel's working dir
    root = _temp_root()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(tempfile, "tempdir", str(root))
            patch.setenv("TMPDIR", str(root))
            NotebookClient(
                nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(path)}}
            ).execute()
        yield SimpleNamespace(printed=[c.outputs[0]["text"].strip() for c in nb.cells], tmp=root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_notebook_defined_function_runs_on_ranks(kernel_cells):
    printed = kernel_cells.printed
    assert printed[1] == "[[10, 11, 12], [10, 11, 12], [10, 11, 12]]"
    assert printed[2] == "[[14.0], [14.0]]"
    # The kernel may have been stopped by SIGTERM (Jupyter's after 2.5 s) before its exit
    # handlers ran: then its forkserver removes its socket dir as it ends. Wait for that end.
    assert _ended_within(int(printed[4]), 30.0)
    assert _left_in(kernel_cells.tmp) == []


def test_the_preload_holds_what_ranks_would_import_lazily_and_only_where_asked(kernel_cells):
    """The engine facts behind `FORKSERVER_PRELOAD` and `PRELOAD_IF_IMPORTED`: the first
    `backward(grad)` imports symbolic_shapes, the first `fully_shard` imports Dynamo and the first
    `torch.compile` AOTAutograd. A caller that imported no FSDP, DTensor or Dynamo (a notebook's
    kernel, whose first launch forked its forkserver: `kernel_cells`) gets ranks without them;
    one that imported FSDP gets ranks that start with FSDP and Dynamo loaded (in
    `test_the_forkserver_is_a_fork_of_the_caller_that_hands_ranks_a_fresh_state`, whose caller
    imports FSDP)."""
    backward, plain = kernel_cells.printed[0], kernel_cells.printed[3]
    assert backward == "False True", "the first backward(grad) imports symbolic_shapes"
    assert plain == "((False, False), True, True)", "fully_shard imports Dynamo; compile, AOT"


def test_under_torchrun_fn_runs_in_process_and_gathers(tmp_path, private_tmp):
    script = tmp_path / "job.py"
    script.write_text(
        textwrap.dedent("""
        import torch.distributed as dist
        from paralab.launch import run

        from paralab.collectives import runs

        def who():
            return dist.get_rank() * 10

        def ones(op, rank, n):
            return torch.ones(n if op == "reduce_scatter" else 1, dtype=torch.float64)

        if __name__ == "__main__":
            import torch
            results = run(who, 2)
            print(f"rank {dist.get_rank()} sees {results}")
            patched = run(runs.forward_job, 2, patches={"paralab.collectives.runs": {"op_input": ones}})
            print(f"rank {dist.get_rank()} all_reduce {patched[0]['all_reduce'].tolist()}")
            assert runs.op_input is not ones, "the patch outlived the run"
            dist.barrier()
            dist.destroy_process_group()
    """)
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        f"--log-dir={tmp_path / 'torchrun-logs'}",  # else torchrun leaves a torchelastic_* dir
        str(script),
    ]
    env = _python_env(private_tmp)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "rank 0 sees [0, 10]" in done.stdout and "rank 1 sees [0, 10]" in done.stdout
    assert "rank 0 all_reduce [2.0]" in done.stdout and "rank 1 all_reduce [2.0]" in done.stdout


# --------------------------------------------------------------------------- patches=
def test_patches_reach_a_package_worker():
    """The package's own worker, imported by the ranks, runs the replacement on every rank
    (under spawn too: `test_warm_forkserver_launch_beats_spawn_and_patches_reach_spawned_ranks`)."""
    from paralab.collectives import runs

    edited = run(runs.forward_job, 2, patches=ONES_INPUT)
    assert [r["all_reduce"].tolist() for r in edited] == [[2.0], [2.0]]
    plain = run(runs.forward_job, 2)
    assert [r["all_reduce"].tolist() for r in plain] == [[10.0, 12.0], [10.0, 12.0]]
    assert runs.op_input is not _ones_input  # the caller's process was never patched


def test_a_bad_patch_fails_at_once_naming_what_exists():
    from paralab.collectives import runs

    with pytest.raises(AttributeError, match="paralab has no 'colectives'"):
        run(runs.forward_job, 2, patches={"paralab.colectives.runs": {"op_input": _ones_input}})
    with pytest.raises(AttributeError, match=r"no 'op_inptu'.*op_input"):
        run(runs.forward_job, 2, patches={"paralab.collectives.runs": {"op_inptu": _ones_input}})
    with pytest.raises(TypeError, match="must map"):
        run(runs.forward_job, 2, patches=[("paralab.collectives.runs", _ones_input)])
    assert not _children_alive()


def test_patched_restores_even_when_the_block_raises():
    from paralab import patches
    from paralab.collectives import runs
    from paralab.parallel_dims import ParallelDims

    original = runs.op_input
    with (
        pytest.raises(RuntimeError),
        patches.patched({"paralab.collectives.runs": {"op_input": _ones_input}}),
    ):
        assert runs.op_input is _ones_input
        raise RuntimeError("inside")
    assert runs.op_input is original
    # A class attribute: a method defined on the class comes back as it was.
    method = ParallelDims.__dict__["mesh_layouts"]
    with patches.patched({"paralab.parallel_dims.ParallelDims": {"mesh_layouts": len}}):
        assert ParallelDims.mesh_layouts is len
    assert ParallelDims.__dict__["mesh_layouts"] is method


# --------------------------------------------------------------------------- bad input, faults
def _shout_then_raise_on(bad_rank):
    if dist.get_rank() == bad_rank:
        print("x" * 10_000_000)
        raise ValueError("y" * 10_000_000)


def test_an_error_message_is_capped_in_bytes():
    with pytest.raises(LaunchError) as info:
        run(_shout_then_raise_on, 2, 1)
    message = str(info.value)
    assert len(message.encode()) < MESSAGE_BYTES_AT_MOST
    assert message.startswith("1 of 2 ranks failed; rank 1 raised ValueError: yyy")
    assert "bytes cut" in message and "--- output of rank 1 ---\n... xxx" in message


def _return_a_lock_on(bad_rank):
    return threading.Lock() if dist.get_rank() == bad_rank else dist.get_rank()


def test_an_unpicklable_return_value_is_named_with_its_rank_and_type():
    with pytest.raises(LaunchError) as info:
        run(_return_a_lock_on, 2, 1)
    assert "rank 1 returned a _thread.lock that cannot be pickled to send it back" in str(
        info.value
    )
    assert info.value.failed_ranks == [1]


def _unpickle_only_on_a_rank():
    if "PARALAB_RANK" not in os.environ:
        raise RuntimeError("this value only unpickles on a rank")
    return RefusesToUnpickleOutsideRanks()


class RefusesToUnpickleOutsideRanks:
    def __reduce__(self):
        return (_unpickle_only_on_a_rank, ())


def _return_a_rank_only_value_on(bad_rank):
    return RefusesToUnpickleOutsideRanks() if dist.get_rank() == bad_rank else dist.get_rank()


def test_a_return_value_that_fails_to_unpickle_here_is_a_launch_error_naming_its_rank():
    with pytest.raises(LaunchError) as info:
        run(_return_a_rank_only_value_on, 2, 0)
    message = str(info.value)
    assert (
        f"rank 0 returned a {__name__}.RefusesToUnpickleOutsideRanks that cannot be unpickled "
        "here: RuntimeError: this value only unpickles on a rank"
    ) in message
    assert info.value.failed_ranks == [0]


def _segfault_on(bad_rank):
    if dist.get_rank() == bad_rank:
        import ctypes

        print("about to read address 0")
        ctypes.string_at(0)
    return dist.get_rank()


def test_a_segfault_names_the_signal_and_shows_the_output():
    with pytest.raises(LaunchError) as info:
        run(_segfault_on, 2, 1)
    message = str(info.value)
    assert "rank 1 died without a result (exit code -11: killed by SIGSEGV)" in message
    assert "--- output of rank 1 ---" in message and "about to read address 0" in message
    assert "Segmentation fault" in message and "_segfault_on" in message  # faulthandler's stack


def _nested_run(inner_world):
    return run(_rank_and_sum, inner_world)


@pytest.mark.parametrize("inner_world", [2, 3])
def test_run_inside_a_rank_refuses_and_says_why(inner_world):
    with pytest.raises(LaunchError) as info:
        run(_nested_run, 2, inner_world)
    message = str(info.value)
    assert "raised RuntimeError: run() was called inside rank " in message
    assert "of a run() on 2 ranks: a rank cannot start ranks of its own" in message
    assert "torchrun" not in message
    assert info.value.failed_ranks == [0, 1]


def test_stale_rank_variables_fail_fast_naming_them(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    for name in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    start = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        run(_rank_and_sum, 2)
    message = str(info.value)
    assert "took the torchrun path because RANK=0 and WORLD_SIZE=2 are set" in message
    assert "MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID are not" in message
    assert "unset RANK WORLD_SIZE" in message
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")  # also left over: still not torchrun
    monkeypatch.setenv("MASTER_PORT", "29500")
    with pytest.raises(RuntimeError, match="but TORCHELASTIC_RUN_ID is not"):
        run(_rank_and_sum, 2)
    assert time.monotonic() - start < 2


def _make_temp_files():
    import multiprocessing.util

    return tempfile.mkdtemp(prefix="left-"), multiprocessing.util.get_temp_dir()


def test_a_run_leaves_no_temp_dir_even_when_ranks_are_killed(private_tmp):
    """The ranks' temp dir lives inside the launch's own, deleted by the parent (see the fixture)."""
    made = run(_make_temp_files, 2)
    for paths in made:
        for path in paths:
            assert path.startswith(str(private_tmp / "paralab-rdzv-")), path
    with pytest.raises(LaunchTimeout):
        run(_make_temp_files_then_hang_on, 2, 0, timeout=3)


def _make_temp_files_then_hang_on(rank):
    _make_temp_files()
    if dist.get_rank() == rank:
        time.sleep(60)


def test_warm_launch_on_8_ranks_median(record_property):
    """Not a limit (a loaded machine is slower): the figure, printed in the run's "figures"
    section (conftest.py), so a slow launch shows in the test log. `dist.get_rank` travels by
    reference to torch, so the ranks import nothing of the test's own (a function of this file
    would make each rank import pytest)."""
    run(dist.get_rank, 8)
    times = []
    for _ in range(7):
        start = time.monotonic()
        assert run(dist.get_rank, 8) == list(range(8))
        times.append(time.monotonic() - start)
    record_property(
        "warm run(fn, 8) median", f"{statistics.median(times):.3f} s over {len(times)} runs"
    )


# ------------------------------------------------------- a user's script, in a fresh interpreter
# Each script below starts as `python job.py` does (paying `import torch` again): the claims are
# about a caller's first launch. One script serves every claim that its first launch leaves
# true; each claim is its own line of output, exit code or file.


@pytest.fixture(scope="module")
def unguarded_script(tmp_path_factory) -> Iterator[SimpleNamespace]:
    """A script without a `__main__` guard whose caller imported FSDP, ran a two-thread op, drew
    random numbers, set a signal handler and defined names in `__main__` before its first launch;
    then a launch of a function it defines and one of a cached function only it can name. Its
    output, exit code, how often its top level ran and what it left in its TMPDIR."""
    tmp_path = tmp_path_factory.mktemp("unguarded")
    script = _script(
        tmp_path,
        """
        import functools, multiprocessing.forkserver, os, signal, sys
        import torch
        import torch.distributed as dist
        import torch.distributed.fsdp
        from paralab.launch import run

        with open(os.environ["TOP_LEVEL_RUNS"], "a") as runs:
            runs.write("the script's top level ran\\n")

        torch.set_num_threads(2)
        torch.randn(1500, 1500) @ torch.randn(1500, 1500)  # the intra-op pool now exists
        torch.manual_seed(1)
        signal.signal(signal.SIGTERM, lambda *_: None)
        MARK = "the caller's __main__"

        def probe():
            import __main__, gc, signal, sys, torch
            x = torch.randn(600, 600)
            cycle = []
            cycle.append(cycle)
            del cycle
            return (
                gc.get_freeze_count() > 10_000,  # what the caller held: frozen, never traversed
                gc.collect() > 0,  # what the rank makes is still collected
                torch.get_num_threads(),
                torch.initial_seed(),
                signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,
                hasattr(__main__, "MARK"),
                sys.stdin is None or sys.stdin.read() == "",
                float((x @ x).sum()) == float((x @ x).sum()),
                "torch._dynamo" in sys.modules,
                "functorch.compile" in sys.modules,
            )

        print(run(probe, 2, timeout=60))
        pid = multiprocessing.forkserver._forkserver._forkserver_pid
        with open(f"/proc/{pid}/stat") as stat:
            parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{pid}/cmdline") as cmdline:
            print(parent == os.getpid(), "forkserver import main" in cmdline.read())

        def who():
            return dist.get_rank()

        @functools.cache
        def square(x):
            return x * x

        print("results", run(who, 2, timeout=60), flush=True)
        run(square, 2, 3, timeout=60)
        print("square ran")
        """,
    )
    runs = tmp_path / "top-level-runs.txt"
    root = _temp_root()
    try:
        done = _run_script(
            script, root, input="the caller's stdin\n", env_extra={"TOP_LEVEL_RUNS": str(runs)}
        )
        top_level_runs = runs.read_text().splitlines() if runs.exists() else []
        yield SimpleNamespace(done=done, top_level_runs=top_level_runs, left=_left_in(root))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_forkserver_is_a_fork_of_the_caller_that_hands_ranks_a_fresh_state(unguarded_script):
    """The forkserver is forked from the caller (no second `import torch`), after the caller ran
    a two-thread op, drew random numbers, set a signal handler and defined names in `__main__`:
    the ranks still start as a fresh interpreter's would (`paralab.launch`'s header), with the
    caller's objects in gc's permanent generation. The caller imported FSDP: its ranks start
    with Dynamo preloaded, not the compiler (`PRELOAD_IF_IMPORTED`; the caller without FSDP is
    `test_the_preload_holds_what_ranks_would_import_lazily_and_only_where_asked`)."""
    done = unguarded_script.done
    printed = done.stdout.splitlines()
    assert len(printed) == 3, done.stderr  # then the line of the unguarded script's test
    ranks, forkserver = printed[:2]
    assert ranks == str([(True, True, 1, 67280421310721, True, False, True, True, True, False)] * 2)
    assert forkserver == "True False", "the forkserver is the caller's fork, not a new interpreter"
    assert unguarded_script.left == []


def test_an_unguarded_script_runs_once_and_what_only_it_can_name_is_refused_with_why(
    unguarded_script,
):
    """Ranks never import the parent's main script again: the top-level `run()` of an unguarded
    script runs once, in the script, and the script's imports cost the ranks nothing. So what
    only the script can name (a cached function travels by name) is refused, saying why. The
    script is `unguarded_script`, whose first two lines are the forkserver test's."""
    done = unguarded_script.done
    assert done.stdout.splitlines()[2:] == ["results [0, 1]"], done.stderr
    assert unguarded_script.top_level_runs == ["the script's top level ran"]
    assert done.returncode == 1
    assert "ranks [0, 1] raised AttributeError: Can't get attribute 'square'" in done.stderr
    assert "ranks do not import the parent's `__main__`" in done.stderr
    assert unguarded_script.left == []


@pytest.fixture(scope="module")
def patch_open_script(tmp_path_factory) -> Iterator[SimpleNamespace]:
    """A script whose first launch runs inside a `patched` block, and whose last launch has
    ranks that ignore SIGTERM, interrupted by Ctrl-C (SIGINT) three times once they are up.
    Its output, exit code, whether it ended within 60 s of the last Ctrl-C, the ranks' pids,
    those still alive, and what it left in its TMPDIR."""
    tmp_path = tmp_path_factory.mktemp("patch-open")
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    script = _script(
        tmp_path,
        """
        import multiprocessing.forkserver, os, signal, sys, time
        from paralab.launch import run
        from paralab.patches import patched

        def probe():
            from paralab.tables import text_table
            return text_table.__name__

        def swapped(*args, **kwargs):
            return "swapped"

        with patched({"paralab.tables": {"text_table": swapped}}):
            print(run(probe, 2, timeout=60))
        print(run(probe, 2, timeout=60))
        print(run(probe, 1, timeout=60, patches={"paralab.tables": {"text_table": swapped}}))
        pid = multiprocessing.forkserver._forkserver._forkserver_pid
        with open(f"/proc/{pid}/cmdline") as cmdline:
            print("forkserver import main" in cmdline.read(), flush=True)

        def stubborn(pid_dir):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            open(os.path.join(pid_dir, str(os.getpid())), "w").close()
            time.sleep(120)

        try:
            run(stubborn, 4, sys.argv[1], timeout=100)
        except KeyboardInterrupt:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a last Ctrl-C may come after cleanup
            print("interrupted", flush=True)
        """,
    )
    root = _temp_root()
    job = subprocess.Popen(
        [sys.executable, str(script), str(pid_dir)],
        env=_python_env(root),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90
        while len(list(pid_dir.iterdir())) < 4 and job.poll() is None:
            if time.monotonic() > deadline:
                job.kill()
            time.sleep(0.2)
        pids = [int(p.name) for p in pid_dir.iterdir()]
        if len(pids) == 4:
            for pause in (0.5, 0.4, 0.0):  # the first starts the cleanup, the others land inside it
                job.send_signal(signal.SIGINT)
                time.sleep(pause)
        try:
            out, err = job.communicate(timeout=60)
            ended = True
        except subprocess.TimeoutExpired:  # each test says what it misses
            job.kill()
            out, err = job.communicate()
            ended = False
        yield SimpleNamespace(
            out=out,
            err=err,
            ended=ended,
            returncode=job.returncode,
            pids=pids,
            alive=[pid for pid in pids if _alive(pid)],
            left=_left_in(root),
        )
    finally:
        job.kill()
        shutil.rmtree(root, ignore_errors=True)


def test_a_patch_open_at_the_first_launch_never_reaches_the_ranks(patch_open_script):
    """A forkserver forked inside a `patched` block would hand its replacement to every later
    rank: there the launcher starts a fresh interpreter instead, and `patches=` stays the one way
    onto the ranks."""
    assert patch_open_script.returncode == 0, patch_open_script.err
    assert patch_open_script.out.splitlines()[:4] == [
        "['text_table', 'text_table']",
        "['text_table', 'text_table']",
        "['swapped']",
        "True",
    ]
    assert patch_open_script.left == []


def test_two_ctrl_c_during_cleanup_leave_no_rank_alive(patch_open_script):
    """Ranks that ignore SIGTERM keep the cleanup waiting its grace; Ctrl-C then must not cut it.
    The script is `patch_open_script`, whose first four lines are the patch test's."""
    assert len(patch_open_script.pids) == 4, patch_open_script.err or "ranks not up"
    assert patch_open_script.ended, "the script still ran 60 s after the last Ctrl-C"
    assert patch_open_script.out.splitlines()[4:] == ["interrupted"], patch_open_script.err[-2000:]
    assert patch_open_script.alive == []
    assert patch_open_script.left == []

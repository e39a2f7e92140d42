"""paralab.ledger: exact call and byte counts, including calls torch makes on our behalf."""

import torch
import torch.distributed as dist

from paralab.fsdp.engine_facts import fsdp2_mesh_calls
from paralab.launch import run
from paralab.ledger import Ledger, format_table, merge


def _known_sequence():
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.ones(10, dtype=torch.float64)  # 80 bytes
    with Ledger() as led:
        with led.phase("forward"):
            dist.all_reduce(x)
            out = torch.empty(40, dtype=torch.float64)
            dist.all_gather_into_tensor(out, x)
            shard = torch.empty(10, dtype=torch.float64)
            dist.reduce_scatter_tensor(shard, out)
        with led.phase("backward"):
            a2a_out = torch.empty(8, dtype=torch.float32)
            dist.all_to_all_single(a2a_out, torch.ones(8, dtype=torch.float32))
            dist.broadcast(x, src=0)
            ops = [
                dist.P2POp(dist.isend, torch.ones(3, dtype=torch.int64), (rank + 1) % world),
                dist.P2POp(dist.irecv, torch.empty(3, dtype=torch.int64), (rank - 1) % world),
            ]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
            gathered = [None] * world
            dist.all_gather_object(gathered, "abc")
    return led.records, led.summary()


def test_known_sequence_gives_exact_calls_and_bytes():
    per_rank = run(_known_sequence, 4)
    for rank, (records, summary) in enumerate(per_rank):
        got = {k: (t.calls, t.bytes_sent) for k, t in summary.items()}
        obj_bytes = got[("backward", "all_gather_object")][1]
        assert got == {
            ("forward", "all_reduce"): (1, 2 * 3 * 80 // 4),
            ("forward", "all_gather_into_tensor"): (1, 3 * 80),
            ("forward", "reduce_scatter_tensor"): (1, 3 * 320 // 4),
            ("backward", "all_to_all_single"): (1, 3 * 32 // 4),
            ("backward", "broadcast"): (1, 3 * 80 if rank == 0 else 0),
            ("backward", "isend"): (1, 24),
            ("backward", "irecv"): (1, 0),
            ("backward", "all_gather_object"): (1, obj_bytes),
        }
        assert obj_bytes > 0
        isend = next(r for r in records if r.op == "isend")
        assert isend.peer == (rank + 1) % 4 and isend.group_size == 4
        # the all_gather inside all_gather_object is not counted a second time
        assert not any(r.op == "all_gather" for r in records)
    table = format_table([r for r, _ in per_rank])
    assert "rank 3" in table
    irecv_row = next(line for line in table.splitlines() if " irecv " in line)
    assert irecv_row.count("1 calls, 24 B received") == 4  # a receive shows what arrived, not "0 B"
    broadcast_row = next(line for line in table.splitlines() if " broadcast " in line)
    assert "1 calls, 240 B" in broadcast_row and broadcast_row.count("1 calls, 80 B received") == 3
    assert len(merge([r for r, _ in per_rank])[("forward", "all_reduce")]) == 4


def _ledger_restores_torch():
    original = dist.all_reduce
    with Ledger():
        patched = dist.all_reduce
    return patched is not original and dist.all_reduce is original


def test_ledger_restores_torch_distributed():
    assert run(_ledger_restores_torch, 2) == [True, True]


def _fsdp2_step(two_d: bool) -> dict[tuple, int]:
    calls = run(fsdp2_mesh_calls, 4, two_d)[0]
    return {key: calls.count(key) for key in set(calls)}


def test_fsdp2_on_a_2d_mesh_adds_one_rank_all_reduce_per_unit():
    one_d, two_d = _fsdp2_step(False), _fsdp2_step(True)
    assert one_d == {
        ("forward", "all_gather_single", 4): 2,
        ("backward", "all_gather_single", 4): 2,
        ("backward", "reduce_scatter_single", 4): 2,
    }
    assert two_d == {**one_d, ("backward", "all_reduce", 1): 2}

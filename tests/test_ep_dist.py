"""Expert parallelism on real ranks: forward, loss, every gradient and the parameters after two
steps equal one process with the same routing and drops; bytes = the routing's formula;
DeepEP's layout counts on one process's routing = what each rank's dispatch sent; the clinic's
bug (send splits used as receive splits) is seen."""

import pytest
import torch

import paralab.ep as ep_api
from paralab.check import Verdict
from paralab.ep.model import MoEConfig
from paralab.ep.runs import (
    check_bytes,
    check_layout,
    check_params,
    check_step,
    ep_worker,
    reference_run,
)
from paralab.exercises.lab09 import lean_dispatch, misrouted_tokens
from paralab.launch import LaunchError, run


def _failures(verdicts: list[Verdict]) -> list[str]:
    return [v.describe() for v in verdicts if not v.passed]


@pytest.mark.parametrize("ep", [2, 4])
@pytest.mark.parametrize("top_k", [1, 2])
@pytest.mark.parametrize("capacity_factor", [None, 1.0])
def test_ep_step_and_two_steps_equal_one_process(ep, top_k, capacity_factor):
    config = MoEConfig(top_k=top_k, capacity_factor=capacity_factor)
    per_rank = run(ep_worker, ep, config, ep, 2, 0)
    ref = reference_run(config, ep, 2, 0)
    label = f"ep={ep} top-{top_k} c={capacity_factor}"
    verdicts = (
        check_step(per_rank, ref, ep, label)
        + check_params(per_rank, ref, label)
        + check_bytes(per_rank, config, ep, label)
    )
    for per_node in (1, 2):
        verdicts += check_layout(per_rank, ref, config, ep, per_node, f"{label} {per_node}/node")
    assert not _failures(verdicts), _failures(verdicts)
    kept = [int(r["step0"]["keep"].sum()) for r in per_rank]
    if capacity_factor is None:
        assert kept == [config.seq * top_k] * ep
    else:
        assert min(kept) < config.seq * top_k, "the capacity limit never dropped anything"


@pytest.mark.parametrize("top_k, capacity_factor", [(2, None), (1, 1.25)])
def test_ep_over_four_dp_ranks_trains_like_one_process(top_k, capacity_factor):
    config = MoEConfig(top_k=top_k, capacity_factor=capacity_factor)
    per_rank = run(ep_worker, 4, config, 2, 2, 0)
    ref = reference_run(config, 4, 2, 0)
    label = f"dp=4 ep=2 top-{top_k}"
    verdicts = (
        check_step(per_rank, ref, 2, label)
        + check_params(per_rank, ref, label)
        + check_bytes(per_rank, config, 2, label)
    )
    for per_node in (1, 2):
        verdicts += check_layout(per_rank, ref, config, 2, per_node, f"{label} {per_node}/node")
    assert not _failures(verdicts), _failures(verdicts)
    expert_sync = [r for r in per_rank[0]["step0"]["records"] if r.phase == "grad sync"][1]
    assert expert_sync.group_ranks == (0, 2), (
        "expert gradients meet the ranks holding the same experts"
    )


def test_the_public_entry_points_agree():
    per_rank = run(ep_api.train, 4, 2, 4, experts=8, top_k=1, capacity_factor=1.0, steps=2)
    ref = ep_api.reference(experts=8, top_k=1, capacity_factor=1.0, samples=4, steps=2)
    verdicts = check_params(per_rank, {"params": ref}, "train vs reference")
    assert not _failures(verdicts), _failures(verdicts)
    assert sum(".fc1.weight" in n for n in per_rank[0]) == 8


def test_send_splits_as_receive_splits_misroute_tokens_when_the_totals_agree():
    config = MoEConfig(top_k=1)  # seed 0: ranks 0 and 1 send each other 14 rows each
    ref = reference_run(config, 2, 1, 0)
    buggy = run(ep_worker, 2, config, 2, 1, 0, patches=lean_dispatch())
    expected = misrouted_tokens([r.experts for r in ref["step0"]["routing"]], 2, config.experts)
    for rank, result in enumerate(buggy):
        diff = (result["step0"]["logits"] - ref["step0"]["logits"][rank]).abs().amax(dim=1)
        wrong = torch.nonzero(diff > 1e-12).flatten().tolist()
        assert wrong == expected[rank] and wrong, (rank, wrong, expected[rank])


def test_send_splits_as_receive_splits_abort_the_all_to_all_when_they_disagree():
    with pytest.raises(LaunchError) as caught:
        run(ep_worker, 2, MoEConfig(top_k=2), 2, 1, 0, patches=lean_dispatch(), timeout=30)
    assert "SIGABRT" in str(caught.value)


def _split_matrix_of(config, seed):
    from paralab.ep.costs import split_matrix

    routing = reference_run(config, 2, 1, seed)["step0"]["routing"]
    return split_matrix(
        [torch.bincount(r.experts[r.keep], minlength=config.experts) for r in routing], 2
    )


def test_the_clinic_routings_split_as_the_lab_says():
    """Top-2, seed 0: rank 1 sends rank 0 more than it gets back (the abort); top-1, seeds 0 and
    4: the totals agree (14 and 12), so the bug runs and misroutes tokens."""
    top2 = _split_matrix_of(MoEConfig(top_k=2), 0)
    assert top2[1, 0] > top2[0, 1]
    assert _split_matrix_of(MoEConfig(top_k=1), 0).tolist() == [[10, 14], [14, 10]]
    seed4 = _split_matrix_of(MoEConfig(top_k=1), 4)
    assert seed4[0, 1] == seed4[1, 0] == 12
    routing = reference_run(MoEConfig(top_k=1), 2, 1, 4)["step0"]["routing"]
    assert all(misrouted_tokens([r.experts for r in routing], 2, 4))


def _counts_both_ways(counts):
    import torch.distributed as dist

    from paralab.ep.dispatch import exchange_counts
    from paralab.exercises.lab09 import counts_as_sent

    mine = counts[dist.get_rank()]
    return torch.equal(exchange_counts(mine, None), counts_as_sent(mine, None))


def test_send_splits_as_receive_splits_are_right_when_every_count_is_equal():
    """Padding to capacity: every rank sends every expert the same count, and the bug hides."""
    assert all(run(_counts_both_ways, 2, [torch.full((4,), 3), torch.full((4,), 3)]))
    assert not all(
        run(_counts_both_ways, 2, [torch.tensor([1, 2, 3, 4]), torch.tensor([4, 3, 2, 1])])
    )


def test_ep_over_every_dp_rank_syncs_gradients_with_one_all_reduce():
    config = MoEConfig()
    per_rank = run(ep_worker, 4, config, 4, 1, 0)
    sync = [r for r in per_rank[0]["step0"]["records"] if r.phase == "grad sync"]
    assert [r.op for r in sync] == ["all_reduce"]
    verdicts = check_step(per_rank, reference_run(config, 4, 1, 0), 4, "ep=4 over dp=4")
    assert not _failures(verdicts), _failures(verdicts)

"""offload_encode on real gloo ranks: latents come home in order, compute runs where the plan says."""

import sys

import cloudpickle
import pytest
import torch

from paralab.check import CheckFailed, assert_match
from paralab.exercises.lab04 import raw_pixels_clinic, skip_when_empty
from paralab.launch import LaunchTimeout, run
from paralab.models import TinyVideoEncoder, random_raw_videos
from paralab.vae_lb import encode_cost, offload_encode
from paralab.vae_lb.runs import (
    fingerprint,
    groups_of,
    lb_worker,
    reference_latents,
    run_checks,
)

cloudpickle.register_pickle_by_value(
    sys.modules[__name__]
)  # ranks need this file's workers by value


def check_run(batches, costs, lb):
    """Launch, then check latents, encode counts and places, plans and bytes (`run_checks`); return the reports."""
    world = len(batches)
    reports = [r[0] for r in run(lb_worker, world, batches, [lb], costs, timeout=60)]
    assert [r["group"] for r in reports] == [g for g in groups_of(world, lb) for _ in g]
    failed = [v.describe() for v in run_checks(reports, batches, lb, costs) if not v.passed]
    assert not failed, "\n".join(failed)
    return reports


def test_latents_return_to_their_owners_in_order_lb4():
    counts = [6, 0, 1, 3]
    batches = [random_raw_videos(n, seed=10 + r) for r, n in enumerate(counts)]
    costs = [[encode_cost(v) for v in b] for b in batches]
    results = check_run(batches, costs, lb=4)
    assert results[1]["latents"] == []  # the empty rank took part and got nothing back
    assert results[1]["encoded"], "the empty rank should have helped"
    stay_home = {fingerprint(v): r for r, b in enumerate(batches) for v in b}
    encoded_at = {fp: r for r, res in enumerate(results) for fp in res["encoded"]}
    assert encoded_at != stay_home  # the placement check in check_run can tell the two apart


def test_two_lb_groups_in_one_world_use_global_peers():
    counts = [5, 1, 0, 2, 1, 4, 0, 3]
    batches = [random_raw_videos(n, seed=20 + r) for r, n in enumerate(counts)]
    costs = [[encode_cost(v) for v in b] for b in batches]
    results = check_run(batches, costs, lb=4)
    peers = {
        rec.peer for rank in range(4, 8) for rec in results[rank]["records"] if rec.peer is not None
    }
    assert peers and peers <= {4, 5, 6, 7}


def test_a_rank_that_sends_and_receives_in_the_same_round():
    batches = [random_raw_videos(n, seed=30 + r) for r, n in enumerate([2, 2, 1])]
    costs = [[6.0, 6.0], [1.0, 1.0], [4.0]]  # plan: 0 -> 1, then 1 -> 2 twice
    results = check_run(batches, costs, lb=3)
    assert results[1]["encoded"] == [fingerprint(batches[0][0])]  # its own two went to rank 2
    assert results[2]["encoded"] == [
        fingerprint(v) for v in [batches[2][0], *batches[1]]
    ]  # own first, then guests
    assert {r.op for r in results[1]["records"]} == {"all_gather", "isend", "irecv"}


def test_a_plan_without_moves_moves_no_payload():
    batches = [random_raw_videos(2, seed=40 + r) for r in range(4)]
    costs = [[5.0, 5.0]] * 4
    results = check_run(batches, costs, lb=4)
    for rank, result in enumerate(results):
        assert [r.op for r in result["records"]] == ["all_gather", "all_gather"], rank
        assert sorted(result["encoded"]) == sorted(fingerprint(v) for v in batches[rank])


def test_every_rank_empty():
    results = check_run([[], [], [], []], [[], [], [], []], lb=2)
    assert all(
        r["latents"] == [] and [x.op for x in r["records"]] == ["all_gather"] for r in results
    )


def test_the_checks_catch_raw_uint8_and_a_wrong_order():
    batches = [random_raw_videos(n, seed=50 + r) for r, n in enumerate([3, 1])]
    costs = [[encode_cost(v) for v in b] for b in batches]
    reference = reference_latents(batches)
    trapped = [r[0] for r in run(lb_worker, 2, batches, [2], costs, patches=raw_pixels_clinic())]
    with pytest.raises(CheckFailed, match="do not match"):
        assert_match([r["latents"] for r in trapped], reference)
    good = check_run(batches, costs, lb=2)
    with pytest.raises(CheckFailed):
        assert_match([good[0]["latents"][::-1], good[1]["latents"]], reference)


def test_costs_and_videos_must_match():
    def mismatched():
        return offload_encode([torch.zeros(3, 2, 8, 8, dtype=torch.uint8)], [], TinyVideoEncoder())

    with pytest.raises(Exception, match="1 videos but 0 costs"):
        run(mismatched, 1)


def test_a_rank_that_skips_the_collectives_hangs_its_peer():
    batches = [random_raw_videos(n, seed=60 + r) for r, n in enumerate([2, 1, 0, 2])]
    with pytest.raises(LaunchTimeout) as caught:
        run(lb_worker, 4, batches, [2], patches=skip_when_empty(), timeout=3)
    assert caught.value.hung_ranks == [3]  # rank 2's only lb peer; group [0, 1] finished


def test_the_metadata_record_is_64_bytes():
    """Lab 04's prose says 64 B per metadata record (`64 + 3THW` per move): 8 int64."""
    from paralab.vae_lb import META_BYTES, META_LEN

    assert (META_LEN, META_BYTES) == (8, 64)

"""What FSDP2 and torch.distributed.checkpoint do, measured on 4 gloo ranks (cited by lab 01's chapters).

One launch runs every job; each test reads its part. Two Linear(8, 8) units, no bias, float32.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
import torch

from paralab.fsdp.engine_facts import (
    checkpoint_round_trip,
    fsdp2_inference_root_facts,
    fsdp2_step_facts,
)
from paralab.launch import run

WORLD = 4
UNIT_NUMEL = 64  # each of the two Linear(8, 8) units
REPLICAS = (1, 2)
POLICIES = {
    "none": (None, None),
    "bf16 params, fp32 reduce": (torch.bfloat16, torch.float32),
    "bf16 params, reduce default": (torch.bfloat16, None),
}


def _facts(directory: str) -> dict:
    checkpoints = {r: checkpoint_round_trip(os.path.join(directory, f"r{r}"), r) for r in REPLICAS}
    return {
        "checkpoint": checkpoints,
        "mixed": {k: fsdp2_step_facts(*v) for k, v in POLICIES.items()},
        "keep_gathered": fsdp2_step_facts(reshard_after_forward=False),
        "inference_root": fsdp2_inference_root_facts(),
    }


@pytest.fixture(scope="module")
def facts(tmp_path_factory):
    return run(_facts, WORLD, str(tmp_path_factory.mktemp("dcp")), timeout=120)


def _per_call(result: dict, op: str) -> set[int]:
    return {sent for name, sent in result["calls"] if name == op}


@pytest.mark.parametrize(
    "policy, gather_bytes, reduce_bytes, compute",
    [
        ("none", 4, 4, "torch.float32"),
        ("bf16 params, fp32 reduce", 2, 4, "torch.bfloat16"),
        ("bf16 params, reduce default", 2, 2, "torch.bfloat16"),
    ],
)
def test_mixed_precision_sets_the_bytes_per_element_of_each_collective(
    facts, policy, gather_bytes, reduce_bytes, compute
):
    shard = UNIT_NUMEL // WORLD
    for rank in facts:
        result = rank["mixed"][policy]
        assert _per_call(result, "all_gather_single") == {(WORLD - 1) * shard * gather_bytes}
        assert _per_call(result, "reduce_scatter_single") == {(WORLD - 1) * shard * reduce_bytes}
        assert Counter(op for op, _ in result["calls"]) == {
            "all_gather_single": 4,
            "reduce_scatter_single": 2,
        }
        assert result["compute_dtypes"] == {compute}
        assert (
            result["param_dtypes"] == result["grad_dtypes"] == {"torch.float32"}
        )  # fp32 master shards


def test_after_an_inference_forward_the_root_stays_gathered(facts):
    """The units reshard after their forward; the root's own parameters do not, even with no
    backward to come: what lab 11 counts of a sharded text encoder (its root, whole)."""
    for rank in facts:
        assert rank["inference_root"] == {"0.weight": True, "1.weight": True, "2.weight": False}


def test_without_reshard_after_forward_backward_gathers_nothing(facts):
    for rank in facts:
        assert Counter(op for op, _ in rank["keep_gathered"]["calls"]) == {
            "all_gather_single": 2,
            "reduce_scatter_single": 2,
        }


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_keeps_16_bytes_per_parameter_over_the_shard_group_with_adam(facts, policy):
    shard = 2 * UNIT_NUMEL // WORLD  # parameters this rank owns
    for rank in facts:
        assert rank["mixed"][policy]["held_bytes"] == {
            "params": 4 * shard,
            "grads": 4 * shard,
            "adam": 8 * shard,
        }


@pytest.mark.parametrize("dp_replicate", REPLICAS)
def test_checkpoint_reads_scale_with_dp_shard_not_with_the_world(facts, dp_replicate):
    dp_shard = WORLD // dp_replicate
    per_rank = [rank["checkpoint"][dp_replicate] for rank in facts]
    stored = set(per_rank[0]["stored"])
    assert len(stored) == 2 * dp_shard  # one slice per (parameter, shard): replicas are saved once
    plain = [rank["every rank"] for rank in per_rank]
    read_by = Counter(item for rank in plain for item in rank["reads"])
    assert set(read_by) == stored and set(read_by.values()) == {dp_replicate}
    for rank, result in enumerate(plain):
        partner = (rank + dp_shard) % WORLD  # same shard index, next replica
        assert result["reads"] == plain[partner]["reads"] and len(result["reads"]) == 2
        assert result["loaded_equal"] and result["broadcasts"] == []


@pytest.mark.parametrize("dp_replicate", REPLICAS)
def test_one_reader_per_replica_reads_each_slice_once_then_broadcasts(facts, dp_replicate):
    dp_shard = WORLD // dp_replicate
    per_rank = [rank["checkpoint"][dp_replicate]["one reader"] for rank in facts]
    read_by = Counter(item for rank in per_rank for item in rank["reads"])
    assert set(read_by.values()) == {1} and len(read_by) == 2 * dp_shard
    for rank, result in enumerate(per_rank):
        first_replica = rank < dp_shard
        assert len(result["reads"]) == (2 if first_replica else 0)
        assert result["broadcasts"] == ([dp_replicate] * 2 if dp_replicate > 1 else [])
        assert result["loaded_equal"]

"""The small helpers every lab and test shares: patch sets, claims, ledger queries, text tables."""

import sys
import types

import pytest

from paralab import ledger
from paralab.check import claim, closing_table, verdict_table
from paralab.ledger import Record
from paralab.patches import patched
from paralab.tables import text_table


def test_patched_swaps_and_restores_even_on_error(monkeypatch):
    module = types.ModuleType("toy")
    module.decide = lambda: "right"
    monkeypatch.setitem(sys.modules, "toy", module)
    with pytest.raises(RuntimeError):
        with patched({"toy": {"decide": lambda: "wrong"}}):
            assert module.decide() == "wrong"
            raise RuntimeError("boom")
    assert module.decide() == "right"


def test_patched_refuses_a_name_the_module_lacks(monkeypatch):
    module = types.ModuleType("toy")
    module.decide = lambda: "right"
    monkeypatch.setitem(sys.modules, "toy", module)
    with pytest.raises(AttributeError, match="toy has no 'nothing_here' to replace; it has decide"):
        with patched({"toy": {"nothing_here": 1}}):
            pass


def test_claim_reads_as_claim_and_observation():
    rows = [
        claim("every sample encoded once", True, "8 of 8"),
        claim("no rank idles", False, "rank 3 idle"),
    ]
    table = verdict_table(rows)
    assert table.splitlines()[0].split() == ["claim", "observed", "verdict"]
    assert "every sample encoded once  8 of 8" in table
    assert "rank 3 idle" in table and table.endswith("1/2 passed")
    assert "FAIL (" not in table
    assert rows[1].describe() == "no rank idles: does not hold (rank 3 idle)"


def test_a_mixed_table_keeps_the_tensor_columns():
    import torch

    from paralab.check import compare

    table = verdict_table(
        [*compare(torch.ones(2), torch.ones(2), name="x"), claim("holds", True, "yes")]
    )
    assert table.splitlines()[0].split()[:3] == ["tensor", "shape", "dtype"]
    assert table.endswith("2/2 passed")


def test_ledger_queries_filter_by_any_field():
    records = [
        Record("all_gather", "forward", (0, 1), 12, 12),
        Record("all_gather", "backward", (0, 1), 12, 12),
        Record("isend", "forward", (0, 1), 8, 0, peer=1),
        Record("irecv", "forward", (0, 1), 0, 8, peer=1),
    ]
    assert ledger.sent(records) == 32
    assert ledger.sent(records, phase="forward") == 20
    assert ledger.sent(records, op="all_gather", group_ranks=(0, 1)) == 24
    assert ledger.received(records, op="irecv", peer=1) == 8
    assert ledger.calls(records, phase="forward") == 3


def test_text_table_pads_and_aligns():
    assert text_table(
        ("a", "bytes"), [("x", 5), ("long", 12345)], align_right=(1,)
    ).splitlines() == ["a     bytes", "----  -----", "x         5", "long  12345"]


def test_closing_table_counts_each_group_and_flags_a_failing_one():
    groups = {
        "a": [claim("x", True, "ok"), claim("y", True, "ok")],
        "b": [claim("z", False, "broke")],
    }
    lines = closing_table(groups).splitlines()
    assert lines[2].split() == ["a", "2", "yes"] and lines[3].split() == ["b", "1", "NO"]
    assert lines[-1].split() == ["all", "3", "NO"]
    assert "passed" not in closing_table(groups), "a restatement must not count its checks twice"

"""paralab.check: element-by-element verdicts and messages a person can act on."""

import pytest
import torch

from paralab.check import CheckFailed, assert_match, compare, verdict_table


def test_identical_tensors_pass_bitwise():
    x = torch.randn(3, 4, dtype=torch.float64)
    (v,) = compare(x, x.clone())
    assert v.passed and v.exact and v.max_abs == 0


def test_one_differing_element_is_located():
    expected = [torch.zeros(2, 3), torch.zeros(2, 3)]
    actual = [torch.zeros(2, 3), torch.zeros(2, 3)]
    actual[1][1, 2] = 0.5
    with pytest.raises(CheckFailed) as info:
        assert_match(actual, expected, name="grad")
    message = str(info.value)
    assert (
        "grad/rank 1: 1 of 6 elements differ, max |diff| 0.5, first at index (1, 2): expected 0.0, got 0.5"
        in message
    )
    assert "rank 0" not in message


def test_reported_values_survive_a_change_of_cpu():
    # two values a few ulps apart (as two BLAS kernels give) read the same at 6 significant digits
    expected = torch.tensor([-1.208209503877947], dtype=torch.float64)
    lines = {
        compare(torch.tensor([v], dtype=torch.float64), expected)[0].describe()
        for v in (0.6323941312666288, 0.632394131266629)
    }
    assert lines == {
        "tensor: 1 of 1 elements differ, max |diff| 1.84, first at index (0,): expected -1.20821, got 0.632394"
    }


def test_tolerance_mode():
    e = torch.ones(4, dtype=torch.float64)
    a = e + 1e-13
    assert not compare(a, e)[0].passed
    assert compare(a, e, atol=1e-12)[0].passed
    assert not compare(a + 1e-11, e, atol=1e-12)[0].passed


@pytest.mark.parametrize(
    "actual, problem",
    [
        (torch.zeros(2, 2), "shape (2, 2), expected (4,)"),
        (torch.zeros(4, dtype=torch.float32), "dtype float32, expected float64"),
        (
            torch.tensor([0.0, float("nan"), 0.0, 0.0], dtype=torch.float64),
            "1 NaN values where the reference is finite, first at index (1,)",
        ),
        (None, "missing"),
        ([1, 2], "a list, not a tensor"),
    ],
)
def test_each_kind_of_mismatch_has_its_own_words(actual, problem):
    (v,) = compare(actual, torch.zeros(4, dtype=torch.float64))
    assert not v.passed and v.problem == problem


def test_nested_structures_and_missing_keys():
    expected = [{"out": torch.ones(2), "grad": {"q": torch.ones(2)}}]
    actual = [{"out": torch.ones(2), "grad": {}}]
    verdicts = compare(actual, expected, name="ring")
    assert [(v.path, v.passed) for v in verdicts] == [
        ("ring/rank 0/out", True),
        ("ring/rank 0/grad/q", False),
    ]
    assert (
        compare([torch.ones(1)], [torch.ones(1), torch.ones(1)])[0].problem
        == "expected 2 entries, got 1"
    )


def test_integer_tensors_compare_exactly():
    assert compare(torch.tensor([1, 2]), torch.tensor([1, 2]))[0].passed
    v = compare(torch.tensor([1, 3]), torch.tensor([1, 2]))[0]
    assert not v.passed and v.first_index == (1,) and v.max_abs == 1


def test_verdict_table_is_deterministic_and_counts():
    verdicts = compare(
        [torch.ones(2, 3), torch.zeros(2)], [torch.ones(2, 3), torch.ones(2)], name="x"
    )
    table = verdict_table(verdicts, "demo")
    assert table == verdict_table(verdicts, "demo")
    lines = table.splitlines()
    assert lines[0] == "demo"
    assert lines[3].split() == ["x/rank", "0", "2x3", "float32", "0", "(bitwise)", "pass"]
    assert lines[4].split()[-3:] == ["FAIL", "(2", "differ)"]
    assert lines[-1] == "1/2 passed"

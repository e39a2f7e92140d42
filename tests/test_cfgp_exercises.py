"""Lab 03 exercises beyond the generic tests in test_grade.py: the bug that hangs, and the
tolerance that lets an algebraically equal combine pass."""

import dataclasses

from paralab.exercises import EXERCISES
from paralab.exercises.lab03 import send_then_receive
from paralab.grade import grade, report


def test_blocking_send_on_both_ranks_is_reported_as_a_hang():
    exercise = dataclasses.replace(EXERCISES["exchange_prediction"], timeout=4.0)
    outcome = grade(exercise, send_then_receive)
    text = report(exercise, outcome)
    assert outcome.verdict == "TIMEOUT" and outcome.points == 0, text
    assert "world 2: ranks [0, 1] never finished" in text and "send/recv" in text, text


def _combine_rewritten(cond_pred, uncond_pred, guidance_scale):
    return (1 - guidance_scale) * uncond_pred + guidance_scale * cond_pred


def test_an_algebraically_equal_combine_passes_within_rounding():
    exercise = EXERCISES["cfg_combine"]
    assert grade(exercise, _combine_rewritten).verdict == "PASS"
    exact = dataclasses.replace(exercise, atol=0.0, rtol=0.0)
    assert grade(exact, _combine_rewritten).verdict != "PASS", (
        "the rewrite should differ in the last bits"
    )

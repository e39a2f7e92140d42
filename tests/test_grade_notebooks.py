"""Grading handed-in notebooks: the real student release, each exercise typed into its stub cell in
place, scores full marks on every lab; an untouched release scores 0; a half-solved one exactly its
points; the check cell applies the grader's own rules.

One batch per lab through `python -m paralab.grade` (the lab's solved release, and for lab 04 two
variants), read back from its JSON: the sandbox runs all the exercises of one notebook in one
process.
"""

import ast
import copy
import csv
import functools
import importlib
import inspect
import json
import re
import textwrap

import nbformat
import pytest

from paralab.exercises import EXERCISES, for_lab
from paralab.grade import check
from paralab.grade.__main__ import main
from paralab.grade.code import definition, screen, statements
from paralab.notebooks import ROOT, show_cell
from paralab.release import student_notebook
from paralab.stubs import stub_package

LAB02, LAB04 = "02_cp_ring_vs_ulysses", "04_vae_lb"
LABS = sorted(
    {e.lab for e in EXERCISES.values() if list((ROOT / "labs" / e.lab).glob("*_lab.ipynb"))}
)
SEED = 5


def release(lab: str) -> nbformat.NotebookNode:
    """The lab's notebook as the student release hands it out (a fresh copy, the caller's to edit)."""
    return copy.deepcopy(_release(lab))


@functools.cache
def _release(lab: str) -> nbformat.NotebookNode:
    """Built once per lab: reading and converting a notebook costs 0.1 CPU-s, and the grading
    tests hand in ~40 releases (a copy costs under 1 ms)."""
    source = next((ROOT / "labs" / lab).glob("*_lab.ipynb"))
    return student_notebook(nbformat.read(source, as_version=4), lab)


def _solution_region(exercise) -> tuple[str, str]:
    module_name, _, attr = exercise.target.rpartition(".")
    source = inspect.getsource(getattr(importlib.import_module(module_name), attr))
    found = re.search(
        r"^([ \t]*)### BEGIN SOLUTION\n(.*?)^[ \t]*### END SOLUTION\n", source, re.S | re.M
    )
    return found.group(1), textwrap.dedent(found.group(2))


def solve_in_place(nb: nbformat.NotebookNode, exercise) -> nbformat.NotebookNode:
    """Type the package's solution where the stub raises, in the cell handed out for it, as a
    student who retyped it would (its first argument renamed), using what the stub imports."""
    fn = exercise.target.rsplit(".", 1)[1]
    indent, body = _solution_region(exercise)
    stub = re.compile(
        rf"^[ \t]*# YOUR CODE HERE\n[ \t]*raise NotImplementedError\(['\"]"
        rf"{re.escape(exercise.name)}:[^\n]*\)\n?",
        re.M,
    )
    cell = next(
        c
        for c in nb.cells
        if c.cell_type == "code" and fn in c.metadata.get("paralab", {}).get("edit", [])
    )
    text, replaced = stub.subn(lambda _: textwrap.indent(body, indent), cell.source + "\n")
    assert replaced == 1, f"{exercise.name}: no stub to replace in\n{cell.source}"
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == fn)
    lines, argument = text.splitlines(), node.args.args[0].arg
    span = re.sub(
        rf"\b{argument}\b", f"{argument}_in", "\n".join(lines[node.lineno - 1 : node.end_lineno])
    )
    cell.source = "\n".join(lines[: node.lineno - 1] + [span] + lines[node.end_lineno :])
    return nb


def hand_in(path, nb: nbformat.NotebookNode):
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def notebook_name(lab: str) -> str:
    return next((ROOT / "labs" / lab).glob("*_lab.ipynb")).name


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> tuple:
    """One batch: every lab's release solved in place, and for lab 04 also
    a half-solved and an untouched one (one batch, so one zygote: see `paralab.grade.zygote`).
    (exit code, rows by key, folder)."""
    root = tmp_path_factory.mktemp("submissions")
    for lab in LABS:
        nb = release(lab)
        for exercise in for_lab(lab):
            solve_in_place(nb, exercise)
        hand_in(root / f"solved-{lab}" / notebook_name(lab), nb)
    half = release(LAB04)
    for name in ("normalize_pixels", "plan_rebalance"):
        solve_in_place(half, EXERCISES[name])
    # a later cell no one marked for answers redefines a function wrongly: it does not count
    half.cells.append(nbformat.v4.new_code_cell("def normalize_pixels(video):\n    return video"))
    hand_in(root / "half" / notebook_name(LAB04), half)
    hand_in(root / "untouched" / notebook_name(LAB04), release(LAB04))
    code = main(
        [str(p) for p in sorted(root.glob("*/*.ipynb"))]
        + ["--seed", str(SEED), "--json", str(root / "scores.json")]
        + ["--csv", str(root / "scores.csv")]
    )
    rows = json.loads((root / "scores.json").read_text())
    return code, {(r["student"], r["exercise"]): r for r in rows}, root


@pytest.mark.parametrize("lab", LABS)
def test_the_release_solved_in_place_scores_full_marks(lab, graded):
    _, rows, _ = graded
    for exercise in for_lab(lab):
        row = rows[(f"solved-{lab}", exercise.name)]
        assert (row["points"], row["verdict"]) == (exercise.points, "PASS"), row


def test_half_solved_scores_exactly_its_points_and_untouched_scores_zero(graded):
    code, rows, _ = graded
    assert code == 1
    points = {e.name: e.points for e in for_lab(LAB04)}
    assert rows[("half", "normalize_pixels")]["points"] == points["normalize_pixels"]
    assert rows[("half", "plan_rebalance")]["points"] == points["plan_rebalance"]
    assert rows[("half", "return_latents")]["verdict"] == "not implemented yet"
    assert rows[("untouched", "TOTAL")]["points"] == 0
    assert {rows[("untouched", e)]["verdict"] for e in points} == {"not implemented yet"}


def test_csv_has_one_row_per_student_and_exercise_plus_totals(graded):
    _, rows, root = graded
    with (root / "scores.csv").open() as f:
        table = list(csv.DictReader(f))
    per_lab = [len(for_lab(lab)) + 1 for lab in LABS] + [len(for_lab(LAB04)) + 1] * 2
    assert len(table) == len(rows) == sum(per_lab)
    feedback = (root / "half" / "vae_lb_lab.feedback.txt").read_text()
    assert "plan_rebalance: PASS" in feedback


def test_the_release_marks_the_cells_a_student_edits_and_the_checks():
    nb = release(LAB02)
    edits = [c for c in nb.cells if c.metadata.get("paralab", {}).get("edit")]
    marked = {fn for c in edits for fn in c.metadata["paralab"]["edit"]}
    assert marked == {e.target.rsplit(".", 1)[1] for e in for_lab(LAB02)}
    assert all("raise NotImplementedError(" in c.source for c in edits)
    checks = [
        c.metadata["paralab"]["check"] for c in nb.cells if "check" in c.metadata.get("paralab", {})
    ]
    assert sorted(checks) == sorted(e.name for e in for_lab(LAB02))


def test_the_grading_copy_and_the_release_hold_no_solution(tmp_path):
    package = stub_package(tmp_path / "paralab", lambda fn: f"{fn} withheld")
    blocks = (package / "cp" / "blocks.py").read_text()
    assert (
        "### BEGIN SOLUTION" not in blocks
        and "raise NotImplementedError('merge_partials withheld')" in blocks
    )
    lab = nbformat.read(next((ROOT / "labs" / LAB02).glob("*_lab.ipynb")), as_version=4)
    text = "\n".join(c.source for c in release(LAB02).cells)
    assert "### BEGIN SOLUTION" not in text
    prompts = len(for_lab(LAB02))
    cells = release(LAB02).cells
    assert (
        sum(c.cell_type == "markdown" for c in cells)
        == sum(c.cell_type == "markdown" for c in lab.cells) + prompts
    )
    needs = [c for c in cells if c.cell_type == "code" and "# Runs your" in c.source]
    assert needs and all(not c.outputs for c in needs)


def _screened(code: str, exercise, fn: str):
    cell = nbformat.v4.new_code_cell(code, metadata={"paralab": {"edit": [fn]}})
    return screen(definition(statements([cell]), fn), exercise, fn)


@pytest.mark.parametrize(
    "name", ["merge_partials", "pack_heads", "ring_pass", "cfg_combine", "plan_rebalance"]
)
def test_the_screen_refuses_a_paste_and_lets_a_retyped_solution_run(name):
    exercise = EXERCISES[name]
    fn = exercise.target.rsplit(".", 1)[1]
    pasted = show_cell(exercise.target)[0].split("\n", 1)[1]
    first_argument = re.search(rf"def {fn}\(\s*(\w+)", pasted).group(1)
    retyped = re.sub(rf"\b{first_argument}\b", f"{first_argument}_in", pasted)
    assert _screened(retyped, exercise, fn) is None
    tiny = name == "cfg_combine"  # a one-line formula: everyone writes it alike
    screened = _screened(pasted, exercise, fn)
    assert (screened is None) if tiny else "verbatim copy" in screened


@pytest.mark.parametrize(
    "code, refused",
    [
        ("from torch import os\n", "imports `os` from `torch`"),
        ("import torch\n", "uses `.system`"),
        ("import torch\n", "uses `.open`"),
    ],
)
def test_the_screen_sees_modules_and_calls_reached_through_attributes(code, refused):
    exercise = EXERCISES["cfg_combine"]
    call = {"uses `.system`": "torch.os.system('x')", "uses `.open`": "torch.os.open('x', 0)"}
    body = call.get(refused, "os.getcwd()")
    source = code + f"def cfg_combine(c, u, s):\n    {body}\n    return u + s * (c - u)\n"
    assert refused in _screened(source, exercise, "cfg_combine")


def test_the_check_cell_applies_the_graders_rules_to_the_cell_alone(tmp_path, capsys, monkeypatch):
    cell = tmp_path / "student_cell.py"
    cell.write_text(
        "from torch import os\n\n\ndef cfg_combine(cond, uncond, scale):\n"
        "    os.getcwd()\n    return uncond + scale * (cond - uncond)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("student_cell")
    check("cfg_combine", module.cfg_combine)
    printed = capsys.readouterr().out
    assert "cfg_combine: REFUSED — 0/1 points" in printed, printed
    assert "imports `os` from `torch`" in printed and "requires that it imports only" in printed
    helper = tmp_path / "student_helper.py"
    helper.write_text(
        "def cfg_combine(cond, uncond, scale):\n    return mix(cond, uncond, scale)\n\n\n"
        "def mix(c, u, s):\n    return u + s * (c - u)\n"
    )
    check("cfg_combine", importlib.import_module("student_helper").cfg_combine)
    assert "cfg_combine: PASS — 1/1 points" in capsys.readouterr().out

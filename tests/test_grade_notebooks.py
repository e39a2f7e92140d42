"""Grading handed-in notebooks: nothing a notebook prints, patches or declares can raise its score.

One batch of small submissions (two cheap labs, 02 and 04) through `python -m paralab.grade`, read
back from its JSON: every known cheat scores 0 on the exercise it targets, a solved exercise
scores full, an untouched release scores 0, a half-solved one exactly its points, a hanging notebook
a row of zeros within the timeout.
"""

import csv
import json
import re
import time

import nbformat
import pytest

from paralab.exercises import EXERCISES, for_lab
from paralab.grade.__main__ import main
from paralab.grade.submission import definition, screen, statements
from paralab.notebooks import ROOT, show_cell
from paralab.release import student_notebook
from paralab.stubs import stub_package

LAB02, LAB04 = "02_cp_ring_vs_ulysses", "04_vae_lb"
HANG_TIMEOUT_S = 15


def _notebook(path, *cells):
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(
        nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]), path
    )


def _retyped(spec: str, argument: str) -> str:
    """The package's solution as a student who re-typed it would hand it in: its imports, its own argument name."""
    code = show_cell(spec)[0].split("\n", 1)[1]
    return re.sub(rf"\b{argument}\b", f"{argument}_in", code)


def _untouched(lab: str) -> list[str]:
    """The cells of the student release that hold the lab's stubs, as handed out."""
    source = next((ROOT / "labs" / lab).glob("*_lab.ipynb"))
    release = student_notebook(nbformat.read(source, as_version=4), lab)
    return [
        c.source
        for c in release.cells
        if c.cell_type == "code" and "raise NotImplementedError(" in c.source
    ]


CHEATS_02 = [
    # merge_partials: stub left, a fake report printed, the grader patched, check redefined, the cases emptied
    "from paralab.cp.blocks import attention_block\n\n"
    "def merge_partials(out, lse, block_out, block_lse):\n    raise NotImplementedError\n",
    "print('merge_partials: PASS — 2/2 points')\nprint('total 9/9')",
    "import paralab.grade\nparalab.grade.grade = lambda *a, **k: None\n\ndef check(name, fn):\n"
    "    print(f'{name}: PASS — 3/3 points')\n",
    "from paralab.exercises import EXERCISES\nfor e in EXERCISES.values():\n    e.world_sizes = ()\n",
    # pack_heads: the package's own, imported
    "from paralab.cp.ulysses import pack_heads",
    # ring_pass: the package's own, called through its module
    "import paralab.cp.ring as ring_module\n\ndef ring_pass(t, group, tag):\n"
    "    return ring_module.ring_pass(t, group, tag)\n",
]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("submissions")
    paster = show_cell(EXERCISES["pack_seq"].target)[0].split("\n", 1)[
        1
    ]  # pasted from the lab notebook
    _notebook(root / "cheater" / "cp_ring_vs_ulysses_lab.ipynb", *CHEATS_02, paster)
    solved_two = [
        _retyped(EXERCISES["normalize_pixels"].target, "video"),
        _retyped(EXERCISES["plan_rebalance"].target, "costs"),
    ]
    stub_cells = _untouched(LAB04)
    _notebook(root / "half" / "vae_lb_lab.ipynb", *stub_cells, *solved_two)  # later definitions win
    _notebook(root / "untouched" / "vae_lb_lab.ipynb", *stub_cells)
    _notebook(root / "sleeper" / "vae_lb_lab.ipynb", "import time\ntime.sleep(600)", *solved_two)
    start = time.monotonic()
    code = main(
        [str(p) for p in sorted(root.glob("*/*.ipynb"))]
        + [
            "--timeout",
            str(HANG_TIMEOUT_S),
            "--seed",
            "5",
            "--json",
            str(root / "scores.json"),
            "--csv",
            str(root / "scores.csv"),
        ]
    )
    rows = json.loads((root / "scores.json").read_text())
    return code, {(r["student"], r["exercise"]): r for r in rows}, root, time.monotonic() - start


def test_every_cheat_scores_zero_with_its_reason(graded):
    code, rows, _, _ = graded
    assert code == 1
    expected = {
        "merge_partials": ("not implemented yet", "hint"),
        "pack_heads": ("REFUSED", "imports paralab's own `pack_heads`"),
        "pack_seq": ("REFUSED", "verbatim copy of paralab's solution"),
        "unpack_heads": ("MISSING", "no definition of `unpack_heads`"),
        "ring_pass": ("REFUSED", "uses paralab's own `ring_pass`"),
    }
    for exercise, (verdict, reason) in expected.items():
        row = rows[("cheater", exercise)]
        assert (row["points"], row["verdict"]) == (0, verdict), row
        assert reason in row["reason"], row
    assert rows[("cheater", "TOTAL")]["points"] == 0


def test_solved_exercises_score_full_and_a_half_solved_lab_exactly_their_points(graded):
    _, rows, _, _ = graded
    points = {e.name: e.points for e in for_lab(LAB04)}
    assert rows[("half", "normalize_pixels")]["points"] == points["normalize_pixels"]
    assert rows[("half", "plan_rebalance")]["points"] == points["plan_rebalance"]
    assert rows[("half", "return_latents")]["verdict"] == "not implemented yet"
    assert (
        rows[("half", "TOTAL")]["points"] == points["normalize_pixels"] + points["plan_rebalance"]
    )
    assert rows[("untouched", "TOTAL")]["points"] == 0
    assert {rows[("untouched", e)]["verdict"] for e in points} == {"not implemented yet"}


def test_a_hanging_notebook_gets_a_row_of_zeros_with_the_reason_and_the_batch_goes_on(graded):
    _, rows, root, _ = graded
    for exercise in (e.name for e in for_lab(LAB04)):
        row = rows[("sleeper", exercise)]
        assert (
            row["points"] == 0 and f"did not finish within {HANG_TIMEOUT_S} s" in row["reason"]
        ), row
    assert rows[("untouched", "TOTAL")]["max_points"] == sum(
        e.points for e in for_lab(LAB04)
    )  # graded after it
    feedback = (root / "sleeper" / "vae_lb_lab.feedback.txt").read_text()
    assert "hangs: cell 1" in feedback


def test_csv_has_one_row_per_student_and_exercise_plus_totals(graded):
    _, rows, root, _ = graded
    with (root / "scores.csv").open() as f:
        table = list(csv.DictReader(f))
    n02 = len(for_lab(LAB02))
    assert (
        len(table) == len(rows) == (n02 + 1) + 3 * (3 + 1)
    )  # lab 02's exercises + total; 3 lab-04 notebooks
    assert all(r["student"] in {"cheater", "half", "untouched", "sleeper"} for r in table)


def test_the_grading_copy_and_the_release_hold_no_solution(tmp_path):
    package = stub_package(tmp_path / "paralab", lambda fn: f"{fn} withheld")
    blocks = (package / "cp" / "blocks.py").read_text()
    assert (
        "### BEGIN SOLUTION" not in blocks
        and "raise NotImplementedError('merge_partials withheld')" in blocks
    )
    lab = nbformat.read(next((ROOT / "labs" / LAB02).glob("*_lab.ipynb")), as_version=4)
    release = student_notebook(lab, LAB02)
    text = "\n".join(c.source for c in release.cells)
    assert "### BEGIN SOLUTION" not in text
    assert "logaddexp" not in "\n".join(
        c.source for c in release.cells if "def merge_partials" in c.source
    )
    prompts = len(for_lab(LAB02))
    assert (
        sum(c.cell_type == "markdown" for c in release.cells)
        == sum(c.cell_type == "markdown" for c in lab.cells) + prompts
    )
    for exercise in for_lab(LAB02):
        fn = exercise.target.rsplit(".", 1)[1]
        at = next(i for i, c in enumerate(release.cells) if f"def {fn}(" in c.source)
        checks = [c.source for c in release.cells[at + 1 : at + 1 + prompts]]
        assert any(f'check("{exercise.name}", {fn})' in c for c in checks), checks
    needs = [c for c in release.cells if c.cell_type == "code" and "# Runs your" in c.source]
    assert needs and all(not c.outputs for c in needs)
    kept = [
        c
        for c in release.cells
        if c.cell_type == "code"
        and any(o.get("data", {}).get("image/png") for o in c.get("outputs", []))
    ]
    assert kept, "pictures that do not depend on a student's function are kept"


@pytest.mark.parametrize(
    "name", ["merge_partials", "pack_heads", "ring_pass", "cfg_combine", "plan_rebalance"]
)
def test_the_screen_refuses_a_paste_and_lets_a_retyped_solution_run(name):
    exercise = EXERCISES[name]
    fn = exercise.target.rsplit(".", 1)[1]
    pasted = show_cell(exercise.target)[0].split("\n", 1)[1]
    first_argument = re.search(rf"def {fn}\(\s*(\w+)", pasted).group(1)
    retyped = re.sub(rf"\b{first_argument}\b", f"{first_argument}_in", pasted)

    def screened(code):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
        return screen(definition(statements(nb), fn), exercise, fn)

    assert screened(retyped) is None
    tiny = (
        name == "cfg_combine"
    )  # a one-line formula: everyone writes it alike, so equal is no proof
    assert (screened(pasted) is None) if tiny else "verbatim copy" in screened(pasted)

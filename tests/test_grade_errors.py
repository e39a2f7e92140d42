"""The grader's errors name what went wrong and where: the cell and line of a syntax error, the
path of a missing notebook, the flag to pass when a file name names no lab, the student's cell in
a traceback raised on a rank, the memory cap a submission ran out of."""

import json
import os

import nbformat
import pytest

from paralab.exercises import EXERCISES
from paralab.grade import sandbox
from paralab.grade import submission as grading
from paralab.grade.__main__ import main
from paralab.grade.submission import Submission, _run_job, grade_submission


def _distributed_exercise():
    return next(e for e in EXERCISES.values() if any(e.world_sizes))


def _function(exercise) -> str:
    return exercise.target.rsplit(".", 1)[1]


def _answer_cell(source: str, function: str) -> dict:
    return {"cell_type": "code", "source": source, "metadata": {"paralab": {"edit": [function]}}}


def test_a_cell_that_does_not_parse_is_graded_as_its_syntax_error(tmp_path):
    exercise = _distributed_exercise()
    name = _function(exercise)
    cells = [
        {"cell_type": "markdown", "source": "# lab", "metadata": {}},
        _answer_cell(f"import torch\n\ndef {name}(x:\n    return x\n", name),
    ]
    sub = Submission(tmp_path / "x_lab.ipynb", "student", exercise.lab, cells)
    graded = grade_submission(sub, seed=1, budget_s=60, pristine=tmp_path)
    row = next(r for r in graded.rows if r.exercise == exercise.name)
    assert row.verdict == "ERROR" and row.points == 0
    assert "syntax error in cell 2, line 3" in row.reason, row.reason
    assert "MISSING" not in row.reason and "no definition" not in row.reason


def test_a_missing_notebook_is_named_and_nothing_is_created(tmp_path, capsys):
    missing = tmp_path / "absent" / "cp_ring_vs_ulysses_lab.ipynb"
    with pytest.raises(SystemExit) as stopped:
        main([str(missing), "--seed", "1"])
    assert stopped.value.code == 2
    assert f"no such notebook: {missing}" in capsys.readouterr().err
    assert not missing.parent.exists()


def test_a_file_name_that_names_no_lab_asks_for_lab(tmp_path, capsys):
    handed_in = tmp_path / "homework.ipynb"
    nbformat.write(nbformat.v4.new_notebook(), handed_in)
    with pytest.raises(SystemExit) as stopped:
        main([str(handed_in), "--seed", "1"])
    out, err = capsys.readouterr()
    assert stopped.value.code == 2
    assert f"cannot tell the lab of {handed_in}" in err and "pass --lab" in err
    assert "total" not in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["homework.ipynb"]


def test_a_traceback_raised_on_a_rank_names_the_students_cell():
    exercise = _distributed_exercise()
    name = _function(exercise)
    world = next(w for w in exercise.world_sizes if w > 1)
    source = (
        "import torch.distributed as dist\n"
        f"def {name}(*args):\n"
        "    if dist.get_rank() == 1:\n"
        "        raise ValueError('my index is off')\n"
        "    return None\n"
    )
    job = {
        "exercise": exercise.name,
        "module": EXERCISES.module_of(exercise.name),
        "function": name,
        "statements": [[4, 1, source]],
        "plan": [(world, False)],
        "case_seed": 0,
    }
    (result,) = _run_job(job)["worlds"]
    assert result["actual"] is not None, result["failure"]
    ok, text = result["actual"][1][0]
    assert not ok and "ValueError: my index is off" in text
    assert 'File "<cell 4>", line 4' in text, text
    assert "<dynamic-code>" not in text


ALLOCATES = """import torch

def merge_partials(out, lse, block_out, block_lse):
    # 1.5 GiB of address space, which is what the cap (RLIMIT_AS) counts; never written, so
    # each of the many calls costs no page faults
    held = torch.empty(3 << 29, dtype=torch.uint8)
    new_lse = torch.logaddexp(lse, block_lse)
    keep, add = torch.exp(lse - new_lse), torch.exp(block_lse - new_lse)
    return out * keep.unsqueeze(-1) + block_out * add.unsqueeze(-1) + 0 * held.numel(), new_lse
"""


def test_memory_sets_each_processs_cap_and_the_feedback_names_it(tmp_path):
    """The same honest answer, holding 1.5 GiB: under --memory 1G it fails and says what the cap
    was and which flag sets it; under --memory 4G it scores its points."""
    from test_grade_notebooks import LAB02, hand_in, notebook_name, release

    nb = release(LAB02)
    nb.cells.append(
        nbformat.v4.new_code_cell(ALLOCATES, metadata={"paralab": {"edit": ["merge_partials"]}})
    )
    path = hand_in(tmp_path / "student" / notebook_name(LAB02), nb)
    rows = {}
    for memory in ("1G", "4G"):
        scores = tmp_path / f"scores-{memory}.json"
        main([str(path), "--seed", "3", "--memory", memory, "--json", str(scores)])
        rows[memory] = next(
            r for r in json.loads(scores.read_text()) if r["exercise"] == "merge_partials"
        )
    assert rows["1G"]["points"] == 0 and rows["1G"]["verdict"] == "ERROR", rows["1G"]
    assert "may use 1 GiB: the grader's --memory" in rows["1G"]["reason"], rows["1G"]
    points = EXERCISES["merge_partials"].points
    assert (rows["4G"]["points"], rows["4G"]["verdict"]) == (points, "PASS"), rows["4G"]


@pytest.mark.parametrize(
    "memory, says", [("lots", "is not a size"), ("512M", "is below 1 GiB"), ("0", "is below")]
)
def test_a_memory_the_grader_cannot_use_is_refused_naming_it(tmp_path, capsys, memory, says):
    handed_in = tmp_path / "cp_ring_vs_ulysses_lab.ipynb"
    nbformat.write(nbformat.v4.new_notebook(), handed_in)
    with pytest.raises(SystemExit) as stopped:
        main([str(handed_in), "--seed", "1", "--memory", memory])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --memory: {memory!r} {says}" in err, err


def test_the_instructors_readme_states_the_default_memory_cap():
    from pathlib import Path

    from paralab.grade.sandbox import MEMORY_BYTES

    readme = (Path(__file__).resolve().parents[1] / "labs" / "README.md").read_text()
    assert f"`--memory`, {MEMORY_BYTES >> 30}G unless you say" in " ".join(readme.split())


@pytest.mark.skipif(sandbox.bwrap() is None, reason="bubblewrap is not available here: no zygote")
def test_a_zygote_that_cannot_start_gives_its_cause_not_a_hang():
    with sandbox.Zygote() as zygote:
        (zygote.root / "zygote.py").unlink()
        package = zygote.root / "submission" / "src"
        package.mkdir(parents=True)
        run = sandbox.run_sandboxed(package, "probe", b"", 60, zygote=zygote)
    assert run.returncode is None and not run.timed_out and run.seconds < 30, run
    assert "zygote.py" in run.output_tail, run.output_tail
    assert "never started" in grading._stopped(run, 60, sandbox.MEMORY_BYTES)[1]


def test_a_fork_of_the_grader_leaves_its_zygote_alone():
    """A process forked from the grader (a forkserver, a rank) holds a copy of the zygote: if it
    exits through `atexit`, it must not stop the grader's zygote or remove its folder."""
    zygote = sandbox.Zygote()
    child = os.fork()
    if child == 0:
        zygote.close()
        os._exit(0)
    os.waitpid(child, 0)
    assert zygote.root.is_dir(), "the fork removed the grader's zygote folder"
    zygote.close()
    assert not zygote.root.exists()

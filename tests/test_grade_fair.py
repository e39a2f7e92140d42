"""The grader is fair to honest code and honest about its own faults: it judges a name by what it
is bound to, withholds every package function that answers an exercise whole, runs wherever its
Python lives, says why a grading process died, blames itself when every submission dies the same
way, and lists what it grades when given no notebook."""

import functools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest
import torch
from test_grade_notebooks import LAB02, LAB04, hand_in, notebook_name, release

from paralab.exercises import EXERCISES
from paralab.grade import __main__ as cli
from paralab.grade import reference_world, sandbox
from paralab.grade import submission as grading
from paralab.grade.__main__ import main
from paralab.grade.code import cell_statements, definition, refusal
from paralab.grade.sandbox import SandboxRun

SANDBOXED = sandbox.bwrap() is not None
NO_SANDBOX = "bubblewrap is not available here"
HONEST_PLAN = """
def plan_rebalance(costs, max_iterations=None):
    load = {rank: float(sum(values)) for rank, values in costs.items()}
    todo = {rank: list(enumerate(map(float, values))) for rank, values in costs.items()}
    limit = sum(len(v) for v in costs.values()) if max_iterations is None else max_iterations
    moves = []
    while len(moves) < limit and len(load) >= 2:
        heavy, light = most_and_least_loaded(load)
        gap = load[heavy] - load[light]
        if gap <= 0 or not todo[heavy]:
            break
        index, cost = closest_fit(todo[heavy], gap)
        if not shrinks_gap(cost, gap):
            break
        todo[heavy].remove((index, cost))
        load[heavy] -= cost
        load[light] += cost
        moves.append(Move(heavy, light, index))
    return moves
"""


def _screened(body: str, exercise: str = "plan_rebalance"):
    """The grader's refusal of `def <target>(...)` with this body (None: it runs)."""
    name = EXERCISES[exercise].target.rsplit(".", 1)[1]
    source = f"import torch\n\n\ndef {name}(costs, max_iterations=None):\n" + textwrap.indent(
        textwrap.dedent(body), "    "
    )
    stmts = cell_statements(3, source)
    return refusal(definition(stmts, name), EXERCISES[exercise], name)


@pytest.mark.parametrize(
    "body",
    [
        "load = {r: sum(v) for r, v in costs.items()}\nreturn load",
        "exec_time = 1.0\ncompile_flags = {}\nreturn [exec_time, compile_flags]",
        "def inner(load, exec):\n    return load + exec\nreturn inner(1, 2)",
        "return [c.load for c in costs]",
        "class Stats:\n    load: float = 0.0\ns = Stats()\ns.load = 2.0\nreturn s.load",
        "compile = [1]\nreturn compile",
    ],
)
def test_a_local_named_like_a_forbidden_call_is_the_students_own_value(body):
    assert _screened(body) is None


@pytest.mark.parametrize(
    "body, named",
    [
        ("return load(costs)", "`load`"),
        ("return eval('costs')", "`eval`"),
        ("return torch.load('x')", "`.load`"),
        ("t = torch\nreturn t.load('x')", "`.load`"),
        ("f = open\nreturn f", "`open`"),
        ("return [load for _ in costs]", "`load`"),
        ("global load\nreturn load(costs)", "`load`"),
        ("return getattr(costs, 'x')", "`getattr`"),
        ("return torch.os.system('x')", "`.system`"),
        (
            "class A:\n    load = 1\n    def m(self):\n        return load('x')\nreturn A().m()",
            "`load`",
        ),
    ],
)
def test_a_name_bound_to_a_builtin_or_a_module_function_is_still_refused(body, named):
    refused = _screened(body)
    assert refused is not None and refused[0] == "REFUSED" and named in refused[1], refused


def _graded(tmp_path, lab, function, code, *extra):
    nb = release(lab)
    nb.cells.append(nbformat.v4.new_code_cell(code, metadata={"paralab": {"edit": [function]}}))
    path = hand_in(tmp_path / "student" / notebook_name(lab), nb)
    scores = tmp_path / "scores.json"
    code = main([str(path), "--seed", "3", "--budget", "120", "--json", str(scores), *extra])
    return code, {r["exercise"]: r for r in json.loads(scores.read_text())}


def test_an_honest_plan_with_a_local_named_load_earns_full_marks(tmp_path):
    _, rows = _graded(tmp_path, LAB04, "plan_rebalance", HONEST_PLAN)
    row = rows["plan_rebalance"]
    assert (row["points"], row["verdict"]) == (EXERCISES["plan_rebalance"].points, "PASS"), row


def test_a_private_helper_that_answers_the_exercise_is_withheld(tmp_path):
    """`paralab.collectives.ring._exchange` is one hop of the ring: `ring_pass` whole."""
    code = (
        "from paralab.collectives.ring import _exchange\n\n\n"
        "def ring_pass(t, group, tag):\n    return _exchange(t, group), []\n"
    )
    _, rows = _graded(tmp_path, LAB02, "ring_pass", code)
    row = rows["ring_pass"]
    assert (row["points"], row["verdict"]) == (0, "REFUSED"), row
    assert "_exchange is withheld" in row["reason"], row


def test_no_package_function_answers_an_in_process_exercise_in_the_graders_copy(tmp_path):
    """Every function of the package a submission runs against (solutions stubbed, `ALTERNATIVES`
    withheld), private ones included, called on each visible case of every in-process exercise:
    none gives the reference's answer. A new exercise is covered as soon as it is declared."""
    names = [e.name for e in EXERCISES.values() if e.world_sizes == (0,)]
    expected = {name: reference_world(EXERCISES[name], 0) for name in names}
    torch.save(expected, tmp_path / "expected.pt")
    package = cli.pristine_package(tmp_path / "src")  # the grader's (conftest: built once)
    for lab in sorted({EXERCISES[name].lab for name in names}):
        grading.withhold_alternatives(package, lab)
    scan = (
        "import json, sys, torch\n"
        "from paralab.grade.substitutes import answering\n"
        f"expected = torch.load({str(tmp_path / 'expected.pt')!r}, weights_only=False)\n"
        "print(json.dumps({n: answering(n, e, 0, 0) for n, e in expected.items()}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(package)}
    # Under the sandbox's own caps, as a submission would call them: uncapped, one call
    # (`forward_flops` given the string "selective" as its token count) filled a 3.9 GB string,
    # half of the scan's CPU; capped, it raises MemoryError at once, as it would for a student.
    done = subprocess.run(
        [sys.executable, "-c", scan],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        preexec_fn=functools.partial(sandbox._limits, sandbox.MEMORY_BYTES),
    )
    found = json.loads(done.stdout.splitlines()[-1])
    assert found.keys() == set(names)
    assert {n: f for n, f in found.items() if f} == {}, (
        "package functions answer these exercises whole: add them to "
        "paralab.grade.submission.ALTERNATIVES"
    )


def test_the_scan_finds_a_function_that_answers_an_exercise(monkeypatch):
    """The scan can fail: with the exercise's own function not excluded as its target, the scan
    reports it (called on a prefix of the case's arguments, as a student would)."""
    from paralab.grade.substitutes import answering

    exercise = EXERCISES["cfg_combine"]
    expected = reference_world(exercise, 0)
    assert "paralab.cfgp.sampling.cfg_combine" not in answering(exercise.name, expected, 0, 0)
    monkeypatch.setattr(exercise, "target", "paralab.cfgp.sampling.elsewhere")
    assert "paralab.cfgp.sampling.cfg_combine" in answering(exercise.name, expected, 0, 0)


@pytest.mark.skipif(not SANDBOXED, reason=NO_SANDBOX)
def test_the_sandbox_runs_a_python_whose_venv_lives_under_tmp(tmp_path_factory):
    venv = Path(tmp_path_factory.mktemp("venv", numbered=True)) / "v"
    if not str(venv).startswith("/tmp/"):
        venv = Path("/tmp") / f"paralab-venv-{os.getpid()}"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
        check=True,
    )
    site = next((venv / "lib").glob("python*/site-packages"))
    (site / "venv_mark.py").write_text("")  # only in the venv: visible only if it is bound
    package = tmp_path_factory.mktemp("package")
    (package / "probe.py").write_text(
        "import os, subprocess, sys, venv_mark\n"
        "again = subprocess.run([sys.executable, '-c', 'pass']).returncode\n"
        "os.write(int(sys.argv[-1]), f'{sys.prefix} {again}'.encode())\n"
    )
    # sandbox.py needs only the standard library: loaded from its file, not through `paralab`
    # (whose first import is torch's, 1 CPU-s this check does not need)
    check = (
        "import importlib.util, sys\nfrom pathlib import Path\n"
        f"spec = importlib.util.spec_from_file_location('sandbox', {sandbox.__file__!r})\n"
        "sandbox = sys.modules['sandbox'] = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(sandbox)\n"
        "print(sandbox.preflight())\n"
        f"run = sandbox.run_sandboxed(Path({str(package)!r}), 'probe', b'', 60)\n"
        "print(run.returncode, run.result.decode(), run.output_tail.strip()[-200:])\n"
        "import shutil\n"
        "with sandbox.Zygote() as zygote:  # a fork covers /tmp with its own: bound back too\n"
        f"    copy = shutil.copytree({str(package)!r}, zygote.root / 'copy')\n"
        "    run = sandbox.run_sandboxed(copy, 'probe', b'', 60, zygote=zygote)\n"
        "print(run.returncode, run.result.decode(), run.output_tail.strip()[-200:])\n"
    )
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", check], capture_output=True, text=True
    )
    ran = ["None", f"0 {venv} 0 ", f"0 {venv} 0 "]
    assert done.stdout.splitlines()[:3] == ran, done.stdout + done.stderr


def test_a_python_the_sandbox_would_hide_is_refused_up_front_in_one_line(monkeypatch):
    monkeypatch.setattr(sandbox, "_python_roots", lambda: ["/usr", "/tmp"])
    why = sandbox.unusable_python()
    assert why and "\n" not in why and "/tmp" in why and "elsewhere" in why
    monkeypatch.setattr(sandbox, "_python_roots", lambda: ["/usr", "/tmp/v", "/opt/py"])
    assert sandbox.unusable_python() is None


MISSING_WORKER = "paralab_no_such_worker"
"""A fault of the grader's own start: a worker module that does not exist. Outside the package, so
that the process dies at once, not after paralab's first import (torch's, 1 CPU-s)."""


def _feedback(tmp_path, who):
    return (tmp_path / who / f"{notebook_name(LAB02)[:-6]}.feedback.txt").read_text()


def test_a_process_that_dies_before_any_result_gives_its_cause(tmp_path, monkeypatch):
    from test_grade_notebooks import solve_in_place

    monkeypatch.setattr(grading, "WORKER", MISSING_WORKER)
    nb = solve_in_place(release(LAB02), EXERCISES["merge_partials"])
    path = hand_in(tmp_path / "alice" / notebook_name(LAB02), nb)
    main([str(path), "--seed", "1", "--budget", "60"])
    text = _feedback(tmp_path, "alice")
    assert "before this exercise's result" in text and "No module named" in text, text
    assert "GRADER ERROR" not in text, "one submission alone is not proof of the grader's fault"


def test_when_every_submission_dies_the_same_way_the_grader_blames_itself(
    tmp_path, monkeypatch, capsys
):
    from test_grade_notebooks import solve_in_place

    monkeypatch.setattr(grading, "WORKER", MISSING_WORKER)
    nb = solve_in_place(release(LAB02), EXERCISES["merge_partials"])
    paths = [hand_in(tmp_path / who / notebook_name(LAB02), nb) for who in ("alice", "bob")]
    code = main([str(p) for p in paths] + ["--seed", "1", "--budget", "60"])
    err = capsys.readouterr().err
    assert code == 2
    assert "GRADER ERROR: all 2 submissions stopped the same way" in err, err
    assert "not the students' work" in err and "No module named" in err, err
    assert "GRADER ERROR" in _feedback(tmp_path, "bob")


def test_a_cause_is_quoted_only_when_no_student_code_ran():
    def run(output):
        return SandboxRun(b"", output, 1, False, False, 1.0)

    assert "ImportError: x" in grading._cause(run("Traceback\nImportError: x\n"), began=False)
    after = grading._cause(run("SECRET tensor(1.)\n"), began=True)
    assert "SECRET" not in after and "not shown" in after


def test_a_student_who_kills_the_process_sees_no_output(tmp_path):
    """Once the student's code began, the process's output may hold hidden cases: not quoted."""
    code = (
        "import os\n\n\ndef merge_partials(out, lse, block_out, block_lse):\n"
        "    print('SECRET', out.shape)\n    os._exit(3)\n"
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(grading, "refusal", lambda *args: None)
        _, rows = _graded(tmp_path, LAB02, "merge_partials", code)
    reason = rows["merge_partials"]["reason"]
    assert "exit 3" in reason and "SECRET" not in reason and "not shown" in reason, reason


def test_without_notebooks_the_grader_lists_every_labs_exercises(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0].split()
    assert header[:4] == ["lab", "exercise", "target", "points"], header
    for exercise in EXERCISES.values():
        line = next(line for line in out.splitlines() if f" {exercise.name} " in line)
        assert line.startswith(exercise.lab) and exercise.target in line, line
        assert line.split()[-1] == str(len(exercise.bugs)), line
    labs = {e.lab for e in EXERCISES.values()}
    assert f"{len(EXERCISES)} exercises in {len(labs)} labs" in out


def test_the_help_still_works(capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["--help"])
    assert stopped.value.code == 0 and "--seed" in capsys.readouterr().out

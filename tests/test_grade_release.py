"""The hand-out a student gets is consistent with itself: READMEs written for students (no source
files, commands or chapters it lacks), only what it runs to install, and the grader's rules."""

import re

import pytest

from paralab.exercises import for_lab
from paralab.grade.code import RULE_LIST
from paralab.release import write_student

LAB = "04_vae_lb"


@pytest.fixture(scope="module")
def handout(tmp_path_factory):
    out = tmp_path_factory.mktemp("release") / "student"
    write_student(out, only=LAB)
    return out


def test_the_lab_readme_names_the_notebook_and_its_exercises_only(handout):
    folder = handout / "labs" / LAB
    readme = (folder / "README.md").read_text()
    notebook = next(folder.glob("*_lab.ipynb")).name
    assert f"`{notebook}`" in readme
    assert "_lab.py" not in readme and "_build_nb" not in readme and "pytest" not in readme
    for exercise in for_lab(LAB):
        assert f"`{exercise.target.rsplit('.', 1)[1]}`" in readme
    for target in re.findall(r"\]\(([^)#]+)", readme):  # every relative link resolves
        assert target.startswith("http") or (folder / target).exists(), target


def test_the_requirements_hold_only_what_the_handout_runs(handout):
    lines = [
        line.split("=")[0].split(">")[0].strip()
        for line in (handout / "requirements.txt").read_text().splitlines()
        if line and not line.startswith(("#", "--", "-e"))
    ]
    assert sorted(lines) == ["cloudpickle", "jupyterlab", "matplotlib", "numpy", "torch"]
    assert "download.pytorch.org/whl/cpu" in (handout / "requirements.txt").read_text()


def test_the_readme_says_what_the_grader_refuses(handout):
    readme = (handout / "README.md").read_text()
    assert "## What the grader refuses" in readme
    for rule in RULE_LIST:
        assert rule[1:] in readme, rule


def test_what_the_package_calls_is_read_again_when_a_file_changes(tmp_path, monkeypatch):
    """`package_needs` caches the parsed package; an edited file must not be answered from it."""
    from paralab import release

    package = tmp_path / "paralab"
    package.mkdir()
    helper = package / "helper.py"
    helper.write_text("def helper():\n    return 1\n")
    (package / "caller.py").write_text("def caller():\n    return helper()\n")
    monkeypatch.setattr(release, "PACKAGE", package)
    assert "caller" not in release.package_needs({"exercise"})
    helper.write_text("def helper():\n    return exercise()\n")
    assert release.package_needs({"exercise"})["caller"] == {"exercise"}

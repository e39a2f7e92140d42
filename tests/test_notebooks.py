"""The committed notebooks are built from today's sources and their outputs hold on any machine."""

import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(ROOT.glob("labs/*/*_lab.ipynb"))
FLOAT = re.compile(r"(?<![\w.])[-+]?(\d+)\.(\d+)(?:[eE][-+]?\d+)?")
MAX_SIGNIFICANT = 10


def load_build_nb():
    """`_build_nb.py` as a module: its `--check` runs in this process, not a fresh Python that
    imports torch again."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_build_nb", ROOT / "_build_nb.py")
    build_nb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_nb)
    return build_nb


def test_committed_notebooks_are_up_to_date(capsys):
    code = load_build_nb().main(["--check"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "up to date" in out


def _compared_texts(cell):
    """The text outputs nbval compares: streams, errors and text/* data (images are not compared)."""
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            yield out.text
        elif out.output_type == "error":
            yield "\n".join(out.get("traceback", []))
        else:
            yield from (v for k, v in out.get("data", {}).items() if k.startswith("text/"))


def long_floats(nb) -> list[str]:
    """Floats printed with more than MAX_SIGNIFICANT significant digits in compared outputs."""
    found = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or cell.source.lstrip().startswith("# NBVAL_IGNORE_OUTPUT"):
            continue
        for text in _compared_texts(cell):
            for match in FLOAT.finditer(text):
                digits = (match.group(1) + match.group(2)).lstrip("0")
                if len(digits) > MAX_SIGNIFICANT:
                    found.append(f"cell {index}: {match.group()}")
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.parent.name for p in NOTEBOOKS])
def test_compared_outputs_print_no_machine_dependent_digits(path):
    """A float's last digits differ between CPUs and BLAS kernels: print ~6 significant digits."""
    found = long_floats(nbformat.read(path, as_version=4))
    assert not found, (
        f"{path.name}: floats with more than {MAX_SIGNIFICANT} significant digits: {found[:5]}"
    )


def verdict_lines(nb) -> list[tuple[int, int]]:
    """Every `N/M passed` line the committed notebook printed: (N, M)."""
    from paralab.notebooks import CHECKS_LINE

    return [
        (int(passed), int(total))
        for cell in nb.cells
        if cell.cell_type == "code"
        for text in _compared_texts(cell)
        for passed, total in CHECKS_LINE.findall(text)
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.parent.name for p in NOTEBOOKS])
def test_every_committed_verdict_table_passes(path):
    """nbval compares a claim table with the committed one, so a failing claim rebuilt and
    committed would compare equal from then on: the committed tables must all pass."""
    lines = verdict_lines(nbformat.read(path, as_version=4))
    failing = [f"{p}/{t} passed" for p, t in lines if p != t]
    assert lines, f"{path.name}: no verdict table printed"
    assert not failing, f"{path.name}: committed with failing claims: {failing}"


def test_the_verdict_scan_sees_a_failing_table():
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(
                "print(table)",
                outputs=[nbformat.v4.new_output("stream", text="row  FAIL\n41/42 passed\n")],
            )
        ]
    )
    assert verdict_lines(nb) == [(41, 42)]


def test_the_float_check_sees_a_long_float_and_spares_ignored_cells():
    cell = nbformat.v4.new_code_cell(
        "print(x)", outputs=[nbformat.v4.new_output("stream", text="got 0.6323941312666288\n")]
    )
    ignored = nbformat.v4.new_code_cell("# NBVAL_IGNORE_OUTPUT\nprint(x)", outputs=cell.outputs)
    short = nbformat.v4.new_code_cell(
        "print(x)", outputs=[nbformat.v4.new_output("stream", text="got 0.632394, 1.1e-16\n")]
    )
    assert long_floats(nbformat.v4.new_notebook(cells=[cell])) == ["cell 0: 0.6323941312666288"]
    assert long_floats(nbformat.v4.new_notebook(cells=[ignored, short])) == []


def test_measure_counts_visible_code_verdict_rows_and_pictures():
    import torch

    from paralab.check import claim, compare, verdict_table
    from paralab.notebooks import measure, verdict_rows

    table = verdict_table(
        [claim("a", True, "x"), claim("b", True, "y")], "title"
    )  # a table of claims
    assert verdict_rows(verdict_table(compare(torch.zeros(2), torch.zeros(2)), "tensors")) == [1]
    shown = nbformat.v4.new_code_cell("# From src/paralab/x.py: ...\ndef f():\n    return 1")
    folded = nbformat.v4.new_code_cell(
        "\n".join(["x = 1"] * 50), metadata={"jupyter": {"source_hidden": True}}
    )
    ran = nbformat.v4.new_code_cell(
        "print(table)",
        outputs=[
            nbformat.v4.new_output("stream", name="stdout", text=table + "\n"),
            nbformat.v4.new_output(
                "display_data", data={"image/png": "", "text/plain": "<Figure>"}
            ),
        ],
    )
    detail = nbformat.v4.new_code_cell(
        "print(table)",
        metadata={"jupyter": {"outputs_hidden": True}},
        outputs=[nbformat.v4.new_output("stream", name="stdout", text=table)],
    )
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_markdown_cell("# t"), shown, folded, ran, detail]
    )
    m = measure(nb)
    assert (m.code_lines, m.package_lines, m.longest_cell) == (5, 3, 3)
    assert (m.check_rows, m.check_tables, m.folded_rows, m.pictures) == (4, 2, 2, 1)


@pytest.mark.parametrize(
    "corruption",
    ["", "{}", '{"cells": [{"cell_type": "code", "sou'],
    ids=["empty", "empty-object", "truncated"],
)
def test_check_names_a_corrupt_notebook_and_still_reports_every_other_lab(
    corruption, tmp_path, monkeypatch, capsys
):
    import shutil

    from paralab import notebooks

    labs = tmp_path / "labs"
    for lab in ("00_collectives_primer", "00_parallel_dims"):
        shutil.copytree(ROOT / "labs" / lab, labs / lab)
    broken = labs / "00_collectives_primer" / "collectives_primer_lab.ipynb"
    broken.write_text(corruption)
    monkeypatch.setattr(notebooks, "LABS", labs)
    assert load_build_nb().main(["--check"]) == 1
    lines = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert set(lines) == {"00_collectives_primer", "00_parallel_dims"}
    assert lines["00_collectives_primer"].startswith(f"stale: corrupt notebook {broken}")
    assert "corrupt" not in lines["00_parallel_dims"]


NBFORMAT_PROBE = """
import sys
from paralab.notebook_format import nbformat
import jsonschema
grammar_built = "rfc3987_syntax" in sys.modules or "iri" in jsonschema.FormatChecker.checkers
nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1")])
nbformat.validate(nb)
nb.cells[0]["cell_type"] = "bogus"
try:
    nbformat.validate(nb)
    caught = False
except nbformat.ValidationError:
    caught = True
import importlib.util
assert sys.modules.get("rfc3987_syntax", "absent") is not None, "still hidden after the import"
assert importlib.util.find_spec("rfc3987_syntax") is not None  # visible again (not built here)
print(grammar_built, caught)
"""


def test_nbformat_is_imported_without_the_iri_grammar_and_still_validates():
    """The grammar is skipped for nbformat's import alone; notebooks are still validated."""
    pytest.importorskip("rfc3987_syntax")
    done = subprocess.run(
        [sys.executable, "-c", NBFORMAT_PROBE], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"], done.stdout


def test_a_lab_is_named_by_its_folder_or_a_unique_start():
    from paralab.notebooks import lab_sources

    assert lab_sources("05") == lab_sources("05_training_composition")
    assert [p.parent.name for p in lab_sources("05")] == ["05_training_composition"]
    with pytest.raises(SystemExit, match="'00' names 2 labs: 00_collectives_primer, 00_parallel"):
        lab_sources("00")
    with pytest.raises(SystemExit, match="no lab named '99'"):
        lab_sources("99")


def test_the_machine_yardstick_times_a_loop_an_import_of_torch_and_a_fork():
    from paralab.notebooks import machine_yardstick

    line = machine_yardstick(additions=1_000_000, repeats=1)
    found = re.fullmatch(
        r"machine yardstick: 1,000,000 Python additions ([\d.]+) s of CPU, "
        r"`import torch` ([\d.]+) s, a fork of that process ([\d.]+) ms",
        line,
    )
    assert found, line
    assert 0 < float(found[1]) < 5 and 0 < float(found[2]) < 120, line
    assert 0 < float(found[3]) < 10_000, line

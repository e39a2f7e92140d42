"""A reader meets no visible code cell longer than the limit: plumbing is folded."""

import pytest

from paralab.notebook_format import nbformat
from paralab.notebooks import MAX_VISIBLE_CELL_LINES, lab_sources, measure, notebook_path


@pytest.mark.parametrize("source", lab_sources(), ids=lambda p: p.parent.name)
def test_no_visible_code_cell_is_longer_than_the_limit(source):
    nb = nbformat.read(notebook_path(source), as_version=4)
    assert measure(nb).longest_cell <= MAX_VISIBLE_CELL_LINES, (
        f"{source.parent.name}: a visible code cell of {measure(nb).longest_cell} lines; "
        f"fold its plumbing or split it (limit {MAX_VISIBLE_CELL_LINES}, "
        "`python _build_nb.py --measure`)"
    )


def test_the_limit_catches_a_long_visible_cell_and_not_a_folded_one():
    long = nbformat.v4.new_code_cell("\n".join(["x = 1"] * (MAX_VISIBLE_CELL_LINES + 1)))
    folded = nbformat.v4.new_code_cell(long.source, metadata={"jupyter": {"source_hidden": True}})
    assert measure(nbformat.v4.new_notebook(cells=[long])).longest_cell > MAX_VISIBLE_CELL_LINES
    assert measure(nbformat.v4.new_notebook(cells=[folded])).longest_cell == 0

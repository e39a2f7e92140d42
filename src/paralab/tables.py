"""One plain-text table for every report: verdicts, ledgers, scores, lab tables.

Fixed-width columns, a dashed rule under the header, no trailing spaces, so a
table prints the same on every machine and nbval can compare it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def text_table(
    header: Sequence[Any], rows: Iterable[Sequence[Any]], *, align_right: Sequence[int] = ()
) -> str:
    """Rows under a header, columns padded to their widest cell; `align_right` lists numeric columns."""
    cells = [[str(c) for c in header], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]

    def line(row: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in align_right else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths))
        ).rstrip()

    return "\n".join(
        [line(cells[0]), line(["-" * w for w in widths]), *(line(r) for r in cells[1:])]
    )

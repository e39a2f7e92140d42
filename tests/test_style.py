"""The code is ruff clean: lint and format, over the package, the tests, the tools and the lab sources.

The rule set and its reasons are in `pyproject.toml` (`[tool.ruff]`).
"""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ["src", "tests", "tools", "labs", "_build_nb.py", "conftest.py"]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    """ruff as requirements.txt pins it (a missing one fails the test, saying so)."""
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, *CHECKED], cwd=ROOT, capture_output=True, text=True
    )


def test_ruff_check_is_clean():
    result = _ruff("check", "--no-cache", "--output-format", "concise")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_leaves_every_file_as_it_is():
    result = _ruff("format", "--check", "--no-cache")
    assert result.returncode == 0, "run `ruff format` on:\n" + result.stdout + result.stderr


def test_code_cites_no_issue_numbers():
    """Code says why in its own words; an issue number means nothing to the next reader."""
    pattern = re.compile(r"\bissues? #?\d+|\(#\d+\)", re.IGNORECASE)
    hits = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for top in CHECKED
        for path in ([ROOT / top] if top.endswith(".py") else sorted((ROOT / top).rglob("*.py")))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not hits, "\n".join(hits)

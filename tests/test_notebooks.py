"""The committed notebooks are built from today's sources (nbval then re-runs them)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_committed_notebooks_are_up_to_date():
    done = subprocess.run([sys.executable, "_build_nb.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "up to date" in done.stdout

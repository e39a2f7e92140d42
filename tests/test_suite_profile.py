"""`tools/suite_profile.py` names where the CPU went: a forked child counts as its parent's ranks."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "suite_profile.py"
BURN_AND_FORK = """
import os, time
def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
burn(0.3)
child = os.fork()
if child == 0:
    burn(0.6)
    os._exit(0)
os.waitpid(child, 0)
"""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="the census reads Linux's /proc")
def test_the_census_names_a_forked_child_after_its_parent():
    spec = importlib.util.spec_from_file_location("suite_profile", TOOL)
    tool = sys.modules["suite_profile"] = importlib.util.module_from_spec(spec)  # for dataclass
    spec.loader.exec_module(tool)
    job = subprocess.Popen([sys.executable, "-c", BURN_AND_FORK])
    with tool.Census(job.pid, period_s=0.02) as census:
        job.wait()
    roles = census.by_role()
    assert roles["other subprocesses"][1] >= 0.2, roles
    assert roles["ranks and forkservers of other subprocesses"][1] >= 0.4, roles
    assert roles["ranks and forkservers of other subprocesses"][0] == 1, roles

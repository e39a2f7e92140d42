"""Test order: the slowest files first, so that the xdist workers (`--dist loadfile`) end
together instead of one waiting out a long file that happened to come last.

The list is measured (`python -m pytest --durations=0`, summed per file; slowest first). A file
that is not on it keeps its place after them. Order only: every file still runs whole. It holds
only with `--no-loadscope-reorder` (pyproject.toml): by default xdist re-sorts the files by their
number of tests, and a notebook's cells outnumber most files' tests.

Figures a test records with `record_property` (the warm launch's median) are printed at the end
of the run: an xdist worker's own prints never reach the terminal.
"""

import os
import sys

# Where PYTHONDONTWRITEBYTECODE is set (as on the machines this suite was timed on), every
# process of the suite compiled the package and pytest rewrote every test module from source
# again: the three workers, each notebook kernel, each grader subprocess (~4 CPU-s a pytest
# worker). The suite writes its bytecode (ignored by git), and its children inherit that.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# Every notebook kernel nbval starts runs its lab's single-process references with one intra-op
# thread, as the ranks do (launch.py). With torch's default (one thread per core), a kernel's
# OpenMP threads fight the other workers' processes for the 2 cores: lab 09 under the suite's
# load took 139.8 s with the default and 23.9 s with one thread (`_build_nb.py --profile`;
# yardstick under that load: 5 M additions 0.14 / 0.16 s, `import torch` 2.05 / 2.96 s).
# notebooks._kernel_env does the same for the main command's kernels.
os.environ["OMP_NUM_THREADS"] = "1"

# nbval compares the notebooks' text outputs, never their PNGs: the kernels draw each picture
# (a picture that cannot be drawn still fails its cell) but do not encode it
# (paralab.viz.common.PICTURES_AS_TEXT, 10 CPU-s of the suite).
os.environ["PARALAB_PICTURES_AS_TEXT"] = "1"

SLOWEST_FIRST = (
    "tests/test_grade_notebooks.py",
    "tests/test_grade_attacks.py",
    "tests/test_launch.py",
    "tests/test_site.py",
    "labs/05_training_composition/training_composition_lab.ipynb",
    "labs/07_tensor_parallel/tensor_parallel_lab.ipynb",
    "labs/08_pipeline_parallel/pipeline_parallel_lab.ipynb",
    "labs/10_four_d_composition/four_d_composition_lab.ipynb",
    "labs/01_fsdp_hsdp/fsdp_hsdp_lab.ipynb",
    "labs/09_expert_parallel/expert_parallel_lab.ipynb",
    "labs/06_inference_pipeline/inference_pipeline_lab.ipynb",
    "tests/test_grade_fair.py",
    "tests/test_plan_published.py",
    "tests/test_compose_runs.py",
    "tests/test_train.py",
)


def pytest_collection_modifyitems(config, items):
    place = {path: i for i, path in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: place.get(item.nodeid.split("::", 1)[0], len(place)))


_FIGURES: list[tuple[str, str, object]] = []


def pytest_runtest_logreport(report):
    if report.when == "call":
        _FIGURES.extend((report.nodeid, name, value) for name, value in report.user_properties)


def pytest_terminal_summary(terminalreporter):
    if _FIGURES:
        terminalreporter.section("figures")
        for nodeid, name, value in _FIGURES:
            terminalreporter.write_line(f"{name}: {value}  ({nodeid})")


def pytest_sessionfinish(session, exitstatus):
    """xdist's workers leave through `os._exit`, past `atexit`: stop the grader's shared zygote
    here, or its folder outlives the worker (the zygote itself dies with it)."""
    sandbox = sys.modules.get("paralab.grade.sandbox")
    if sandbox is not None and sandbox.shared_zygote.cache_info().currsize:
        sandbox.shared_zygote().close()

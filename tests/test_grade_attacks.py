"""Every attack class of the classroom grader, in one batch: each scores below full marks, hurts
no classmate, and crashes nothing.

The attacks run with the code screen turned off, so what stops them is the sandbox, the grader's
plan of cases and its own comparison, not a list of names. The attacks that only a real sandbox
can stop (reading or writing outside the submission's copy, a detached process, killing the
grader) run only where bubblewrap works; elsewhere those tests skip and say why.
"""

import json
import os
import signal
import time
from pathlib import Path

import nbformat
import pytest
from test_grade_notebooks import LAB02, hand_in, notebook_name, release

import paralab
from paralab.exercises import EXERCISES
from paralab.grade import sandbox
from paralab.grade import submission as grading
from paralab.grade.__main__ import main
from paralab.grade.code import untouched

SEED = 918273645
BUDGET_S = 20
SANDBOXED = sandbox.bwrap() is not None
NO_SANDBOX = "bubblewrap is not available here: the grader says what it does not isolate"
MERGE = """
def merge_partials(out, lse, block_out, block_lse):
    new_lse = torch.logaddexp(lse, block_lse)
    keep, add = torch.exp(lse - new_lse), torch.exp(block_lse - new_lse)
    return out * keep.unsqueeze(-1) + block_out * add.unsqueeze(-1), new_lse
"""
HEAD = "import torch\n"
FORGE = """
import io, os, struct, sys
FD = int(sys.argv[sys.argv.index("--result-fd") + 1])
def forge(frame):
    buffer = io.BytesIO()
    torch.save(frame, buffer)
    os.write(FD, struct.pack(">Q", len(buffer.getvalue())) + buffer.getvalue())
    os._exit(0)
"""
ATTACKS = {
    # forged results: an empty case list, the visible worlds only, a short case list
    "forged-empty": FORGE
    + 'GUARD = forge({"exercise": "merge_partials", "worlds": []})\n'
    + "def merge_partials(out, lse, block_out, block_lse):\n    return GUARD\n",
    "forged-visible-only": FORGE
    + 'GUARD = forge({"exercise": "merge_partials", "worlds": [{"world": 0, "hidden": False,'
    + ' "actual": [[]], "failure": "", "verdict": ""}]})\n'
    + "def merge_partials(out, lse, block_out, block_lse):\n    return GUARD\n",
    # right on the shipped visible cases only (a lookup of the reference outputs), trivial answers
    "lookup": MERGE.replace("def merge_partials", "def right")
    + "from paralab.exercises.lab02 import _merge_cases\nVISIBLE = _merge_cases(0, 0)\n"
    + "def merge_partials(out, lse, block_out, block_lse):\n"
    + "    if any(c[0].shape == out.shape and torch.equal(c[0], out) for c in VISIBLE):\n"
    + "        return right(out, lse, block_out, block_lse)\n    return out, lse\n",
    "trivial": "def merge_partials(out, lse, block_out, block_lse):\n    return out, lse\n",
    # results the grader must compare safely or refuse
    "sparse": MERGE.replace("def merge_partials", "def right")
    + "def merge_partials(*args):\n    out, lse = right(*args)\n    return out.to_sparse(), lse\n",
    "subclass": MERGE.replace("def merge_partials", "def right")
    + "class Sneaky(torch.Tensor):\n    pass\n"
    + "def merge_partials(*args):\n    out, lse = right(*args)\n"
    + "    return out.as_subclass(Sneaky), lse\n",
    "float32": MERGE.replace("def merge_partials", "def right")
    + "def merge_partials(*args):\n    out, lse = right(*args)\n    return out.float(), lse\n",
    "long-expression": "def merge_partials(out, lse, block_out, block_lse):\n"
    + f"    x = {' + '.join(['1'] * 10_000)}\n    return out, lse\n",
    # the hidden cases' data in an exception message
    "leak": MERGE.replace("def merge_partials", "def right")
    + "from paralab.exercises.lab02 import _merge_cases\nVISIBLE = _merge_cases(0, 0)\n"
    + "def merge_partials(out, lse, block_out, block_lse):\n"
    + "    if all(c[0].shape != out.shape for c in VISIBLE):\n"
    + "        raise ValueError(f'LEAKED {out!r}')\n    return right(out, lse, block_out, block_lse)\n",
    # time, memory and output
    "stacked-sleeps": "import time\n"
    + "".join(f"S{i} = time.sleep(8)\n" for i in range(4))
    + MERGE.replace("return out", "_ = (S0, S1, S2, S3)\n    return out"),
    "memory": "def merge_partials(out, lse, block_out, block_lse):\n"
    + "    big = torch.ones(4 << 30, dtype=torch.uint8)\n    return out + big[0], lse\n",
    "output": "def merge_partials(out, lse, block_out, block_lse):\n"
    + "    print('x' * (200 << 20))\n    return out, lse\n",
}
SANDBOX_ATTACKS = {
    # the instructor's real source, read and run in place of the student's own logic
    "reads-solution": "SOURCE = '{blocks}'\n"
    + "def merge_partials(out, lse, block_out, block_lse):\n"
    + "    space = {{}}\n    exec(open(SOURCE).read(), space)\n"
    + "    return space['merge_partials'](out, lse, block_out, block_lse)\n",
    # its own package copy, the instructor's files, a classmate's submission
    "rewrites-package": "import paralab.cp.blocks as blocks\n"
    + "GUARD = open(blocks.__file__, 'a').write('\\nmerge_partials = lambda *a: a[:2]\\n')\n"
    + "def merge_partials(out, lse, block_out, block_lse):\n    return GUARD\n",
    "rewrites-instructor": "GUARD = open('{decoy}', 'w').write('changed')\n"
    + "def merge_partials(out, lse, block_out, block_lse):\n    return GUARD\n",
    "overwrites-classmate": "GUARD = open('{classmate}', 'w').write('{{}}')\n"
    + "def merge_partials(out, lse, block_out, block_lse):\n    return GUARD\n",
    # a detached process that rewrites the scores after the grader is done, a killed grader
    "detached": "import subprocess, sys\n"
    + "GUARD = subprocess.Popen([sys.executable, '-c', \"import time; time.sleep(3); "
    + "open('{scores}', 'w').write('forged')\"], start_new_session=True)\n"
    + "def merge_partials(out, lse, block_out, block_lse):\n    return GUARD\n",
    "kills-grader": "import os, signal\n"
    + "GUARD = [os.kill(pid, signal.SIGKILL) for pid in (os.getppid(), -1)]\n"
    + "def merge_partials(out, lse, block_out, block_lse):\n    return GUARD\n",
}
CLASSMATE = "zz-classmate"


def _with_answer(code: str) -> nbformat.NotebookNode:
    """The lab 02 release with `merge_partials` answered by `code`, in a cell marked for answers."""
    nb = release(LAB02)
    nb.cells.append(
        nbformat.v4.new_code_cell(code, metadata={"paralab": {"edit": ["merge_partials"]}})
    )
    return nb


def _unscreened(found, exercise, name, unparsed=()):
    """The grader with its courtesy screen off: only a missing or untouched answer is not run."""
    if found is None:
        return "MISSING", f"no definition of `{name}`"
    return ("not implemented yet", "stub") if untouched(found, exercise, name) else None


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    root = tmp_path_factory.mktemp("attacks")
    name = notebook_name(LAB02)
    classmate = root / CLASSMATE / name
    places = {
        "blocks": str(Path(paralab.__file__).parent / "cp" / "blocks.py"),
        "decoy": str(root / "instructor" / "blocks.py"),
        "classmate": str(classmate),
        "scores": str(root / "scores.json"),
    }
    (root / "instructor").mkdir()
    Path(places["decoy"]).write_text("original")
    attacks = dict(ATTACKS)
    if SANDBOXED:
        attacks |= {k: v.format(**places) for k, v in SANDBOX_ATTACKS.items()}
    paths = [hand_in(root / who / name, _with_answer(HEAD + code)) for who, code in attacks.items()]
    hand_in(classmate, _with_answer(HEAD + MERGE))
    jobs = []
    real_run = grading.run_sandboxed

    def recording(package, module, job, *limits):
        jobs.append(job)
        return real_run(package, module, job, *limits)

    started = time.monotonic()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(grading, "refusal", _unscreened)
        patch.setattr(grading, "run_sandboxed", recording)
        code = main(
            [str(p) for p in paths]
            + [str(classmate), "--seed", str(SEED), "--budget", str(BUDGET_S)]
            + ["--json", places["scores"]]
        )
    seconds = time.monotonic() - started
    time.sleep(5 if SANDBOXED else 0)  # a detached process would have rewritten the scores by now
    rows = json.loads(Path(places["scores"]).read_text())
    return {
        "code": code,
        "rows": {(r["student"], r["exercise"]): r for r in rows},
        "root": root,
        "places": places,
        "attacks": attacks,
        "jobs": jobs,
        "seconds": seconds,
    }


def _row(batch, who):
    return batch["rows"][(who, "merge_partials")]


def _feedback(batch, who):
    return (batch["root"] / who / f"{notebook_name(LAB02)[:-6]}.feedback.txt").read_text()


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_each_attack_scores_zero_without_crashing_the_batch(batch, attack):
    row = _row(batch, attack)
    assert row["points"] == 0, row
    assert batch["rows"][(attack, "TOTAL")]["points"] == 0


@pytest.mark.skipif(not SANDBOXED, reason=NO_SANDBOX)
@pytest.mark.parametrize("attack", sorted(SANDBOX_ATTACKS))
def test_each_attack_on_the_machine_scores_zero(batch, attack):
    assert _row(batch, attack)["points"] == 0, _row(batch, attack)


def test_the_classmate_graded_after_every_attack_gets_full_marks(batch):
    row = _row(batch, CLASSMATE)
    assert (row["points"], row["verdict"]) == (EXERCISES["merge_partials"].points, "PASS"), row
    students = {who for who, _ in batch["rows"]}
    assert students == set(batch["attacks"]) | {CLASSMATE}, "every submission has its rows"


@pytest.mark.skipif(not SANDBOXED, reason=NO_SANDBOX)
def test_nothing_outside_the_sandbox_changed(batch):
    places = batch["places"]
    assert Path(places["decoy"]).read_text() == "original"
    assert "merge_partials = lambda" not in Path(places["blocks"]).read_text()
    assert nbformat.read(places["classmate"], as_version=4).cells, "the classmate's file is intact"
    rows = json.loads(Path(places["scores"]).read_text())  # no detached process rewrote it
    assert any(r["student"] == CLASSMATE for r in rows)


def test_forged_and_odd_results_are_refused_with_a_reason(batch):
    for attack in ("forged-empty", "forged-visible-only"):
        assert "grader's plan" in _row(batch, attack)["reason"], _row(batch, attack)
    assert "wrong form" in _row(batch, "sparse")["reason"], _row(batch, "sparse")
    assert "does not load" in _row(batch, "subclass")["reason"], _row(batch, "subclass")
    assert (
        "differs" in _row(batch, "float32")["reason"] or "dtype" in _row(batch, "float32")["reason"]
    )


def test_visible_reference_outputs_earn_nothing_without_the_hidden_cases(batch):
    row = _row(batch, "lookup")
    assert row["points"] == 0 and row["verdict"] == "FAIL", row


def test_feedback_names_a_hidden_case_never_its_data(batch):
    text = _feedback(batch, "leak")
    assert "LEAKED" not in text and "tensor(" not in text, text
    assert "hidden case: " in text and "ValueError" in text, text


def test_the_seed_never_reaches_the_students_process(batch):
    assert batch["jobs"] and all(str(SEED) not in job.decode() for job in batch["jobs"])


def test_time_is_budgeted_per_submission_and_memory_and_output_are_capped(batch):
    assert "time budget of 20 s ran out" in _row(batch, "stacked-sleeps")["reason"]
    assert "File too large" in _row(batch, "output")["reason"], _row(batch, "output")
    assert _row(batch, "memory")["verdict"] == "ERROR", _row(batch, "memory")
    assert "may use 3 GiB: the grader's --memory" in _row(batch, "memory")["reason"]


def test_an_unguarded_package_helper_that_answers_the_exercise_is_withheld(tmp_path):
    """`exchange_prediction_all_gather` is a whole other implementation of `exchange_prediction`:
    called in place of the student's own logic, it raises in the sandbox like the solution."""
    lab = "03_cfgp"
    nb = release(lab)
    nb.cells.append(
        nbformat.v4.new_code_cell(
            "from paralab.cfgp.sampling import exchange_prediction_all_gather\n\n\n"
            "def exchange_prediction(mine, group):\n"
            "    return exchange_prediction_all_gather(mine, group)\n",
            metadata={"paralab": {"edit": ["exchange_prediction"]}},
        )
    )
    path = hand_in(tmp_path / "helper" / notebook_name(lab), nb)
    main([str(path), "--seed", "1", "--json", str(tmp_path / "scores.json")])
    row = next(
        r
        for r in json.loads((tmp_path / "scores.json").read_text())
        if r["exercise"] == "exchange_prediction"
    )
    assert (row["points"], row["verdict"]) == (0, "REFUSED"), row
    assert "exchange_prediction_all_gather is withheld" in row["reason"], row


PROBE = """
import ctypes, json, os, resource, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
PRELOADED = "torch" in sys.modules
def writable(path):
    try:
        with open(os.path.join(path, ".probe"), "w"):
            return True
    except OSError:
        return False
def refused(fn, *args):
    return fn(*args) != 0 and os.strerror(ctypes.get_errno())
status = dict(l.split(":\\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\\t" in l)
places = ("/", "/tmp", "/dev/shm", "/dev", "/grading", "/grading/src", "/usr", "/proc/sys/kernel",
          sys.prefix)
seen = {
    "preloaded": PRELOADED,
    "capabilities": [status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")],
    "no_new_privs": status["NoNewPrivs"].strip(),
    "pid": [os.getpid(), os.getppid()],
    "session": os.getsid(0) == os.getpid(),
    "processes": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "interfaces": sorted(name for _, name in socket.if_nameindex()),
    "loopback": socket.create_server(("127.0.0.1", 0)).getsockname()[0],
    "writable": sorted(p for p in places if writable(p)),
    "left": sorted(os.listdir("/tmp")) + sorted(os.listdir("/dev/shm")),
    "batch": sorted(os.listdir("/grading/batch")) if os.path.isdir("/grading/batch") else [],
    "mount": refused(libc.mount, b"tmpfs", b"/tmp", b"tmpfs", 0, None),
    "umount": refused(libc.umount2, b"/tmp", 2),
    "unshare": refused(libc.unshare, 0x20000),
    "hostname": refused(libc.sethostname, b"x", 1),
    "environment": sorted(os.environ.items()),
    "cwd": os.getcwd(),
    "limits": [resource.getrlimit(getattr(resource, f"RLIMIT_{r}")) for r in ("AS", "FSIZE", "CORE")],
    "fds": len(os.listdir("/proc/self/fd")),
    "ids": [os.getuid(), os.getgid(), os.getgroups()],
}
KEYRING = {"x86_64": (248, 249), "aarch64": (217, 218)}[os.uname().machine]  # add, request
found = libc.syscall(KEYRING[1], b"user", b"paralab-note", None, 0)
seen["keyring"] = found > 0  # a note the last submission left in the user's keyring
libc.syscall(KEYRING[0], b"user", b"paralab-note", b"x", 1, -4)  # KEY_SPEC_USER_KEYRING
try:
    seen["first"] = os.listdir("/proc/1/fd") and os.readlink("/proc/1/cwd")
except OSError as e:
    seen["first"] = e.strerror
open("/tmp/note", "w").write("x")
open("/dev/shm/note", "w").write("x")
os.write(int(sys.argv[-1]), json.dumps(seen).encode())
"""


@pytest.mark.skipif(not SANDBOXED, reason=NO_SANDBOX)
def test_a_process_forked_from_the_zygote_sees_what_a_fresh_sandbox_sees():
    """The grader's zygote saves each submission an `import torch`. Read off from inside, what its
    fork can see and do is what a bubblewrap sandbox of its own allows (or less), and nothing a
    submission leaves behind reaches the next one."""
    with sandbox.Zygote() as zygote:
        package = zygote.root / "submission" / "src"
        package.mkdir(parents=True)
        (package / "probe.py").write_text(PROBE)
        fresh = [sandbox.run_sandboxed(package, "probe", b"", 60) for _ in range(2)]
        forked = [sandbox.run_sandboxed(package, "probe", b"", 60, zygote=zygote) for _ in range(2)]
        holder = os.fork()  # as the launcher's forkserver is: a copy of the zygote's socket
        if holder == 0:
            time.sleep(60)
            os._exit(0)
        started = time.monotonic()
        zygote.close()
        stopped_in = time.monotonic() - started
        os.kill(holder, signal.SIGKILL)
        os.waitpid(holder, 0)
    assert stopped_in < 10, f"the zygote stopped {stopped_in:.0f} s after it was told"
    assert all(r.returncode == 0 for r in fresh + forked), [r.output_tail for r in fresh + forked]
    first, again = (json.loads(r.result) for r in forked)
    alone = json.loads(fresh[1].result)
    assert (alone["preloaded"], first["preloaded"]) == (False, True), "forked, not started fresh"
    assert "note" not in again["left"] and "note" not in alone["left"], "the last one's files"
    assert first["capabilities"] == ["0" * 16] * 5 and first["no_new_privs"] == "1"
    assert (first["processes"], first["interfaces"], first["batch"]) == ([1, 2], ["lo"], [])
    assert first["session"], "its own session"
    assert not again["keyring"] and not alone["keyring"], "a note in the user's keyring"
    assert first["first"] == "Permission denied", "PID 1 of a fork: its files and folder"
    assert set(first["writable"]) == {"/tmp", "/dev/shm"} <= set(alone["writable"])
    differ = {k for k in alone if alone[k] != again[k]}
    assert differ <= {"preloaded", "session", "writable", "first"}, {
        k: (alone[k], again[k]) for k in differ
    }

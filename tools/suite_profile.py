"""Where the test suite's time goes: wall, CPU, the slowest tests and the slowest files.

    python tools/suite_profile.py                 # the whole suite, as README runs it
    python tools/suite_profile.py tests/test_launch.py -n 0

It runs `python -m pytest --durations=0 -q` (plus your arguments) and prints the wall time, the
CPU the whole machine spent meanwhile (from /proc/stat, so ranks, kernels, sandboxes and the
browser count: they are not all children the test process waits for), their ratio against the
cores, the 20 slowest tests and the per-file sums. Measure on an otherwise idle machine: the CPU
figure is the machine's. `python _build_nb.py --profile` is the same for the labs. Both print a
yardstick of the machine's speed (`paralab.notebooks.machine_yardstick`): compare timings only
with it.

It also watches /proc while the suite runs (ten times a second) and prints where the CPU went by
role: the pytest processes themselves, the lab kernels nbval starts, the ranks (and forkservers)
forked from each, the grader's sandboxes, the browser, other subprocesses, and what ran on the
machine outside the suite (this VM's agent, kernel threads). A process's role is read off its
command line; a forked process (a rank) keeps its parent's command line, so it is named after it.
A process that lives under a tenth of a second may be missed; its CPU is small.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

DURATION = re.compile(r"^\s*([\d.]+)s (setup|call|teardown)\s+(.+?)\s*$")


def busy_seconds() -> float | None:
    """CPU seconds the machine has spent busy since boot (Linux), or None elsewhere."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
    except OSError:
        return None
    idle = fields[3] + fields[4]  # idle and iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


@dataclass
class Process:
    """One process seen in /proc: its command line, its parent, the CPU it had used when last seen."""

    pid: int
    command: str
    parent: Process | None
    cpu: float = 0.0
    cpu_before: float = 0.0  # what a process already running when the census began had used


ROLES = (  # (role, a piece of the command line that marks it), the first match wins
    ("sandbox", "bwrap"),
    ("sandbox", "paralab.grade.submission"),
    ("sandbox", "/zygote.py"),  # the grader's zygote, and its forks
    ("kernel", "ipykernel_launcher"),
    ("browser", "chrom"),
    ("browser", "headless_shell"),
    ("site build", "mkdocs"),
    ("pytest", "pytest"),
    ("pytest", "import sys;exec(eval(sys.stdin.readline()))"),  # an xdist worker
    ("spawned ranks", "multiprocessing.spawn"),
)


def role_of(process: Process) -> str:
    """What a process is for: its command line's role or, when forked, its parent's ranks."""
    if process.parent is not None and process.parent.command == process.command:
        return f"ranks and forkservers of {role_of(process.parent).split(' of ')[-1]}"
    for role, mark in ROLES:
        if mark in process.command:
            return role
    return "other subprocesses"


class Census:
    """Poll /proc in a thread: every process on the machine, its parent and the CPU it uses."""

    def __init__(self, root: int, period_s: float = 0.1) -> None:
        self.root, self.period_s = root, period_s
        self.current: dict[int, Process] = {}  # pid -> the process that holds it now
        self.seen: list[Process] = []
        self.ticks = os.sysconf("SC_CLK_TCK")
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> Census:
        self._sweep()
        for process in self.seen:
            process.cpu_before = process.cpu
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()

    def _watch(self) -> None:
        while not self.done.wait(self.period_s):
            self._sweep()

    def _sweep(self) -> None:
        for name in sorted(os.listdir("/proc"), key=lambda n: (len(n), n)):  # parents first
            if name.isdigit():
                self._read(int(name))

    def _read(self, pid: int) -> None:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) "
            process = self.current.get(pid)
            if process is None or process.cpu > (int(fields[11]) + int(fields[12])) / self.ticks:
                with open(f"/proc/{pid}/cmdline", "rb") as f:  # new, or the pid was reused
                    command = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
                command = command or stat[stat.find("(") : stat.rfind(")") + 1]  # kernel thread
                process = Process(pid, command, self.current.get(int(fields[1])))
                self.current[pid] = process
                self.seen.append(process)
        except OSError:  # it ended meanwhile
            return
        process.cpu = (int(fields[11]) + int(fields[12])) / self.ticks

    def by_role(self) -> dict[str, tuple[int, float]]:
        """role -> (processes, CPU seconds); what does not descend from the suite is "outside"."""
        totals: dict[str, tuple[int, float]] = {}
        for process in self.seen:
            ancestor = process
            while ancestor is not None and ancestor.pid != self.root:
                ancestor = ancestor.parent
            role = role_of(process) if ancestor is not None else "outside the suite"
            count, cpu = totals.get(role, (0, 0.0))
            totals[role] = (count + 1, cpu + process.cpu - process.cpu_before)
        return totals


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # this checkout's paralab
    from paralab.notebooks import machine_yardstick

    yardstick = machine_yardstick()  # before the suite, on the idle machine
    command = [sys.executable, "-m", "pytest", "--durations=0", "-q", *argv]
    cpu_before, started = busy_seconds(), time.monotonic()
    suite = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    census = Census(suite.pid) if os.path.isdir("/proc/self") else None
    with census or contextlib.nullcontext():
        stdout, stderr = suite.communicate()
    done = subprocess.CompletedProcess(command, suite.returncode, stdout, stderr)
    wall, cpu_after = time.monotonic() - started, busy_seconds()
    per_test, per_file = [], collections.Counter()
    for line in done.stdout.splitlines():
        found = DURATION.match(line)
        if found:
            seconds, phase, test = float(found[1]), found[2], found[3]
            per_test.append((seconds, phase, test))
            per_file[test.split("::", 1)[0]] += seconds
    in_figures = False
    for line in done.stdout.splitlines():
        if line.startswith("="):
            in_figures = " figures " in line
        elif in_figures or line.startswith(("FAILED", "ERROR")):
            print(line[:300])
    print(done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:])
    cores = os.cpu_count() or 1
    if cpu_before is not None and cpu_after is not None:
        cpu = cpu_after - cpu_before
        print(f"wall {wall:.0f} s; machine CPU {cpu:.0f} s; CPU/wall {cpu / wall:.2f} of {cores}")
    else:
        print(f"wall {wall:.0f} s (no /proc/stat here: CPU not measured)")
    print(f"sum of test durations {sum(per_file.values()):.0f} s")
    print(yardstick)
    print("\nslowest tests:")
    for seconds, phase, test in sorted(per_test, reverse=True)[:20]:
        print(f"  {seconds:7.1f} s  {phase:<8} {test}")
    print("\nslowest files (sum of their tests):")
    for path, seconds in per_file.most_common(15):
        print(f"  {seconds:7.1f} s  {path}")
    if census is not None:
        print("\nCPU by role (processes seen, CPU seconds):")
        roles = sorted(census.by_role().items(), key=lambda item: -item[1][1])
        for role, (count, cpu) in roles:
            print(f"  {cpu:7.1f} s  {count:5d}  {role}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

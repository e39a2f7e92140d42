"""Where the test suite's time goes: wall, CPU, the slowest tests and the slowest files.

    python tools/suite_profile.py                 # the whole suite, as README runs it
    python tools/suite_profile.py tests/test_launch.py -n 0

It runs `python -m pytest --durations=0 -q` (plus your arguments) and prints the wall time, the
CPU the whole machine spent meanwhile (from /proc/stat, so ranks, kernels, sandboxes and the
browser count: they are not all children the test process waits for), their ratio against the
cores, the 20 slowest tests and the per-file sums. Measure on an otherwise idle machine: the CPU
figure is the machine's. `python _build_nb.py --profile` is the same for the labs.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import time

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


def main(argv: list[str]) -> int:
    command = [sys.executable, "-m", "pytest", "--durations=0", "-q", *argv]
    cpu_before, started = busy_seconds(), time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True)
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
    print("\nslowest tests:")
    for seconds, phase, test in sorted(per_test, reverse=True)[:20]:
        print(f"  {seconds:7.1f} s  {phase:<8} {test}")
    print("\nslowest files (sum of their tests):")
    for path, seconds in per_file.most_common(15):
        print(f"  {seconds:7.1f} s  {path}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

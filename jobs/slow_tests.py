#!/usr/bin/env python3
"""The tests marked `slow`, which the default suite (`python -m pytest`) leaves out to stay under 15 minutes on
2 cores: every test that starts a Ray cluster or a Ray instance of its own (multi-node local clusters, `ray job
submit`, the example plugin on 3 nodes, a node killed or frozen mid-run, a plugin shipped to the workers by
environment variable), long fault scenarios, the jobs' and the sweep/ui's end-to-end runs, the network-namespace
cluster (root only), and the privacy audit's detection rates over hundreds of seeds (tests/test_audit_power.py).

    python jobs/slow_tests.py              # every slow test (~12 minutes on the project's 2-core machine)
    python jobs/slow_tests.py -k node      # pytest's own options pass through

They run one at a time (`-n 0`; the default suite runs on pytest-xdist workers): each starts clusters of its own and
times their faults.
"""
import subprocess
import sys
import time
from pathlib import Path

if __name__ == "__main__":
    started = time.perf_counter()
    code = subprocess.call([sys.executable, "-m", "pytest", "-m", "slow", "-q", "-n", "0", *sys.argv[1:]],
                           cwd=Path(__file__).resolve().parent.parent)
    print(f"slow tests: exit {code} after {time.perf_counter() - started:.0f} s")
    sys.exit(code)

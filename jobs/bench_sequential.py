#!/usr/bin/env python3
"""Sequential speed (round size 1): the compiled sequential engine against the generic engine and, where it has the
algorithm, seed 000's public reference code (liangzp/LDP-Bandit, Scheme1/, plain Python + numpy), all measured in
this one process, one after the other.

    python jobs/bench_sequential.py                                     # seed 000's four; reference if cloned at
                                                                        #   /tmp/ldpbandit_ref (see --reference)
    python jobs/bench_sequential.py --algorithms ldp-sgd,ldp-ols --users 1e5
    python jobs/bench_sequential.py --algorithms all --markdown        # every registered algorithm (plugins too)
    git clone https://github.com/liangzp/LDP-Bandit /tmp/ldpbandit_ref  # to compare with the reference

Setting: d = 2, K = 10, eps = 1, delta = 0.01, seed 0 (seed 000's comparison setting) for the single-parameter
algorithms (ldp-gloc on the logistic env, the others linear); the multi-parameter ones on their paper setting
(d = 20, K = 3); the bandits on their default envs. Per algorithm:
  * sequential: `engine.run(config)` (it picks the sequential engine), users/s of wall time and of this process's CPU
    time (the algorithm's loop is compiled before the clock starts);
  * generic: `run_local` at round size 1 on --generic-users users (same config otherwise);
  * reference: the reference code's WorkerA with the same d, K, T, eps (one user at a time; its run covers T + 1
    users) for LDP-SGD, LDP-OLS, LDP-UCB and LDP-GLOC (Scheme1/instances/singleparam.py and logistic.py settings).
The machine is named (CPUs, memory, load average): on a shared machine wall figures move, CPU figures less.
With `--algorithms all`, every registered algorithm runs at B = 1 on its default env; one not written as compiled
steps (a plugin in plain numpy) runs on the generic engine only, and the line says so. The B = 1 speed target:
100,000 users/s (20,000 for the LASSO ones, which solve a LASSO per episode).
Nothing here is asserted by the test suite; the reference code is never imported by ldpfed or its tests.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import types
from pathlib import Path

import numpy as np

from ldpfed.algorithms import REGISTRY
from ldpfed.config import RunConfig
from ldpfed.engine import run, run_local
from ldpfed.engine.sequential import sequential_unsupported

SETTINGS = {   # algorithm -> (env, env_params, reference (name, mechanism, server, reward) or None)
    "ldp-sgd": ("linear", {"d": 2, "K": 10}, ("LDP-SGD", "SGD", "GSGD", "normal")),
    "ldp-ols": ("linear", {"d": 2, "K": 10}, ("LDP-OLS", "OLS", "GOLS", "normal")),
    "ldp-ucb": ("linear", {"d": 2, "K": 10}, ("LDP-UCB", "OLS", "LUCB", "normal")),
    "ldp-gloc": ("logistic", {"d": 2, "K": 10}, ("LDP-GLOC", "GLM", "LUCBG", "logistic")),
    "ldp-sgd-multi": ("linear-multi", {}, None),
    "ldp-ols-multi": ("linear-multi", {}, None),
    "ldp-mab-ucb": ("bernoulli", {}, None),
    "sw-klucb-cf": ("piecewise-bernoulli", {}, None),
    "klucb-cf": ("piecewise-bernoulli", {}, None),
}


# The B = 1 speed targets, users/s (None: every other algorithm)
B1_TARGET = {None: 100_000, "private-lasso": 20_000, "lasso-bandit": 20_000}


def machine() -> str:
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem = float("nan")
    load = "%.1f %.1f %.1f" % os.getloadavg()
    return (f"{os.cpu_count()} CPUs, {mem:.0f} GiB, {platform.processor() or platform.machine()}, "
            f"python {sys.version.split()[0]}, numpy {np.__version__}; load average {load}")


def timed(fn):
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


def reference_rate(scheme1: Path, spec, users: int, seed: int) -> tuple[float, float]:
    """(wall, cpu) users/s of the reference code's WorkerA on d=2, K=10, eps=1, T=users (T + 1 users)."""
    if str(scheme1) not in sys.path:
        sys.path.insert(0, str(scheme1))
    if "tqdm" not in sys.modules:   # imported by its workers module, used only with echo=True
        try:
            import tqdm  # noqa: F401
        except ImportError:
            sys.modules["tqdm"] = types.SimpleNamespace(tqdm=lambda x: x)
    from utils import settings_dict, wrap_params  # the reference's own module (Scheme1/utils.py)

    name, mechanism, server, reward = spec
    params = wrap_params(name=name, mechanism=mechanism, server=server, reward=reward, dimension=2, n_action=10,
                         T=users, eps=1.0, random_seed=seed, env="GaussianLinear", worker="A",
                         context_type="gapless", profiler="Profiler", echo=False, echo_freq=100, batch=False)
    worker = settings_dict["worker"]["A"](params)
    _, wall, cpu = timed(worker.run)
    return (users + 1) / wall, (users + 1) / cpu


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithms", default=",".join(SETTINGS))
    parser.add_argument("--users", type=lambda x: int(float(x)), default=10**5)
    parser.add_argument("--generic-users", type=lambda x: int(float(x)), default=5000,
                        help="users of the generic engine's run (its rate does not depend on T)")
    parser.add_argument("--reference", type=Path, default=Path("/tmp/ldpbandit_ref"),
                        help="a clone of liangzp/LDP-Bandit (its Scheme1/ folder is used); skipped if absent")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--markdown", action="store_true", help="also print the table as Markdown (docs/figures.md's)")
    args = parser.parse_args(argv)
    scheme1 = args.reference / "Scheme1"
    have_reference = (scheme1 / "utils.py").exists()
    print(f"machine: {machine()}; shared with other work, so read the CPU columns too")
    print(f"reference code: {scheme1 if have_reference else 'not found (--reference), skipped'}")
    header = (f"{'algorithm':<14} {'env':<20} {'T':>8}  {'seq users/s':>11} {'(cpu)':>9}  {'generic':>7} "
              f"{'x':>5}  {'reference':>9} {'(cpu)':>7} {'x wall':>6} {'x cpu':>6}")
    print(header)
    rows = []
    names = sorted(REGISTRY) if args.algorithms == "all" else [a for a in args.algorithms.split(",") if a]
    for name in names:
        env, env_params, ref = SETTINGS.get(name, (REGISTRY[name].default_env, {}, None))
        config = RunConfig(name, env=env, env_params=env_params, users=args.users, round_size=1, eps=1.0,
                           delta=0.01 if name not in ("ldp-sgd-multi", "ldp-ols-multi") else 0.1, seed=args.seed)
        target = B1_TARGET.get(name, B1_TARGET[None])
        reason = sequential_unsupported(config)
        if reason:
            generic_cfg = config.replace(users=min(args.generic_users, args.users))
            _, g_wall, g_cpu = timed(lambda: run_local(generic_cfg))
            generic = generic_cfg.users / g_wall
            print(f"{name:<14} {env:<20} generic engine only ({reason}): {generic:,.0f} users/s "
                  f"(cpu {generic_cfg.users / g_cpu:,.0f}); target {target:,}: {generic / target:.2f} of it", flush=True)
            rows.append([f"`{name}`", env, "not compiled", "", f"{generic:,.0f}", "", "", "", "", ""])
            continue
        run(config.replace(users=100))   # compile the loop outside the timing
        result, wall, cpu = timed(lambda: run(config))
        assert result.summary["engine"] == "sequential"
        seq, seq_cpu = config.users / wall, config.users / cpu
        generic_cfg = config.replace(users=min(args.generic_users, args.users))
        _, g_wall, _ = timed(lambda: run_local(generic_cfg))
        generic = generic_cfg.users / g_wall
        row = [f"`{name}`", env, f"{seq:,.0f}", f"{seq_cpu:,.0f}", f"{generic:,.0f}", f"{seq / generic:.0f}x"]
        line = (f"{name:<14} {env + str(env_params or ''):<20} {config.users:>8,}  {seq:>11,.0f} {seq_cpu:>9,.0f}  "
                f"{generic:>7,.0f} {seq / generic:>5.0f}")
        if ref is not None and have_reference:
            ref_wall, ref_cpu = reference_rate(scheme1, ref, args.users, args.seed)
            line += f"  {ref_wall:>9,.0f} {ref_cpu:>7,.0f} {seq / ref_wall:>6.1f} {seq_cpu / ref_cpu:>6.1f}"
            row += [f"{ref_wall:,.0f}", f"{ref_cpu:,.0f}", f"{seq / ref_wall:.1f}x", f"{seq_cpu / ref_cpu:.1f}x"]
        else:
            row += ["", "", "", ""]
        rows.append(row)
        print(line, flush=True)
    print(f"load average at the end: {'%.1f %.1f %.1f' % os.getloadavg()}")
    if args.markdown:
        print("\n| algorithm | env | sequential users/s | (CPU) | generic B=1 users/s | seq/generic | reference users/s "
              "| (CPU) | seq/reference | (CPU) |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

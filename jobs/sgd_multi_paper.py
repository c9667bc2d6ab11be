#!/usr/bin/env python
"""Seed 000's LDP-SGD-multi (paper profile) on the multi-parameter setting, with the paper's steps and with a
projection: why it does not learn at T = 1e5.

    python jobs/sgd_multi_paper.py [--seeds 10] [--users 100000] [--out results/sgd_multi_paper]

Setting: linear-multi, d = 20, K = 3, eps = 1, delta = 0.1, s0 = 1000 per arm, round size 1 (compiled sequential
engine), seeds 0..n-1; uniform play from the cross-check's cache when present (else run here, slow: the generic
engine). Variants (params of ldp-sgd-multi): the default step 5 / (message count), the two lower bounds of
Theorem 4.1's step constant c' K_opt / (zeta kappa_l p') that hold whatever the world (see REPRODUCTION.md:
d / (zeta C_B^2) with K_opt = 1, K d / (zeta C_B^2) with K_opt = K), each without and with projection on the
paper's parameter set ||theta_a|| <= 1 (project = 1). Prints, per variant, median [quartiles] of the final regret,
its ratio to uniform play's median, and the final estimation error (Frobenius over the K arms); plus the
signal-to-noise prediction from the algorithm's own constants. Writes OUT/table.md.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--out", type=Path, default=Path("results/sgd_multi_paper"))
    parser.add_argument("--uniform-cache", type=Path, default=Path("results/crosscheck_seed000/runs.jsonl"))
    args = parser.parse_args(argv)

    from ldpfed.algorithms import make_algorithm
    from ldpfed.config import RunConfig
    from ldpfed.engine import run
    from ldpfed.envs import make_env

    d, K = 20, 3

    def config(name, seed, params):
        return RunConfig(name, env="linear-multi", users=args.users, round_size=1, eps=1.0, delta=0.1, seed=seed,
                         env_params={"d": d, "K": K}, params=params)

    algo = make_algorithm(make_env(config("ldp-sgd-multi", 0, {"s0": 1000})), config("ldp-sgd-multi", 0, {"s0": 1000}))
    zeta = 1.0                                   # inf mu' on [-C_B, C_B]: the identity link
    low = d / (zeta * algo.C_B ** 2)             # Theorem 4.1's step constant exceeds K_opt times this
    variants = [("default (step 5)", {}), (f"step {low:g} = d/(zeta C_B^2)", {"step": low}),
                (f"step {K * low:g} = K d/(zeta C_B^2)", {"step": K * low}), ("step 5, project 1", {"project": 1.0}),
                (f"step {K * low:g}, project 1", {"step": K * low, "project": 1.0})]

    uniform = []
    if args.uniform_cache.exists():
        for line in args.uniform_cache.read_text().splitlines():
            row = json.loads(line) if line.strip() else None
            if row and row["setting"] == "multi" and row["algorithm"] == "uniform" and row["profile"] == "paper" \
                    and row["seed"] < args.seeds and row["users"] == args.users:
                uniform.append((row["seed"], row["final_regret"]))
    uniform = dict(uniform)
    for seed in range(args.seeds):
        if seed not in uniform:
            uniform[seed] = run(config("uniform", seed, {})).summary["final_regret"]
    u_median = float(np.median(list(uniform.values())))

    def spread(values, fmt):
        q1, med, q3 = np.percentile(np.asarray(values, dtype=float), [25, 50, 75])
        return f"{fmt.format(med)} [{fmt.format(q1)} - {fmt.format(q3)}]"

    lines = [f"`python jobs/sgd_multi_paper.py --seeds {args.seeds} --users {args.users}`: ldp-sgd-multi, paper "
             f"profile, linear-multi d = {d}, K = {K}, eps = 1, delta = 0.1, s0 = 1000 per arm, T = {args.users:,}, "
             f"round size 1, seeds 0-{args.seeds - 1}", "",
             "| variant | final regret | / uniform's median | estimation error |", "|---|---|---|---|"]
    for label, extra in variants:
        regret, error = [], []
        for seed in range(args.seeds):
            result = run(config("ldp-sgd-multi", seed, {"s0": 1000, **extra}))
            regret.append(result.summary["final_regret"])
            error.append(result.summary["final_estimation_error"])
        lines.append(f"| {label} | {spread(regret, '{:,.0f}')} | {np.median(regret) / u_median:.2f} | "
                     f"{spread(error, '{:.2f}')} |")
        print(lines[-1], flush=True)
    lines.append(f"| uniform play | {spread(list(uniform.values()), '{:,.0f}')} | 1.00 | - |")
    # signal-to-noise (module doc of REPRODUCTION.md): each slot's message has norm B; an arm's curvature per
    # message is lambda ~ 1/(K d) (pulled a third of the time, E[x x^T] = I/d on the unit sphere); the best step
    # c = 1/lambda leaves an error ~ B / (lambda sqrt(j)) after j messages.
    lam = 1.0 / (K * d)
    B = algo.mech.output_radius
    lines += ["", f"l2-ball output norm B = {B:.1f} (R = {algo.grad_radius:g}, eps/2 = {algo.eps / 2:g}, d = {d}); curvature per "
              f"message lambda ~ 1/(K d) = {lam:.4f}; best-step error per arm ~ B / (lambda sqrt(j)) = "
              f"{B / (lam * math.sqrt(args.users)):.1f} at j = {args.users:,}; error 0.3 needs j ~ "
              f"{(B / (lam * 0.3)) ** 2:.1e} users."]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

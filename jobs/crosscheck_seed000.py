#!/usr/bin/env python
"""Cross-check of seed 000's algorithms against the authors' public code (liangzp/LDP-Bandit, Scheme1/).

    python jobs/crosscheck_seed000.py --reference /tmp/ldpbandit_ref      # everything (long: see below)
    python jobs/crosscheck_seed000.py --part ldpfed --eps 1               # one part; results are cached per run
    python jobs/crosscheck_seed000.py --part table                        # the tables from the cached runs
    python jobs/crosscheck_seed000.py --users 1000000 --reference-seeds 10 --seeds 40 \
        --out results/crosscheck_seed000_1e6                              # the horizon of the shuffle experiment

Single parameter (seed 000's setting: linear env, d = 2, K = 10, T = --users (1e5), round size 1, delta = 0.01):
ldp-sgd, ldp-ols, ldp-gloc, ldp-ucb under --profile (default authors-code) and, given --reference PATH (a clone of the
reference repository), the reference itself on the same setting and seeds, one user at a time, in a subprocess.
Multi parameter (d = 20, K = 3, delta = 0.1, eps = 1, T = 1e5, s0 = 3000 users in total): ldp-sgd-multi,
ldp-ols-multi and uniform play. Prints medians [quartiles] of the final cumulative regret and, per algorithm and
eps, a two-sided Mann-Whitney U test of ldpfed's final regrets against the reference's (scipy.stats.mannwhitneyu).

Every finished run is appended to OUT/runs.jsonl and skipped when the job is run again, so the job can be split
over processes (--part) and resumed; the cache is keyed by T (--users) too, and the tables show the runs of the
given --users only. Nothing in the tests depends on the reference code.
ldpfed's runs at round size 1 use the compiled sequential engine wherever it has a kernel (both profiles of the
seed-000 algorithms); --streams generic feeds it the generic engine's own random draws instead of its chunked
streams (the generic engine's results up to rounding, much faster): run it with another --out and compare.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SINGLE = ["ldp-sgd", "ldp-ols", "ldp-gloc", "ldp-ucb"]
MULTI = ["ldp-sgd-multi", "ldp-ols-multi", "uniform"]
# The reference's names of the four algorithms (Scheme1/instances/singleparam.py's configurations).
REFERENCE = {"ldp-sgd": ("LDP-SGD", "SGD", "GSGD"), "ldp-ols": ("LDP-OLS", "OLS", "GOLS"),
             "ldp-gloc": ("LDP-GLOC", "GLM", "LUCBG"), "ldp-ucb": ("LDP-UCB", "OLS", "LUCB")}
# The reference's figures as first quoted, before this job ran it (eps = 1, seeds 0-9, T = 1e5): median [25% - 75%].
# REPRODUCTION.md's cross-check table sets them beside the reference run here ("reference (quoted)").
QUOTED = {"ldp-sgd": "1,136 [178 - 1,908]", "ldp-ols": "11,744 [9,369 - 22,814]",
          "ldp-gloc": "15,306 [5,251 - 23,218]", "ldp-ucb": "30,863 [28,400 - 35,390]"}
QUOTED_MEDIAN = {"ldp-sgd": 1136.0, "ldp-ols": 11744.0, "ldp-gloc": 15306.0, "ldp-ucb": 30863.0}

# Runs the reference's own classes (WorkerA with its env, mechanism, server and profiler) for one configuration.
REFERENCE_DRIVER = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import utils
from workers.workers import WorkerA
name, mechanism, server, eps, seed, T = sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
params = utils.wrap_params(name, worker="A", random_seed=seed, env="GaussianLinear", reward="normal",
                           mechanism=mechanism, server=server, profiler="Profiler", dimension=2, n_action=10, T=T,
                           eps=eps, context_type="gapless", echo=False, echo_freq=1000, batch=False)
start = time.process_time()
worker = WorkerA(params)
worker.run()
df = worker.profiler.df
print(json.dumps({"final_regret": float(sum(worker.profiler.pseudo_regret.ravel())
                                        if hasattr(worker.profiler.pseudo_regret, "ravel")
                                        else worker.profiler.pseudo_regret),
                  "final_estimation_error": float(df["estimation_error"].iloc[-1]),
                  "cpu_s": time.process_time() - start}))
"""


def load(out: Path) -> list[dict]:
    path = out / "runs.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def append(out: Path, row: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "runs.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


def key(row: dict) -> tuple:
    # rows cached before --users existed are T = 1e5 runs
    return (row["source"], row["setting"], row["algorithm"], float(row["eps"]), int(row["seed"]), row["profile"],
            int(row.get("users", 100_000)))


def horizon(users: int) -> str:
    """T as the tables write it: 1e5, 1e6, ... for powers of ten."""
    power = round(np.log10(users))
    return f"1e{power}" if 10 ** power == users else f"{users:,}"


def run_ldpfed(algorithm: str, setting: str, eps: float, seed: int, users: int, profile: str,
               streams: str = "block") -> dict:
    """streams "generic": the compiled sequential engine fed the generic engine's own random draws, i.e. run_local's
    result up to rounding (tests/test_sequential.py) at a fraction of its cost: a check of the kernels' streams."""
    from ldpfed.config import RunConfig
    from ldpfed.engine import run
    from ldpfed.engine.sequential import run_sequential

    if setting == "single":
        config = RunConfig(algorithm, env="linear", users=users, round_size=1, eps=eps, delta=0.01, seed=seed,
                           env_params={"d": 2, "K": 10}, profile=profile)
    else:
        # s0 = 3000 users in total (the authors' warm_up): 1000 per arm at K = 3
        params = {"s0": 1000} if algorithm != "uniform" else {}
        config = RunConfig(algorithm, env="linear-multi", users=users, round_size=1, eps=eps, delta=0.1, seed=seed,
                           env_params={"d": 20, "K": 3}, params=params, profile=profile)
    start = time.process_time()
    result = run_sequential(config, streams="generic") if streams == "generic" else run(config, engine="local")
    void = [row.get("claim_void") for row in result.ledger if row.get("claim_void")]
    row = {"final_regret": result.summary["final_regret"],
           "final_estimation_error": result.summary["final_estimation_error"],
           "cpu_s": time.process_time() - start, "claim_void": void[0] if void else None,
           "engine": result.summary["engine"]}
    if setting == "single":   # how much of the estimation error is shrinkage (norm) and how much direction
        from ldpfed.envs import make_env

        theta, truth = np.asarray(result.state["theta"], dtype=float), make_env(config).theta
        row["final_theta_norm"] = float(np.linalg.norm(theta))
        row["final_cosine"] = float(theta @ truth / max(np.linalg.norm(theta) * np.linalg.norm(truth), 1e-300))
    return row


def run_reference(clone: Path, algorithm: str, eps: float, seed: int, users: int) -> dict:
    name, mechanism, server = REFERENCE[algorithm]
    done = subprocess.run([sys.executable, "-c", REFERENCE_DRIVER, str(clone / "Scheme1"), name, mechanism, server,
                           str(eps), str(seed), str(users)], capture_output=True, text=True, cwd=clone / "Scheme1")
    if done.returncode != 0:
        raise RuntimeError(f"reference {name} eps={eps} seed={seed} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def quartiles(values) -> str:
    v = np.asarray(values, dtype=float)
    q1, med, q3 = np.percentile(v, [25, 50, 75])
    return f"{med:,.0f} [{q1:,.0f} - {q3:,.0f}]"


def tables(rows: list[dict], profiles: list[str], users: int = 100_000) -> str:
    """The tables of the runs at T = users; the quoted reference figures are at T = 1e5 only."""
    from scipy.stats import mannwhitneyu

    def sample(source, setting, algorithm, eps, profile=None):
        return [r for r in rows if r["source"] == source and r["setting"] == setting and r["algorithm"] == algorithm
                and float(r["eps"]) == eps and (profile is None or r["profile"] == profile)]

    quote = users == 100_000   # the quoted figures' columns
    lines = [f"### Single parameter: linear env, d = 2, K = 10, T = {horizon(users)}, round size 1, delta = 0.01",
             "", "Final cumulative regret, median [25% - 75%] over seeds (n = number of seeds); p: two-sided "
             "Mann-Whitney U test of ldpfed's authors-code sample against the reference's run here; ratios: ldpfed "
             "authors-code median / reference median" + (" (run here; quoted at eps = 1)" if quote else "") +
             "; 95%: bootstrap interval of that ratio (10,000 resamples of both samples).", "",
             "| eps | algorithm | reference (run here) | " + ("reference (quoted) | " if quote else "") +
             " | ".join(f"ldpfed {p}" for p in profiles) + " | ratio (run here) | 95% | " +
             ("ratio (quoted) | " if quote else "") + "Mann-Whitney p |",
             "|---|---|---|" + "---|" * (len(profiles) + (5 if quote else 3))]
    eps_values = sorted({float(r["eps"]) for r in rows if r["setting"] == "single"}, reverse=True)
    for eps in eps_values:
        for algorithm in SINGLE:
            ref = [r["final_regret"] for r in sample("reference", "single", algorithm, eps)]
            cells, ratio, ratio_quoted, p, interval = [], "-", "-", "-", "-"
            for profile in profiles:
                mine = [r["final_regret"] for r in sample("ldpfed", "single", algorithm, eps, profile)]
                cells.append(f"{quartiles(mine)} (n={len(mine)})" if mine else "-")
                if profile == "authors-code" and mine:
                    if ref:
                        ratio = f"{np.median(mine) / np.median(ref):.2f}"
                        low, high = bootstrap_ratio(mine, ref)
                        interval = f"{low:.2f} - {high:.2f}"
                        p = f"{mannwhitneyu(mine, ref, alternative='two-sided').pvalue:.3f}"
                    if eps == 1.0:
                        ratio_quoted = f"{np.median(mine) / QUOTED_MEDIAN[algorithm]:.2f}"
            quoted = (QUOTED[algorithm] if eps == 1.0 else "-") + " | " if quote else ""
            lines.append(f"| {eps:g} | {algorithm} | {quartiles(ref) + f' (n={len(ref)})' if ref else '-'} | "
                         f"{quoted}" + " | ".join(cells) + f" | {ratio} | {interval} | " + (f"{ratio_quoted} | " if quote else "")
                         + f"{p} |")
    lines += ["", "Final estimation error ||theta_hat - theta*||, median [25% - 75%]:", "",
              "| eps | algorithm | reference | " + " | ".join(f"ldpfed {p}" for p in profiles) + " |",
              "|---|---|---|" + "---|" * len(profiles)]
    for eps in eps_values:
        for algorithm in SINGLE:
            ref = [r["final_estimation_error"] for r in sample("reference", "single", algorithm, eps)]
            cells = []
            for profile in profiles:
                mine = [r["final_estimation_error"] for r in sample("ldpfed", "single", algorithm, eps, profile)
                        if r["final_estimation_error"] is not None]
                cells.append(_errors(mine))
            lines.append(f"| {eps:g} | {algorithm} | {_errors(ref)} | " + " | ".join(cells) + " |")
    lines += ["", "Final ||theta_hat|| and cosine(theta_hat, theta*), median over seeds (how much of the estimation "
              "error is shrinkage and how much direction):", "",
              "| eps | algorithm | " + " | ".join(f"ldpfed {p}: norm, cosine" for p in profiles) + " |",
              "|---|---|" + "---|" * len(profiles)]
    for eps in eps_values:
        for algorithm in SINGLE:
            cells = []
            for profile in profiles:
                mine = [r for r in sample("ldpfed", "single", algorithm, eps, profile) if "final_cosine" in r]
                cells.append(f"{np.median([r['final_theta_norm'] for r in mine]):.3f}, "
                             f"{np.median([r['final_cosine'] for r in mine]):.4f}" if mine else "-")
            lines.append(f"| {eps:g} | {algorithm} | " + " | ".join(cells) + " |")
    multi = [r for r in rows if r["setting"] == "multi"]
    if multi:
        lines += ["", f"### Multi parameter: d = 20, K = 3, T = {horizon(users)}, eps = 1, delta = 0.1, "
                  "s0 = 3000 users in total, round size 1", "", "p (< 0.4 uniform): one-sided Mann-Whitney U test that the algorithm's final "
                  "regrets are below 0.4 times uniform play's (same seeds' sample, scaled); small p: the target is met.",
                  "", "| profile | algorithm | final regret | / uniform's median | p (< 0.4 uniform) | estimation error |"
                  " privacy claim |", "|---|---|---|---|---|---|---|"]
        for profile in profiles:
            uniform = [r["final_regret"] for r in sample("ldpfed", "multi", "uniform", 1.0, profile)]
            for algorithm in MULTI:
                mine = sample("ldpfed", "multi", algorithm, 1.0, profile)
                if not mine:
                    continue
                regret = [r["final_regret"] for r in mine]
                share = f"{np.median(regret) / np.median(uniform):.2f}" if uniform else "-"
                below = (f"{mannwhitneyu(regret, 0.4 * np.asarray(uniform), alternative='less').pvalue:.2g}"
                         if uniform and algorithm != "uniform" else "-")
                errors = [r["final_estimation_error"] for r in mine if r["final_estimation_error"] is not None]
                void = next((r["claim_void"] for r in mine if r.get("claim_void")), None)
                claim = "void: inputs unclipped" if void else ("eps = 1" if algorithm != "uniform" else "-")
                lines.append(f"| {profile} | {algorithm} | {quartiles(regret)} (n={len(regret)}) | {share} | {below} | "
                             f"{_errors(errors)} | {claim} |")
    return "\n".join(lines)


def bootstrap_ratio(mine, ref, draws: int = 10_000) -> tuple[float, float]:
    """95% percentile-bootstrap interval of median(mine) / median(ref), both samples resampled (fixed seed)."""
    rng = np.random.default_rng(0)
    mine, ref = np.asarray(mine, dtype=float), np.asarray(ref, dtype=float)
    ratios = (np.median(rng.choice(mine, (draws, len(mine))), axis=1)
              / np.median(rng.choice(ref, (draws, len(ref))), axis=1))
    return tuple(np.percentile(ratios, [2.5, 97.5]))


def _errors(values) -> str:
    if not values:
        return "-"
    q1, med, q3 = np.percentile(np.asarray(values, dtype=float), [25, 50, 75])
    return f"{med:.3f} [{q1:.3f} - {q3:.3f}]"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference", type=Path, default=None, help="a clone of liangzp/LDP-Bandit")
    parser.add_argument("--part", choices=["all", "reference", "ldpfed", "multi", "table"], default="all")
    parser.add_argument("--profile", default="authors-code", help="comma-separated profiles of the ldpfed runs")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--reference-seeds", type=int, default=None, help="seeds of the reference (default --seeds)")
    parser.add_argument("--eps", default="1,0.5", help="comma-separated eps of the single-parameter runs")
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--algorithms", default=None, help="comma-separated subset")
    parser.add_argument("--out", type=Path, default=Path("results/crosscheck_seed000"))
    parser.add_argument("--streams", choices=["block", "generic"], default="block",
                        help="generic: ldpfed's runs take the generic engine's random draws (use another --out)")
    args = parser.parse_args(argv)
    profiles = [p.strip() for p in args.profile.split(",")]
    eps_values = [float(e) for e in args.eps.split(",")]
    chosen = None if args.algorithms is None else {a.strip() for a in args.algorithms.split(",")}
    done = {key(r) for r in load(args.out)}

    def todo(source, setting, algorithm, eps, seed, profile):
        row = {"source": source, "setting": setting, "algorithm": algorithm, "eps": eps, "seed": seed,
               "profile": profile, "users": args.users}
        return None if key(row) in done or (chosen and algorithm not in chosen) else row

    jobs = []
    if args.part in ("all", "reference"):
        if args.reference is None:
            print("no --reference: the reference runs are skipped", file=sys.stderr)
        else:
            jobs += [todo("reference", "single", a, e, s, "reference")
                     for e in eps_values for s in range(args.reference_seeds or args.seeds) for a in SINGLE]
    if args.part in ("all", "ldpfed"):
        jobs += [todo("ldpfed", "single", a, e, s, p)
                 for p in profiles for e in eps_values for s in range(args.seeds) for a in SINGLE]
    if args.part in ("all", "multi"):
        jobs += [todo("ldpfed", "multi", a, 1.0, s, p) for p in profiles for s in range(args.seeds) for a in MULTI]
    jobs = [j for j in jobs if j is not None]
    for i, job in enumerate(jobs, 1):
        if job["source"] == "reference":
            outcome = run_reference(args.reference, job["algorithm"], job["eps"], job["seed"], args.users)
        else:
            outcome = run_ldpfed(job["algorithm"], job["setting"], job["eps"], job["seed"], args.users, job["profile"],
                                 args.streams)
        row = {**job, **outcome}
        append(args.out, row)
        print(f"[{i}/{len(jobs)}] {job['source']} {job['setting']} {job['algorithm']} {job['profile']} "
              f"eps={job['eps']:g} seed={job['seed']}: regret {row['final_regret']:,.1f} "
              f"({row['cpu_s']:.0f} s CPU)", flush=True)
    rows = [r for r in load(args.out) if int(r.get("users", 100_000)) == args.users]
    if rows:
        table = tables(rows, sorted({r["profile"] for r in rows if r["source"] == "ldpfed"}, reverse=True)
                       or profiles, args.users)
        (args.out / "crosscheck.md").write_text(table + "\n")
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

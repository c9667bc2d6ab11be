#!/usr/bin/env python
"""Local, shuffle, central and secure aggregation: regret and estimation error against the central eps, the batch
size and T; and secure aggregation's regret and reported guarantee against its drop-out rate and bit width.

    python jobs/trust_experiment.py                        # the docs/trust-models.md tables (T = 1e6, 10 seeds)
    python jobs/trust_experiment.py --users 1e5 --seeds 3  # minutes

Under --trust shuffle the run's --eps/--delta are the shuffled batch's guarantee and the users' randomizers run at
the largest eps0 that meets it; under --trust central a trusted server adds the noise once per round; under
--trust local the users' randomizers run at --eps (ldpfed.trust). So at the same central eps the three
runs give each user the same guarantee against the server's output, and the regret ratios shuffle / local and
central / local say what each trust buys. Part 1: every algorithm x eps x trust x seed at one round size.
Part 2 (--batch-sweep): ldp-sgd at a fixed central eps over round sizes (amplification grows with the batch,
batching costs regret). Part 3 (--horizons): the final regret over T at a fixed eps and round size, and its
log-log slope per algorithm and trust. Part 4 (--dropouts, --bits): ldp-ols and ldp-sgd under --trust secagg at
--batch-eps and --round-size, over the users who drop before sending (shares calibrated for every user, so the
reported guarantee is what the noise that arrived gives: below=report) and over the modulus' bits (fewer than the
default wrap sums around). Runs in a pool of --workers processes, one BLAS thread each; a run the
trust model refuses (a batch too small to amplify) is listed with its reason.

Writes under --out (default results/trust): runs.csv, tables.md, plots/regret_vs_eps.png, plots/regret_vs_batch.png,
plots/regret_vs_T.png, plots/secagg_dropout_bits.png.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

TRUSTS = ("local", "shuffle", "central", "secagg")
# A shuffled run whose smallest group of users on one randomizer amplifies too little (the users a public schedule
# sets apart, e.g. ldp-mab-ucb's "user t < K pulls arm t") runs at the target eps: its row shows what shuffling
# buys such an algorithm honestly (nothing) instead of being refused.
SMALL_GROUPS = "no-amplification"
STYLES = {"local": "o-", "shuffle": "s--", "central": "^:", "secagg": "d-."}
ALGORITHMS = {      # two contextual (d = 10, K = 10) and two multi-armed algorithms
    "ldp-sgd": ("linear", {"d": 10, "K": 10}),
    "ldp-ols": ("linear", {"d": 10, "K": 10}),
    "ldp-mab-ucb": ("bernoulli", {}),
    "sw-klucb-cf": ("piecewise-bernoulli", {}),
}


def _one(job: dict) -> dict:
    from ldpfed.config import RunConfig
    from ldpfed.engine import run
    from ldpfed.util.errors import ConfigError

    env, env_params = ALGORITHMS[job["algorithm"]]
    config = RunConfig(job["algorithm"], env=env, env_params=env_params, users=job["users"],
                       round_size=job["round_size"], eps=job["eps"], delta=job["delta"], seed=job["seed"],
                       trust=job["trust"],
                       trust_options={"small_groups": SMALL_GROUPS} if job["trust"] == "shuffle" else
                       dict(job.get("trust_options") or {}))
    started = time.process_time()
    try:
        s = run(config).summary
    except ConfigError as error:
        return {**job, "refused": f"{error.field}: {error.reason}"}
    return {**job, "final_regret": s["final_regret"], "final_estimation_error": s.get("final_estimation_error"),
            "eps0": s.get("privacy_eps0", job["eps"]), "eps_composed": s.get("privacy_eps_composed"),
            "smallest_group": s.get("privacy_shuffle_batch"), "amplified": s.get("privacy_shuffle_amplified"),
            "bits": s.get("privacy_secagg_bits"), "wrap_bound": s.get("privacy_secagg_wrap_bound"),
            "cpu_s": time.process_time() - started, "refused": ""}


def _pool_init():
    os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = "1"


def run_jobs(jobs: list[dict], workers: int) -> pd.DataFrame:
    rows, done = [], 0
    with ProcessPoolExecutor(max_workers=workers, initializer=_pool_init) as pool:
        for row in pool.map(_one, jobs, chunksize=1):
            rows.append(row)
            done += 1
            if done % max(1, len(jobs) // 20) == 0 or done == len(jobs):
                print(f"  {done}/{len(jobs)} runs", flush=True)
    return pd.DataFrame(rows)


def _median_iqr(values) -> str:
    values = np.asarray(values, dtype=float)
    if not len(values):
        return "-"
    q1, q2, q3 = np.percentile(values, [25, 50, 75])
    return f"{q2:,.0f} [{q1:,.0f} - {q3:,.0f}]" if q2 >= 100 else f"{q2:.3g} [{q1:.3g} - {q3:.3g}]"


def eps_table(runs: pd.DataFrame) -> list[str]:
    """Per algorithm and central eps: final regret (median [IQR] over seeds) under each trust model, the ratios of
    medians shuffle/local and central/local, eps0, and the estimation errors where the algorithm has one."""
    trusts = [t for t in TRUSTS if t in set(runs["trust"])]
    others = [t for t in trusts if t != "local"]
    lines = ["| algorithm | central eps | " + " | ".join(f"{t} regret" for t in trusts) + " | "
             + " | ".join(f"{t}/local" for t in others) + " | eps0 (shuffle) | "
             + " | ".join(f"{t} error" for t in trusts) + " |",
             "|---" * (3 + 2 * len(trusts) + len(others)) + "|"]
    ok = runs[runs["refused"] == ""]
    for (algorithm, eps), group in ok.groupby(["algorithm", "eps"], sort=True):
        by = {t: group[group["trust"] == t] for t in trusts}
        local = np.median(by["local"]["final_regret"]) if "local" in by and len(by["local"]) else float("nan")
        ratios = [f"{np.median(by[t]['final_regret']) / local:.3f}" if len(by[t]) else "-" for t in others]
        eps0 = f"{by['shuffle']['eps0'].iloc[0]:.3g}" if "shuffle" in by and len(by["shuffle"]) else "-"
        lines.append(f"| {algorithm} | {eps:g} | " + " | ".join(_median_iqr(by[t]["final_regret"]) for t in trusts)
                     + " | " + " | ".join(ratios) + f" | {eps0} | "
                     + " | ".join(_median_iqr(by[t]["final_estimation_error"].dropna()) for t in trusts) + " |")
    refused = runs[runs["refused"] != ""].drop_duplicates(["algorithm", "eps", "round_size", "trust"])
    for _, row in refused.iterrows():
        lines.append(f"\nrefused: {row['algorithm']} eps={row['eps']:g} B={row['round_size']} {row['trust']}: "
                     f"{row['refused']}")
    return lines


def horizon_table(runs: pd.DataFrame) -> list[str]:
    """Per algorithm and trust: the median final regret at each T and the least-squares slope of log(median
    regret) over log(T)."""
    ok = runs[runs["refused"] == ""]
    horizons = sorted(ok["users"].unique())
    lines = ["| algorithm | central eps | trust | " + " | ".join(f"T = {T:,.0f}" for T in horizons) + " | slope |",
             "|---" * (4 + len(horizons)) + "|"]
    for (algorithm, eps, trust), group in ok.groupby(["algorithm", "eps", "trust"], sort=True):
        med = group.groupby("users")["final_regret"].median()
        slope = np.polyfit(np.log(med.index.astype(float)), np.log(med.values), 1)[0] if len(med) > 1 else np.nan
        lines.append(f"| {algorithm} | {eps:g} | {trust} | " + " | ".join(f"{med.get(T, np.nan):,.0f}" for T in horizons)
                     + f" | {slope:.2f} |")
    return lines


def batch_table(runs: pd.DataFrame) -> list[str]:
    lines = ["| round size B | trust | eps0 | final regret | final estimation error |", "|---|---|---|---|---|"]
    ok = runs[runs["refused"] == ""]
    for (B, trust), group in ok.groupby(["round_size", "trust"], sort=True):
        lines.append(f"| {B:,} | {trust} | {group['eps0'].iloc[0]:.3g} | {_median_iqr(group['final_regret'])} | "
                     f"{_median_iqr(group['final_estimation_error'].dropna())} |")
    for _, row in runs[runs["refused"] != ""].drop_duplicates(["round_size", "trust"]).iterrows():
        lines.append(f"\nrefused: B={row['round_size']} {row['trust']}: {row['refused']}")
    return lines


def plots(runs: pd.DataFrame, batch: pd.DataFrame | None, out: Path, horizons: pd.DataFrame | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (out / "plots").mkdir(parents=True, exist_ok=True)
    ok = runs[runs["refused"] == ""]
    algorithms = sorted(ok["algorithm"].unique())
    fig, axes = plt.subplots(1, len(algorithms), figsize=(4.2 * len(algorithms), 3.6), squeeze=False)
    for ax, algorithm in zip(axes[0], algorithms):
        for trust in [t for t in TRUSTS if t in set(ok["trust"])]:
            style = STYLES[trust]
            g = ok[(ok["algorithm"] == algorithm) & (ok["trust"] == trust)].groupby("eps")["final_regret"]
            med, q1, q3 = g.median(), g.quantile(0.25), g.quantile(0.75)
            ax.plot(med.index, med.values, style, label=trust)
            ax.fill_between(med.index, q1.values, q3.values, alpha=0.2)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ticks = sorted(ok["eps"].unique())
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
        ax.set_title(algorithm)
        ax.set_xlabel("central eps")
        ax.set_ylabel("final regret (median, IQR)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "plots" / "regret_vs_eps.png", dpi=110)
    plt.close(fig)
    if batch is not None and len(batch[batch["refused"] == ""]):
        ok = batch[batch["refused"] == ""]
        fig, ax = plt.subplots(figsize=(5, 3.6))
        for trust in [t for t in TRUSTS if t in set(ok["trust"])]:
            style = STYLES[trust]
            g = ok[ok["trust"] == trust].groupby("round_size")["final_regret"]
            med = g.median()
            ax.plot(med.index, med.values, style, label=trust)
            ax.fill_between(med.index, g.quantile(0.25).values, g.quantile(0.75).values, alpha=0.2)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ticks = sorted(ok["round_size"].unique())
        ax.set_xticks(ticks, [f"{t:,}" for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("round size B (the shuffled batch: the smallest round)")
        ax.set_ylabel("final regret (median, IQR)")
        ax.set_title(f"{ok['algorithm'].iloc[0]}, central eps {ok['eps'].iloc[0]:g}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "plots" / "regret_vs_batch.png", dpi=110)
        plt.close(fig)
    if horizons is not None and len(horizons[horizons["refused"] == ""]):
        ok = horizons[horizons["refused"] == ""]
        ok = ok[ok["eps"] == ok["eps"].max()]
        algorithms = sorted(ok["algorithm"].unique())
        fig, axes = plt.subplots(1, len(algorithms), figsize=(4.2 * len(algorithms), 3.6), squeeze=False)
        for ax, algorithm in zip(axes[0], algorithms):
            for trust in [t for t in TRUSTS if t in set(ok["trust"])]:
                g = ok[(ok["algorithm"] == algorithm) & (ok["trust"] == trust)].groupby("users")["final_regret"]
                med = g.median()
                ax.plot(med.index, med.values, STYLES[trust], label=trust)
                ax.fill_between(med.index, g.quantile(0.25).values, g.quantile(0.75).values, alpha=0.2)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_title(f"{algorithm}, central eps {ok['eps'].iloc[0]:g}")
            ax.set_xlabel("users T")
            ax.set_ylabel("final regret (median, IQR)")
            ax.legend()
        fig.tight_layout()
        fig.savefig(out / "plots" / "regret_vs_T.png", dpi=110)
        plt.close(fig)


def secagg_table(runs: pd.DataFrame) -> list[str]:
    ok = runs[runs["refused"] == ""]
    lines = ["| algorithm | drop-outs | bits | regret | reported eps | bits used | wrap bound |", "|---" * 7 + "|"]
    for (algorithm, p, b), group in ok.groupby(["algorithm", "dropout", "bits_given"]):
        lines.append(f"| {algorithm} | {p:g} | {'auto' if not b else int(b)} | {_median_iqr(group['final_regret'])} | "
                     f"{group['eps_composed'].max():.4g} | {int(group['bits'].max())} | "
                     f"{group['wrap_bound'].max():.2g} |")
    for _, row in runs[runs["refused"] != ""].iterrows():
        lines.append(f"| {row['algorithm']} | {row['dropout']:g} | {row['bits_given']} | refused: {row['refused']} "
                     f"| | | |")
    return lines


def secagg_plot(runs: pd.DataFrame, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = runs[runs["refused"] == ""]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    drops, bits = ok[ok["bits_given"] == 0], ok[ok["bits_given"] != 0]
    for algorithm, style in (("ldp-ols", "o-"), ("ldp-sgd", "s--")):
        d = drops[drops["algorithm"] == algorithm].groupby("dropout")
        axes[0].plot(d["final_regret"].median().index, d["final_regret"].median().values, style, label=algorithm)
        axes[1].plot(d["eps_composed"].max().index, d["eps_composed"].max().values, style, label=algorithm)
        b = bits[bits["algorithm"] == algorithm].groupby("bits_given")["final_regret"].median()
        axes[2].plot(b.index, b.values, style, label=algorithm)
    axes[0].set(xlabel="users who drop before sending", ylabel="final regret (median)", title="regret")
    axes[1].set(xlabel="users who drop before sending", ylabel="reported eps",
                title="the guarantee the noise that arrived gives")
    axes[2].set(xlabel="bits of the modulus", ylabel="final regret (median)", yscale="log",
                title="fewer bits: the sums wrap around")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    (out / "plots").mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "plots" / "secagg_dropout_bits.png", dpi=110)
    plt.close(fig)


def _floats(text):
    return tuple(float(x) for x in text.split(",") if x.strip())


def _ints(text):
    return tuple(int(float(x)) for x in text.split(",") if x.strip())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS), help="comma-separated")
    parser.add_argument("--eps", type=_floats, default=(0.25, 0.5, 1.0, 2.0, 4.0), help="central eps values")
    parser.add_argument("--delta", type=float, default=1e-6)
    parser.add_argument("--users", type=lambda t: int(float(t)), default=1_000_000)
    parser.add_argument("--round-size", type=lambda t: int(float(t)), default=10_000,
                        help="users per round: the shuffled batch (part 1)")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--batch-sweep", type=_ints, default=(1000, 3000, 10_000, 30_000, 100_000),
                        help="round sizes of part 2 (ldp-sgd at --batch-eps); empty string: no part 2")
    parser.add_argument("--batch-eps", type=float, default=1.0)
    parser.add_argument("--trust", default=",".join(TRUSTS), help="comma-separated trust models")
    parser.add_argument("--horizons", type=_ints, default=(100_000, 1_000_000, 10_000_000),
                        help="T of part 3 (ldp-sgd and ldp-ols at --horizon-eps, --round-size); empty: no part 3")
    parser.add_argument("--horizon-seeds", type=int, default=None, help="seeds of part 3 (default --seeds)")
    parser.add_argument("--horizon-eps", type=_floats, default=(0.5, 1.0), help="central eps of part 3")
    parser.add_argument("--dropouts", type=_floats, default=(0.0, 0.1, 0.2, 0.3, 0.4, 0.5),
                        help="part 4: secagg drop-out rates; empty string: no part 4")
    parser.add_argument("--bits", type=_ints, default=(8, 10, 12, 14, 16, 20), help="part 4: secagg bit widths")
    parser.add_argument("--secagg-users", type=lambda t: int(float(t)), default=None,
                        help="part 4: T (default --users; heavy drop-outs need many SecAgg+ neighbours, so a round "
                             "costs more)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("results/trust"))
    parser.add_argument("--replot", action="store_true", help="only redraw the plots from OUT/runs.csv")
    args = parser.parse_args(argv)
    if args.replot:
        saved = pd.read_csv(args.out / "runs.csv", keep_default_na=False, na_values=[""])
        saved["refused"] = saved["refused"].astype(object).where(saved["refused"].notna(), "")
        part = saved.pop("part")
        plots(saved[part == "eps"], saved[part == "batch"] if (part == "batch").any() else None, args.out,
              saved[part == "horizon"] if (part == "horizon").any() else None)
        print(f"written: {args.out}/plots/")
        return 0
    names = [a for a in args.algorithms.split(",") if a]
    trusts = [t for t in args.trust.split(",") if t]
    if set(trusts) - set(TRUSTS):
        parser.error(f"unknown trust models {sorted(set(trusts) - set(TRUSTS))}; choose from {list(TRUSTS)}")
    unknown = set(names) - set(ALGORITHMS)
    if unknown:
        parser.error(f"unknown algorithms {sorted(unknown)}; choose from {list(ALGORITHMS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    jobs = [{"algorithm": a, "eps": e, "trust": t, "seed": s, "users": args.users, "round_size": args.round_size,
             "delta": args.delta} for a in names for e in args.eps for t in trusts
            for s in range(args.seeds)]
    print(f"part 1: {len(jobs)} runs (T = {args.users:,}, B = {args.round_size:,})", flush=True)
    runs = run_jobs(jobs, args.workers)
    batch = None
    if args.batch_sweep:
        jobs = [{"algorithm": "ldp-sgd", "eps": args.batch_eps, "trust": t, "seed": s, "users": args.users,
                 "round_size": B, "delta": args.delta} for B in args.batch_sweep for t in trusts
                for s in range(args.seeds)]
        print(f"part 2: {len(jobs)} runs (ldp-sgd, central eps {args.batch_eps:g})", flush=True)
        batch = run_jobs(jobs, args.workers)
    horizons = None
    if args.horizons:
        key = ["algorithm", "eps", "trust", "seed", "users", "round_size"]
        jobs = pd.DataFrame([{"algorithm": a, "eps": e, "trust": t, "seed": s, "users": T,
                              "round_size": args.round_size, "delta": args.delta}
                             for a in ("ldp-sgd", "ldp-ols") if a in names for e in args.horizon_eps
                             for T in args.horizons for t in trusts for s in range(args.horizon_seeds or args.seeds)])
        done = jobs.merge(runs, on=key + ["delta"])            # part 1's runs at the same setting are reused
        todo = jobs[~jobs.set_index(key).index.isin(done.set_index(key).index)]
        print(f"part 3: {len(todo)} runs (T = {', '.join(f'{T:,}' for T in args.horizons)}; {len(done)} from "
              f"part 1)", flush=True)
        horizons = pd.concat([done, run_jobs(todo.to_dict("records"), args.workers)], ignore_index=True)
    secure = None
    if args.dropouts and "secagg" in trusts:
        base = {"eps": args.batch_eps, "trust": "secagg", "users": args.secagg_users or args.users,
                "round_size": args.round_size, "delta": args.delta}
        jobs = [{**base, "algorithm": a, "seed": s, "dropout": p, "bits_given": 0,
                 "trust_options": {"dropout": p, "below": "report", "neighbours": 0}}
                for a in ("ldp-ols", "ldp-sgd") for p in args.dropouts for s in range(args.seeds)]
        jobs += [{**base, "algorithm": a, "seed": s, "dropout": 0.0, "bits_given": b, "trust_options": {"bits": b}}
                 for a in ("ldp-ols", "ldp-sgd") for b in args.bits for s in range(args.seeds)]
        print(f"part 4: {len(jobs)} runs (secagg: drop-outs {list(args.dropouts)}, bits {list(args.bits)})",
              flush=True)
        secure = run_jobs(jobs, args.workers)
    parts = [runs.assign(part="eps"), *([batch.assign(part="batch")] if batch is not None else []),
             *([horizons.assign(part="horizon")] if horizons is not None else []),
             *([secure.assign(part="secagg")] if secure is not None else [])]
    pd.concat(parts).to_csv(args.out / "runs.csv", index=False)
    text = [f"`python jobs/trust_experiment.py {' '.join(sys.argv[1:] if argv is None else argv)}`".replace(" `", "`"),
            f"T = {args.users:,}, delta = {args.delta:g}, {args.seeds} seeds, B = {args.round_size:,}; "
            f"{time.perf_counter() - started:,.0f} s wall clock, {args.workers} workers.", "",
            *eps_table(runs)]
    if batch is not None:
        text += ["", f"ldp-sgd (linear, d = 10, K = 10) at central eps {args.batch_eps:g}, over the round size:", "",
                 *batch_table(batch)]
    if horizons is not None:
        text += ["", f"Final regret over T, B = {args.round_size:,} (median over seeds; slope of log median regret "
                     f"over log T):", "", *horizon_table(horizons)]
    if secure is not None:
        text += ["", f"Secure aggregation at central eps {args.batch_eps:g}, T = {args.secagg_users or args.users:,}, "
                     f"B = {args.round_size:,}: final regret "
                     f"(median [IQR] over seeds) and the reported eps against the drop-outs before sending (shares "
                     f"calibrated for every user; below=report), then against the bits (0 drop-outs):", "",
                 *secagg_table(secure)]
        secagg_plot(secure, args.out)
    (args.out / "tables.md").write_text("\n".join(text) + "\n")
    plots(runs, batch, args.out, horizons)
    print("\n".join(text))
    print(f"written: {args.out}/runs.csv, tables.md, plots/")
    return 0


if __name__ == "__main__":
    sys.exit(main())

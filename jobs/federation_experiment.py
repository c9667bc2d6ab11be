#!/usr/bin/env python
"""What an uneven federation does to the papers' algorithms: regret over uniform play against the dropout rate,
the mean delay of messages and the populations' heterogeneity, each against the ideal federation.

    python jobs/federation_experiment.py                                 # docs/federation-experiments.md (~30 min)
    python jobs/federation_experiment.py --users 1e6 --round-size 1000 --round-sizes sw-klucb-cf=100
    python jobs/federation_experiment.py --users 2e4 --seeds 2 --algorithms ldp-sgd,ldp-mab-ucb   # a minute
    python jobs/federation_experiment.py --replot                        # redraw the plots from OUT/runs.csv

Three axes, each a federation model (docs/federation.md) against the ideal one (every user answers, at once):
(a) dropouts: `availability` with p = 1 - rate (an absent user neither acts nor sends); (b) delay: `latency` with
latency=0 and reward_delay = the mean delay in rounds (geometric law: most messages on time, a long tail; a
message due after the last round is never folded); (c) heterogeneity: `heterogeneous` with `spread` (each
population's world drawn around the run's; regret against each population's own best arm), run only when that
model is registered. The ideal run is every axis's point 0.

The metric: the run's final cumulative regret divided by the final regret of the `uniform` algorithm on the same
env, round size, populations, federation (with its options) and seed, so that a federation that serves fewer
users, or whose populations want other arms, is measured against uniform play under the same federation. Mean and
standard error over the seeds of that ratio. Every algorithm runs under --trust (local, shuffle, central) where
the trust model takes it: a refused combination (a ConfigError: the model, the algorithm or the federation says
why) is listed as refused with its reason. Under shuffle with dropouts the batch is planned on the whole round
and a round whose senders fall below it runs at its real guarantee (trust option below=report): its reported eps
(the worst round's) is in the table. Runs in a pool of --workers processes, one BLAS thread each; a progress line
every 5% of the runs.

Writes under --out (default results/federation): runs.csv (one row per run of a learner, beside it the uniform
run it is compared with; the cumulative regret of both at every tenth of the users), ratios.csv (one row per algorithm,
trust, axis and point: mean and standard error of the ratio), tables.md, plots/dropout.png, plots/delay.png,
plots/spread.png.
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

TRUSTS = ("local", "shuffle", "central")
STYLES = {"local": "-", "shuffle": "--", "central": ":"}
MARKERS = "os^"
# The main algorithm(s) of each of the five papers (the `paper` attribute of each class), on its paper's env.
ALGORITHMS = {
    "ldp-sgd": "000",
    "ldp-ols": "000",
    "linucb-dgs": "001",
    "ldp-mab-ucb": "002",
    "ldp-mab-adversarial": "002",
    "private-lasso": "003",
    "sw-klucb-cf": "004",
}
# private-lasso plays like uniform at eps <= 64 on its paper's world (REPRODUCTION.md, paper 003: its private
# support stays empty), so its ratio is 1 under any federation, and one run costs ~40 s: not run by default.
DEFAULT_ALGORITHMS = ("ldp-sgd", "ldp-ols", "linucb-dgs", "ldp-mab-ucb", "ldp-mab-adversarial", "sw-klucb-cf")
# sw-klucb-cf's window at T = 1e5 is 348 users: rounds of more than a tenth of it break it before any federation
# does (its round_size_caveat), so it runs at its own round size.
ROUND_SIZES = "sw-klucb-cf=10"
TENTHS = range(1, 11)
AXES = {"dropout": "availability", "delay": "latency", "spread": "heterogeneous"}
AXIS_LABELS = {"dropout": "dropout rate (availability p = 1 - rate)",
               "delay": "mean delay of a message (rounds; latency model, reward_delay)",
               "spread": "heterogeneity spread (heterogeneous model)"}


def federation_of(axis: str, x: float) -> tuple[str, dict]:
    """The federation model and options of a point of an axis (x = 0: the ideal federation)."""
    if axis == "ideal" or x == 0:
        return "ideal", {}
    if axis == "dropout":
        return "availability", {"p": round(1.0 - x, 10)}
    if axis == "delay":
        return "latency", {"latency": 0.0, "reward_delay": float(x)}
    return "heterogeneous", {"spread": float(x)}


def _one(job: dict) -> dict:
    """One run: its final regret and what the federation did (users served, messages never folded), or why the
    config was refused."""
    from ldpfed.config import RunConfig
    from ldpfed.engine import run
    from ldpfed.util.errors import ConfigError

    federation, options = federation_of(job["axis"], job["x"])
    trust_options = {"below": "report"} if job["trust"] == "shuffle" and job["axis"] == "dropout" else {}
    started = time.process_time()
    try:
        config = RunConfig(job["algorithm"], env=job["env"], users=job["users"], round_size=job["round_size"],
                           populations=job["populations"], eps=job["eps"], delta=job["delta"], seed=job["seed"],
                           trust=job["trust"], trust_options=trust_options, federation=federation,
                           federation_options=options)
        result = run(config)
    except ConfigError as error:
        return {**job, "refused": f"{error.field}: {error.reason}"}
    s, table = result.summary, result.table
    # the cumulative regret when each tenth of the users has arrived: where a curve bends
    ends = np.searchsorted(table["users"].to_numpy(), [job["users"] * k / 10 for k in TENTHS])
    tenths = {f"regret_at_{k}0pct": float(table["cumulative_regret"].iloc[min(i, len(table) - 1)])
              for k, i in zip(TENTHS, ends)}
    return {**job, **tenths, "final_regret": s["final_regret"],
            "users_served": s.get("total_users_served", job["users"]),
            "never_folded": s.get("late_messages_never_folded", 0),
            "eps_reported": s.get("privacy_eps_composed", job["eps"]), "cpu_s": time.process_time() - started,
            "refused": ""}


def _pool_init():
    os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = "1"


def run_jobs(jobs: list[dict], workers: int) -> pd.DataFrame:
    """Every job, in a pool of `workers` processes (0: in this process), with a progress line every 5%."""
    rows, started, step = [], time.perf_counter(), max(1, len(jobs) // 20)
    pool = ProcessPoolExecutor(max_workers=workers, initializer=_pool_init) if workers > 0 else None
    try:
        for row in (pool.map(_one, jobs, chunksize=1) if pool else map(_one, jobs)):
            rows.append(row)
            if len(rows) % step == 0 or len(rows) == len(jobs):
                elapsed = time.perf_counter() - started
                left = elapsed / len(rows) * (len(jobs) - len(rows))
                print(f"  {len(rows)}/{len(jobs)} runs, {elapsed:,.0f} s, about {left:,.0f} s left", flush=True)
    finally:
        if pool:
            pool.shutdown()
    return pd.DataFrame(rows)


def plan(algorithms, trusts, points: dict, seeds: int, users: int, round_size: int, round_sizes: dict,
         populations: int, eps: float, delta: float) -> list[dict]:
    """The runs: every algorithm x trust x point x seed on the algorithm's paper env, and one uniform run per env,
    round size, point and seed it is compared with. points: {axis: [x, ...], "ideal": [0.0]}."""
    from ldpfed.algorithms import REGISTRY

    base = {"users": users, "populations": populations, "eps": eps, "delta": delta}
    jobs, uniform = [], set()
    for algorithm in algorithms:
        B = round_sizes.get(algorithm, round_size)
        env = REGISTRY[algorithm].default_env
        for axis, xs in points.items():
            for x in xs:
                for seed in range(seeds):
                    jobs += [{**base, "algorithm": algorithm, "env": env, "trust": t, "axis": axis, "x": x,
                              "seed": seed, "round_size": B} for t in trusts]
                    uniform.add((env, B, axis, x, seed))
    jobs += [{**base, "algorithm": "uniform", "env": env, "trust": "local", "axis": axis, "x": x,
              "seed": seed, "round_size": B} for env, B, axis, x, seed in sorted(uniform)]
    # the slowest runs first (small rounds, late messages), so the pool does not end on one long run
    return sorted(jobs, key=lambda j: (j["round_size"], j["axis"] != "delay"))


def ratios(runs: pd.DataFrame) -> pd.DataFrame:
    """Each run's ratio: its final regret over the uniform run's on the same env, round size, federation and seed."""
    tenths = [f"regret_at_{k}0pct" for k in TENTHS]
    uniform = runs[runs["algorithm"] == "uniform"][["env", "round_size", "axis", "x", "seed", "final_regret",
                                                     "users_served", *tenths]]
    uniform = uniform.rename(columns={"final_regret": "uniform_regret", "users_served": "uniform_served",
                                      **{t: f"uniform_{t}" for t in tenths}})
    learners = runs[runs["algorithm"] != "uniform"]
    ok = learners[learners["refused"] == ""].merge(uniform, on=["env", "round_size", "axis", "x", "seed"],
                                                   how="left", validate="many_to_one")
    ok["ratio"] = ok["final_regret"] / ok["uniform_regret"]
    return with_tenths(pd.concat([ok, learners[learners["refused"] != ""]], ignore_index=True))


def with_tenths(per_run: pd.DataFrame) -> pd.DataFrame:
    """Each run's regret over uniform's within each tenth of the users (tenth_1 .. tenth_10): where a curve bends."""
    per_run = per_run.copy()
    for k in TENTHS:
        before = ((per_run[f"regret_at_{k - 1}0pct"], per_run[f"uniform_regret_at_{k - 1}0pct"]) if k > 1 else
                  (0.0, 0.0))
        per_run[f"tenth_{k}"] = ((per_run[f"regret_at_{k}0pct"] - before[0])
                                 / (per_run[f"uniform_regret_at_{k}0pct"] - before[1]))
    return per_run


def summary(per_run: pd.DataFrame) -> pd.DataFrame:
    """Mean and standard error over seeds of the ratio, per algorithm, trust, axis and point (refused: the reason)."""
    rows = []
    for (algorithm, trust, axis, x), g in per_run.groupby(["algorithm", "trust", "axis", "x"], sort=True):
        ok = g[g["refused"] == ""]
        r = ok["ratio"].to_numpy(dtype=float)
        rows.append({"algorithm": algorithm, "trust": trust, "axis": axis, "x": x,
                     "round_size": int(g["round_size"].iloc[0]), "seeds": len(r),
                     "ratio": r.mean() if len(r) else np.nan,
                     "se": r.std(ddof=1) / np.sqrt(len(r)) if len(r) > 1 else np.nan,
                     "regret": ok["final_regret"].mean() if len(r) else np.nan,
                     "uniform_regret": ok["uniform_regret"].mean() if len(r) else np.nan,
                     "served": ok["users_served"].mean() / g["users"].iloc[0] if len(r) else np.nan,
                     "never_folded": ok["never_folded"].mean() / g["users"].iloc[0] if len(r) else np.nan,
                     "eps_reported": ok["eps_reported"].max() if len(r) else np.nan,
                     **{f"tenth_{k}": ok[f"tenth_{k}"].mean() if len(r) else np.nan for k in TENTHS},
                     "refused": "" if len(r) else g["refused"].iloc[0]})
    return pd.DataFrame(rows)


def _with_ideal(table: pd.DataFrame, axis: str) -> pd.DataFrame:
    """An axis's rows with the ideal run as its point 0."""
    return pd.concat([table[table["axis"] == "ideal"].assign(axis=axis), table[table["axis"] == axis]])


def _cell(row) -> str:
    if row["refused"]:
        return "refused"
    text = f"{row['ratio']:.3f} ± {row['se']:.3f}" if np.isfinite(row["se"]) else f"{row['ratio']:.3f}"
    if row["trust"] == "shuffle" and row["eps_reported"] > row.get("eps", 0) + 1e-9 and row["axis"] != "ideal":
        text += f" (eps {row['eps_reported']:.2f})"
    return text


def axis_table(table: pd.DataFrame, axis: str, eps: float) -> list[str]:
    """Rows algorithm x trust, columns the axis' points: mean ± standard error of regret over uniform (shuffle
    under dropouts: the reported eps where it exceeds the target); each refusal's reason once, below the table."""
    rows = _with_ideal(table, axis).assign(eps=eps)
    xs = sorted(rows["x"].unique())
    head = {"dropout": lambda x: f"{x:.0%}", "delay": lambda x: f"{x:g} rounds", "spread": lambda x: f"{x:g}"}[axis]
    lines = ["| algorithm (paper) | trust | B | " + " | ".join(head(x) for x in xs) + " |", "|---" * (3 + len(xs)) + "|"]
    reasons: dict[str, int] = {}
    order = {a: i for i, a in enumerate(ALGORITHMS)}
    rows = rows.assign(_a=rows["algorithm"].map(order), _t=rows["trust"].map(TRUSTS.index))
    for (_, _, algorithm, trust), g in rows.groupby(["_a", "_t", "algorithm", "trust"], sort=True):
        by = {r["x"]: r for _, r in g.iterrows()}
        cells = []
        for x in xs:
            if x not in by:
                cells.append("-")
            elif by[x]["refused"]:
                cells.append(f"refused ({reasons.setdefault(by[x]['refused'], len(reasons) + 1)})")
            else:
                cells.append(_cell(by[x]))
        lines.append(f"| {algorithm} ({ALGORITHMS.get(algorithm, '?')}) | {trust} | {g['round_size'].iloc[0]:,} | "
                     + " | ".join(cells) + " |")
    if reasons:
        lines.append("")
    lines += [f"({n}) {reason}  " for reason, n in reasons.items()]
    return lines


def accrual_table(table: pd.DataFrame, axis: str) -> list[str]:
    """Where the curves bend: regret over uniform's within each tenth of the users (mean over seeds), at the ideal
    point and at the axis' last point, per algorithm and trust."""
    rows = _with_ideal(table, axis)
    rows = rows[rows["refused"] == ""]
    last = rows["x"].max()
    lines = ["| algorithm | trust | point | " + " | ".join(f"{k}0%" for k in TENTHS) + " |",
             "|---" * (3 + len(TENTHS)) + "|"]
    for algorithm in [a for a in ALGORITHMS if a in set(rows["algorithm"])]:
        for trust in TRUSTS:
            g = rows[(rows["algorithm"] == algorithm) & (rows["trust"] == trust)].set_index("x")
            for x in (0.0, last):
                if x in g.index:
                    lines.append(f"| {algorithm} | {trust} | {'ideal' if x == 0 else f'{axis} {x:g}'} | "
                                 + " | ".join(f"{g.loc[x, f'tenth_{k}']:.3f}" for k in TENTHS) + " |")
    return lines


def axis_plot(table: pd.DataFrame, axis: str, path: Path, users: int) -> None:
    """One panel per algorithm, a line per trust model: regret over uniform against the axis (point 0: ideal)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    every = _with_ideal(table, axis)
    rows = every[every["refused"] == ""]
    algorithms = [a for a in ALGORITHMS if a in set(rows["algorithm"])]
    columns = min(3, len(algorithms))
    lines = -(-len(algorithms) // columns)
    fig, axes = plt.subplots(lines, columns, figsize=(4.4 * columns, 3.4 * lines), squeeze=False)
    ticks = sorted(rows["x"].unique())
    label = {"dropout": lambda t: f"{t:.0%}", "delay": lambda t: f"{t:g}", "spread": lambda t: f"{t:g}"}[axis]
    for ax, algorithm in zip(axes.flat, algorithms):
        for i, trust in enumerate(TRUSTS):
            g = rows[(rows["algorithm"] == algorithm) & (rows["trust"] == trust)].sort_values("x")
            if len(g):
                ax.errorbar(g["x"], g["ratio"], yerr=g["se"].fillna(0), linestyle=STYLES[trust], marker=MARKERS[i],
                            color=f"C{i}", capsize=3, markersize=5, label=trust)
            refused = every[(every["algorithm"] == algorithm) & (every["trust"] == trust) & (every["refused"] != "")]
            if len(refused):
                where = "everywhere" if not len(g) else "at " + ", ".join(label(x) for x in sorted(refused["x"]))
                ax.plot([], [], " ", label=f"{trust}: refused {where}")
        B = int(rows[rows["algorithm"] == algorithm]["round_size"].iloc[0])
        ax.axhline(1.0, color="grey", linewidth=0.8)
        if axis == "delay":
            ax.set_xscale("symlog", linthresh=1)
            ax.set_xlim(-0.2, max(ticks) * 1.3)
        ax.set_xticks(ticks, [label(t) for t in ticks])
        ax.minorticks_off()
        ax.set_ylim(bottom=0, top=max(1.15, ax.get_ylim()[1]))
        ax.set_title(f"{algorithm} (paper {ALGORITHMS[algorithm]}), B = {B:,}", fontsize=10)
        ax.set_xlabel(AXIS_LABELS[axis], fontsize=8)
        ax.set_ylabel("regret / uniform's (mean ± s.e.)", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(algorithms):]:
        ax.axis("off")
    fig.suptitle(f"{AXES[axis]} federation against the ideal one (point 0), T = {users:,}; grey: uniform play")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def experiment(algorithms=DEFAULT_ALGORITHMS, trusts=TRUSTS, dropouts=(0.1, 0.3, 0.5),
               delays=(1, 10, 30, 100), spreads=(0.1, 0.2, 0.4), seeds=3, users=100_000, round_size=100,
               round_sizes=None, populations=2, eps=1.0, delta=0.01, workers=2) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run every point; returns (runs with their ratios, the summary per algorithm, trust, axis and point)."""
    from ldpfed.federation import FEDERATIONS

    if spreads and "heterogeneous" not in FEDERATIONS:
        print("heterogeneity axis skipped: no 'heterogeneous' federation model is registered", flush=True)
        spreads = ()
    points = {"ideal": [0.0]}          # every axis's point 0
    for axis, xs in (("dropout", dropouts), ("delay", delays), ("spread", spreads)):
        if [x for x in xs if x]:
            points[axis] = [float(x) for x in xs if x]
    jobs = plan(algorithms, trusts, points, seeds, users, round_size, dict(round_sizes or {}), populations, eps,
                delta)
    runs = run_jobs(jobs, workers)
    per_run = ratios(runs)
    return per_run, summary(per_run)


def _floats(text):
    return tuple(float(x) for x in text.split(",") if x.strip())


def _round_sizes(text) -> dict:
    return {k.strip(): int(float(v)) for k, v in (part.split("=") for part in text.split(",") if part.strip())}


def write(per_run: pd.DataFrame, table: pd.DataFrame, out: Path, header: list[str], eps: float, users: int) -> str:
    per_run.to_csv(out / "runs.csv", index=False)
    table.to_csv(out / "ratios.csv", index=False)
    text = list(header)
    for axis in AXES:
        if (table["axis"] == axis).any():
            text += ["", f"### {axis}: regret over uniform play (mean ± s.e. over seeds)", "",
                     *axis_table(table, axis, eps), "", "Regret over uniform's within each tenth of the users "
                     "(the tenth ending at the column's share of T; mean over seeds), at the ideal point and the last:", "", *accrual_table(table, axis)]
            axis_plot(table, axis, out / "plots" / f"{axis}.png", users)
    (out / "tables.md").write_text("\n".join(text) + "\n")
    return "\n".join(text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithms", default=",".join(DEFAULT_ALGORITHMS),
                        help=f"comma-separated, from {list(ALGORITHMS)}")
    parser.add_argument("--trust", default=",".join(TRUSTS), help="comma-separated trust models")
    parser.add_argument("--users", type=lambda t: int(float(t)), default=100_000, help="T (1e6 for the big run)")
    parser.add_argument("--round-size", type=lambda t: int(float(t)), default=100, help="users per round B")
    parser.add_argument("--round-sizes", type=_round_sizes, default=_round_sizes(ROUND_SIZES),
                        help="per-algorithm round sizes, name=B,... (default %(default)s)")
    parser.add_argument("--populations", type=int, default=2)
    parser.add_argument("--eps", type=float, default=1.0)
    parser.add_argument("--delta", type=float, default=0.01)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--dropouts", type=_floats, default=(0.1, 0.3, 0.5), help="dropout rates")
    parser.add_argument("--delays", type=_floats, default=(1, 10, 30, 100), help="mean delays, rounds")
    parser.add_argument("--spreads", type=_floats, default=(0.1, 0.2, 0.4), help="heterogeneity spreads")
    parser.add_argument("--workers", type=int, default=2, help="processes (0: this one)")
    parser.add_argument("--out", type=Path, default=Path("results/federation"))
    parser.add_argument("--replot", action="store_true", help="only rewrite tables and plots from OUT/runs.csv")
    args = parser.parse_args(argv)
    names = [a for a in args.algorithms.split(",") if a]
    trusts = [t for t in args.trust.split(",") if t]
    if set(names) - set(ALGORITHMS):
        parser.error(f"unknown algorithms {sorted(set(names) - set(ALGORITHMS))}; choose from {list(ALGORITHMS)}")
    if set(trusts) - set(TRUSTS):
        parser.error(f"unknown trust models {sorted(set(trusts) - set(TRUSTS))}; choose from {list(TRUSTS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    command = f"`python jobs/federation_experiment.py {' '.join(sys.argv[1:] if argv is None else argv)}`"
    if args.replot:
        per_run = pd.read_csv(args.out / "runs.csv", keep_default_na=False, na_values=[""])
        per_run["refused"] = per_run["refused"].astype(object).where(per_run["refused"].notna(), "")
        per_run = with_tenths(per_run)
        write(per_run, summary(per_run), args.out, [command.replace(" `", "`")], float(per_run["eps"].iloc[0]),
              int(per_run["users"].iloc[0]))
        print(f"written: {args.out}/tables.md, ratios.csv, plots/")
        return 0
    started = time.perf_counter()
    per_run, table = experiment(names, trusts, args.dropouts, args.delays, args.spreads, args.seeds, args.users,
                                args.round_size, args.round_sizes, args.populations, args.eps, args.delta,
                                args.workers)
    header = [command.replace(" `", "`"),
              f"T = {args.users:,}, B = {args.round_size:,} (" + ", ".join(f"{k} {v:,}" for k, v in
                                                                       args.round_sizes.items()) + f"), "
              f"{args.populations} populations, eps = {args.eps:g}, delta = {args.delta:g}, {args.seeds} seeds; "
              f"{time.perf_counter() - started:,.0f} s wall clock, {args.workers} workers, "
              f"{per_run['cpu_s'].sum():,.0f} s of CPU in the learners' runs."]
    print(write(per_run, table, args.out, header, args.eps, args.users))
    print(f"written: {args.out}/runs.csv, ratios.csv, tables.md, plots/")
    return 0


if __name__ == "__main__":
    sys.exit(main())

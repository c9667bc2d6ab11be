#!/usr/bin/env python3
"""What an uneven federation does to the papers' algorithms: regret over uniform play against the dropout rate, the
mean delay of a reward and the populations' heterogeneity, under the local, shuffle and central trust models.

    python jobs/federation_experiment.py                       # the default setting (docs/federation-experiments.md)
    python jobs/federation_experiment.py --users 1000000 --seeds 3 --out results/federation-1e6
    python jobs/federation_experiment.py --axes dropout --algorithms ldp-sgd --trusts local,central

Per point: the algorithm's final cumulative regret over the `uniform` algorithm's under the same federation model,
env and seed (absent users act for neither), the mean over the seeds and its standard error. Axes:
  dropout  availability p = 1 - rate (drop before acting); the shuffle model plans its batch on
           min_participants = 0.4 of the senders and reports a round below it at its real guarantee;
  delay    latency model: rewards come reward_delay rounds late on average (geometric), no network latency;
  spread   heterogeneous model: each of the populations' worlds drawn at that spread around the run's.
A combination the system refuses (a trust model an algorithm does not run under, late messages under shuffle) is
a row with the reason. Writes OUT/federation.csv, OUT/federation.md and OUT/regret_vs_{axis}.png.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from ldpfed.config import RunConfig
from ldpfed.engine import run_local
from ldpfed.util.errors import ConfigError

# The main algorithm of each paper, with the trust models it is run under here (the central-DP algorithms add
# their own server noise: the trust model is theirs).
# private-lasso (seed 003) takes ~200 s a run at 1e5 users on the project's machine (a LASSO solve per round):
# give it with --algorithms private-lasso when there is time.
ALGORITHMS = {"ldp-sgd": ("local", "shuffle", "central"), "ldp-mab-ucb": ("local", "shuffle", "central"),
              "linucb-dgs": ("local",), "sw-klucb-cf": ("local", "central"), "private-lasso": ("local",)}
DEFAULT_ALGORITHMS = ("ldp-sgd", "ldp-mab-ucb", "linucb-dgs", "sw-klucb-cf")
AXES = {"dropout": [0.0, 0.17, 0.33, 0.5], "delay": [0, 3, 30, 100], "spread": [0.0, 0.3, 1.0]}


def federation_of(axis: str, value) -> tuple[str, dict]:
    if axis == "dropout":
        return ("ideal", {}) if value == 0 else ("availability", {"p": round(1.0 - value, 6)})
    if axis == "delay":
        return ("ideal", {}) if value == 0 else ("latency", {"latency": 0.0, "reward_delay": float(value)})
    return "heterogeneous", {"spread": float(value)}


def trust_options(trust: str, federation: str) -> dict:
    return {"min_participants": 0.4, "below": "report"} if trust == "shuffle" and federation != "ideal" else {}


def final_regret(config: RunConfig) -> float:
    return float(run_local(config).summary["final_regret"])


def point(algorithm, trust, axis, value, users, round_size, populations, seed, uniform_cache) -> dict:
    federation, options = federation_of(axis, value)
    row = {"algorithm": algorithm, "trust": trust, "axis": axis, "value": value, "seed": seed}
    try:       # refused when the config is made, or when the trust model builds the algorithm
        config = RunConfig(algorithm, users=users, round_size=round_size, populations=populations, seed=seed,
                           trust=trust, trust_options=trust_options(trust, federation), federation=federation,
                           federation_options=options)
        regret = final_regret(config)
    except ConfigError as error:
        return {**row, "refused": str(error)}
    key = (config.env, axis, value, seed)
    if key not in uniform_cache:
        uniform_cache[key] = final_regret(RunConfig("uniform", env=config.env, users=users, round_size=round_size,
                                                    populations=populations, seed=seed, federation=federation,
                                                    federation_options=options))
    return {**row, "regret": regret, "uniform": uniform_cache[key], "ratio": regret / uniform_cache[key]}


def summarize(rows: pd.DataFrame) -> pd.DataFrame:
    ran = rows[rows["ratio"].notna()] if "ratio" in rows else rows.iloc[0:0]
    table = ran.groupby(["axis", "algorithm", "trust", "value"])["ratio"].agg(["mean", "std", "count"]).reset_index()
    table["stderr"] = table["std"].fillna(0.0) / np.sqrt(table["count"])
    return table


def plot(table: pd.DataFrame, axis: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    label = {"dropout": "dropout rate (availability 1 - p)", "delay": "mean reward delay (rounds)",
             "spread": "heterogeneity spread (each population's world around the run's)"}[axis]
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for (algorithm, trust), part in table[table["axis"] == axis].groupby(["algorithm", "trust"]):
        part = part.sort_values("value")
        ax.errorbar(part["value"], part["mean"], yerr=part["stderr"], marker="o", capsize=3,
                    label=f"{algorithm} ({trust})")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel(label)
    ax.set_ylabel("final regret / uniform play's")
    if axis == "delay":
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlim(-0.1, table["value"][table["axis"] == axis].max() * 1.3)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(f"regret over uniform play against the {axis}")
    fig.tight_layout()
    fig.savefig(out / f"regret_vs_{axis}.png", dpi=110)
    plt.close(fig)


def markdown(table: pd.DataFrame, refused: pd.DataFrame) -> str:
    lines = []
    for axis in table["axis"].unique():
        part = table[table["axis"] == axis]
        values = sorted(part["value"].unique())
        lines += [f"### {axis}", "", "| algorithm | trust | " + " | ".join(f"{v:g}" for v in values) + " |",
                  "|---|---|" + "---|" * len(values)]
        for (algorithm, trust), group in part.groupby(["algorithm", "trust"]):
            cells = {row.value: f"{row.mean:.3f} ± {row.stderr:.3f}" for row in group.itertuples()}
            lines.append(f"| {algorithm} | {trust} | " + " | ".join(cells.get(v, "-") for v in values) + " |")
        lines.append("")
    if len(refused):
        lines += ["### refused", "", "| algorithm | trust | axis | why |", "|---|---|---|---|"]
        for row in refused.drop_duplicates(["algorithm", "trust", "axis"]).itertuples():
            lines.append(f"| {row.algorithm} | {row.trust} | {row.axis} | {row.refused.split(': ', 1)[-1][:160]} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=lambda t: int(float(t)), default=100_000)
    parser.add_argument("--round-size", type=int, default=500, help="users per round (a delay is in rounds)")
    parser.add_argument("--populations", type=int, default=4)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--axes", default=",".join(AXES))
    parser.add_argument("--algorithms", default=",".join(DEFAULT_ALGORITHMS))
    parser.add_argument("--trusts", default="local,shuffle,central")
    parser.add_argument("--out", type=Path, default=Path("results/federation"))
    parser.add_argument("--replot", action="store_true", help="the table and plots again from OUT/federation.csv")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.replot:
        frame = pd.read_csv(args.out / "federation.csv")
        return report(frame, args.out)
    trusts = set(args.trusts.split(","))
    jobs = [(a, t, axis, v, s) for axis in args.axes.split(",") for a in args.algorithms.split(",")
            for t in ALGORITHMS.get(a, ("local",)) if t in trusts for v in AXES[axis] for s in range(args.seeds)]
    rows, cache, began = [], {}, time.perf_counter()
    for i, (algorithm, trust, axis, value, seed) in enumerate(jobs, 1):
        rows.append(point(algorithm, trust, axis, value, args.users, args.round_size, args.populations, seed, cache))
        print(f"\r[{i}/{len(jobs)}] {algorithm} {trust} {axis}={value} seed {seed}  "
              f"({time.perf_counter() - began:.0f} s)", end="", flush=True)
    print()
    frame = pd.DataFrame(rows)
    frame.to_csv(args.out / "federation.csv", index=False)
    report(frame, args.out)
    print(f"{len(jobs)} runs in {time.perf_counter() - began:.0f} s; written to {args.out}")
    return 0


def report(frame: pd.DataFrame, out: Path) -> int:
    """The Markdown table and the plots of a run's rows."""
    table = summarize(frame)
    refused = frame[frame["refused"].notna()] if "refused" in frame else frame.iloc[0:0]
    (out / "federation.md").write_text(markdown(table, refused))
    for axis in table["axis"].unique():
        plot(table, axis, out)
    print((out / "federation.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

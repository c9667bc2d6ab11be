"""The statistics of the claims tables: spreads over seeds, one-sided tests, log-log slopes, markdown tables."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ldpfed.algorithms import REGISTRY
from ldpfed.reproduce.papers import VARIANTS


def spread(values) -> str:
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return "n/a"
    q1, med, q3 = np.quantile(v, [0.25, 0.5, 0.75])
    return f"{num(med)} [{num(q1)} - {num(q3)}]"


def num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def values(runs, algorithm, eps=None, profile="paper", part="main", column="final_regret", env=None, label=None):
    sel = (runs["part"] == part) & (runs["algorithm"] == algorithm) & (runs["profile"] == profile)
    if label is not None:
        sel &= runs["label"] == label
    if eps is not None and REGISTRY[VARIANTS.get(algorithm, (algorithm,))[0]].privacy_model != "none":
        sel &= np.isclose(runs["eps"], eps)
    if env is not None:
        sel &= runs["env"] == env
    return runs.loc[sel, column].astype(float).dropna().to_numpy()


def less(a, b) -> tuple[bool, float]:
    """a < b: medians ordered and a one-sided Mann-Whitney test at 5%."""
    from scipy.stats import mannwhitneyu

    if len(a) == 0 or len(b) == 0:
        return False, float("nan")
    p = float(mannwhitneyu(a, b, alternative="less").pvalue)
    return bool(np.median(a) < np.median(b) and p < 0.05), p


def slope_table(runs) -> pd.DataFrame:
    """Per algorithm: per-seed least-squares slope of log final regret on log T; median and quartiles."""
    rows = []
    data = runs[runs["part"] == "slope"]
    for (algorithm, env), group in data.groupby(["algorithm", "env"]):
        per_seed = []
        for _, g in group.groupby("seed"):
            g = g.sort_values("users")
            y = g["final_regret"].astype(float).to_numpy()
            if len(g) >= 2 and np.all(y > 0):
                per_seed.append(np.polyfit(np.log(g["users"].astype(float)), np.log(y), 1)[0])
        med = group.groupby("users")["final_regret"].median()
        fit = np.polyfit(np.log(med.index.astype(float)), np.log(med.to_numpy(dtype=float)), 1)[0] \
            if len(med) >= 2 and (med > 0).all() else float("nan")
        rows.append({"algorithm": algorithm, "env": env, "T": ", ".join(f"{int(t):,}" for t in med.index),
                     "seeds": group["seed"].nunique(), "slope_of_medians": round(float(fit), 3),
                     "per_seed_slopes": spread(per_seed) if per_seed else "n/a",
                     "medians": ", ".join(num(v) for v in med.to_numpy(dtype=float))})
    return pd.DataFrame(rows)


def markdown(rows: list[dict], columns: list[str]) -> str:
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        out.append("| " + " | ".join(str(r.get(c, "")).replace("|", "/").replace("\n", " ") for c in columns) + " |")
    return "\n".join(out)


def batching_markdown(runs: pd.DataFrame, command: str, seeds: int) -> str:
    """The batching table: per algorithm and round size B, the final regret, its ratio to B = 1 and a verdict:
    "changed" if a two-sided Mann-Whitney test against B = 1 rejects at 5%; "same" if it does not AND the median
    ratio is within [2/3, 3/2]; else "inconclusive" (a large ratio that the seeds cannot confirm)."""
    from scipy.stats import mannwhitneyu

    table = []
    for algorithm, group in runs.groupby("algorithm"):
        base = group[group["round_size"] == 1]["final_regret"].astype(float).to_numpy()
        for B, g in group.groupby("round_size"):
            v = g["final_regret"].astype(float).to_numpy()
            ratio = float(np.median(v) / np.median(base)) if len(base) else float("nan")
            if B == 1 or not len(base):
                verdict = "reference"
            else:
                p = float(mannwhitneyu(v, base, alternative="two-sided").pvalue)
                verdict = f"p={p:.2g}: " + ("changed" if p < 0.05 else "same" if 2 / 3 <= ratio <= 1.5
                                            else "inconclusive")
            table.append({"algorithm": algorithm, "env": g["env"].iloc[0], "T": f"{int(g['users'].iloc[0]):,}",
                          "round size": f"{int(B):,}",
                          "final regret": spread(v), "ratio to B=1 (medians)": f"{ratio:.2f}",
                          "verdict (Mann-Whitney vs B=1)": verdict, "CPU s / run": f"{g['cpu_s'].median():.1f}"})
    return (f"`{command}`: eps = 1, {seeds} seeds, {len(runs)} simulations, {runs['cpu_s'].sum() / 60:,.1f} "
            f"CPU-minutes of simulation.\n\n" + markdown(table, list(table[0])) + "\n")

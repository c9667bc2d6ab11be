#!/usr/bin/env python
"""Reproduce the five papers: each paper's experiments on its setting, a claims table, curves, slopes.

    python jobs/reproduce.py --paper 000 --quick        # minutes: 3 seeds, small T (a smoke run of the pipeline)
    python jobs/reproduce.py --paper all                # the full reproduction (see REPRODUCTION.md for its cost)
    python jobs/reproduce.py --batching                 # the price of batching (round sizes 1 .. 10,000)

Per paper, one MLflow parent run (experiment "reproduce", sweep "paper-<id>", one child run per simulation, as
jobs/run_all.py), and under results/reproduce/paper-<id>/:
    claims.md            the claims table: claim quoted from the paper (/work/shared/seeds/), the measured figure
                         with its spread (median [25%-75%] over seeds), reproduced or not, why not
    slopes.md            log-log slope of the final regret over T (per-seed fit, median [quartiles]) next to the
                         theory's rate
    plots/regret_curves.png    cumulative regret, median over seeds with a 25-75% band, a panel per (world,
                               profile, eps)
    plots/final_regret_vs_eps.png, plots/slopes.png
    runs.csv             one row per simulation (what the tables are computed from)
Profiles: both "paper" and "authors-code" where they differ (seed 000's algorithms); the other papers have no
public code, so only "paper". Round size: 10 users per round (the papers are sequential; the price-of-batching
table in REPRODUCTION.md shows where B = 10 leaves the regret unchanged, and B = 1 costs ~300 us per user on
this machine, ~10 times B = 10); --round-size 1 runs the sequential algorithms (engine.run then uses the compiled
sequential path where it supports the algorithm).
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ldpfed.algorithms import REGISTRY
from ldpfed.config import RunConfig
from ldpfed.engine import run
from ldpfed.envs import make_env
from ldpfed.tracking import Tracker, TrackingUnavailable
from ldpfed.tracking import metric_curves, plots


# ---- what to run ------------------------------------------------------------------------------------
@dataclass
class Setting:
    """One experiment of a paper: algorithms on one world, swept over eps, profiles and seeds."""
    label: str
    env: str
    algorithms: list
    env_params: dict = field(default_factory=dict)
    eps: tuple = (0.5, 1.0)
    profiles: tuple = ("paper",)
    delta: float = 0.01
    round_size: int = 1
    params: dict = field(default_factory=dict)        # per algorithm: options
    users: int | None = None                          # T, if not the preset's
    profile_eps: dict = field(default_factory=dict)   # eps values of a profile, if not `eps`


@dataclass
class Slope:
    """Final regret at several horizons T (eps = 1): the log-log slope next to the theory's exponent."""
    algorithm: str
    env: str
    theory: float
    theory_text: str
    env_params: dict = field(default_factory=dict)
    delta: float = 0.01
    round_size: int = 1
    params: dict = field(default_factory=dict)
    T: tuple | None = None                            # the horizons, if not the preset's


SEED_FILES = {"000": "000_8e49bbe7304106c3.txt", "001": "001_ef734e0ecc6b6b32.txt",
              "002": "002_4bd54db6dba9a5a7.txt", "003": "003_0e0650e4a805769f.txt",
              "004": "004_b4c4ff454604dde5.txt"}

SINGLE = {"d": 2, "K": 10}
PIECEWISE = "piecewise Bernoulli, K=5, L_T=5"
SWAP = "swap: K=2, one change at T/2, means 0.9/0.1 then 0.4/0.6"
MULTI = {"d": 20, "K": 3}
PAPERS = {
    "000": {
        "title": "Han, Liang, Wang, Zhang 2021: Generalized Linear Bandits with Local Differential Privacy",
        "settings": [
            # both profiles everywhere: every algorithm here runs on the compiled sequential engine at B = 1
            Setting("single-parameter", "linear", ["ldp-ols", "ldp-sgd", "ldp-ucb", "ldp-gloc", "uniform"],
                    SINGLE, profiles=("paper", "authors-code")),
            Setting("multi-parameter", "linear-multi", ["ldp-ols-multi", "ldp-sgd-multi", "uniform"],
                    MULTI, eps=(1.0,), delta=0.1, profiles=("paper", "authors-code")),
        ],
        "slopes": [Slope("ldp-sgd", "linear", 0.5, "sqrt(T) (Theorem 3.1)", SINGLE),
                   Slope("ldp-ols", "linear", 0.5, "sqrt(T) (Theorem 3.1)", SINGLE)],
    },
    "001": {
        "title": "Wang, Zhao, Wang 2022: Dynamic Global Sensitivity for Differentially Private Contextual Bandits",
        "settings": [Setting("arm pool", "arm-pool", ["linucb-dgs", "linucb-dgs-paper-laplace", "private-linucb",
                                                      "linucb", "uniform"],
                             eps=(0.5, 1.0, 2.0), delta=0.1, users=30_000)],
        "slopes": [],
    },
    "002": {
        "title": "Zheng, Cai, Huang, Li, Wang 2020: Locally Differentially Private (Contextual) Bandits Learning",
        "settings": [
            Setting("BCO (strongly convex)", "convex", ["ldp-bco-two-point", "ldp-bco-one-point"], {"d": 2}),
            Setting("MAB", "bernoulli", ["ldp-mab-ucb", "ucb"], {"K": 10}),
            Setting("contextual linear", "linear", ["ldp-ucb", "uniform"], SINGLE),
            Setting("contextual logistic", "logistic", ["ldp-gloc", "uniform"], SINGLE),
        ],
        "slopes": [Slope("ldp-ucb", "linear", 0.75, "T^{3/4} (Table 1)", SINGLE),
                   Slope("ldp-gloc", "logistic", 0.75, "T^{3/4} (Table 1)", SINGLE),
                   Slope("ldp-bco-two-point", "convex", 0.0, "log T (Table 1, MP-BCO strongly convex)", {"d": 2},
                         T=(10_000, 30_000, 100_000)),
                   Slope("ldp-bco-one-point", "convex", 0.75, "T^{3/4} (Table 1, BCO convex)", {"d": 2},
                         T=(10_000, 30_000, 100_000))],
    },
    "003": {
        "title": "Shukla 2024: Differentially private LASSO bandits (PrivateLASSO)",
        "settings": [Setting("sparse linear d=1000, s0=5", "sparse-linear",
                             ["private-lasso", "lasso-bandit", "uniform"], {"d": 1000, "s0": 5, "K": 10},
                             eps=(1.0, 4.0), users=30_000)],
        "slopes": [],
        "support": {"env_params": {"d": 1000, "s0": 5, "K": 10}},
    },
    "004": {
        "title": "Gajane 2023: Local differential privacy for sequential decision making in a changing environment",
        "settings": [Setting(PIECEWISE, "piecewise-bernoulli",
                             ["sw-klucb-cf", "sw-klucb-cf-eps", "klucb-cf", "sw-klucb", "klucb"],
                             {"K": 5, "breakpoints": 4}, eps=(0.5, 1.0, 2.0)),
                     # the paper's case against stationary learners: the best arm's mean falls below the other's
                     # half-way, and its long average keeps a stationary index on it for ~T/2 users
                     Setting(SWAP, "piecewise-bernoulli", ["sw-klucb-cf", "sw-klucb-cf-eps", "klucb-cf"],
                             {"K": 2, "breakpoints": 1, "means": [[0.9, 0.1], [0.4, 0.6]]}, eps=(0.5, 1.0, 2.0))],
        "slopes": [Slope("sw-klucb-cf", "piecewise-bernoulli", 0.5, "sqrt(L_T T) (Theorem 1)",
                         {"K": 5, "breakpoints": 4})],
    },
}
# Pseudo-algorithm names: an algorithm with options (name -> (registered algorithm, params)).
VARIANTS = {"sw-klucb-cf-eps": ("sw-klucb-cf", {"window_rule": "eps-aware"}),
            # the paper's own calibration: Laplace scaled by the L2 bound Delta_e (under-noised up to sqrt(d))
            "linucb-dgs-paper-laplace": ("linucb-dgs", {"noise": "laplace", "l1_sensitivity": False})}

# What 2 shared cores allow (see REPRODUCTION.md): T = 1e5 for the main experiments (3e4 where a setting says so),
# slopes over T = 1e4 .. 1e6 where the compiled sequential engine runs the algorithm.
FULL = {"users": 100_000, "seeds": 10, "slope_T": (10_000, 100_000, 1_000_000), "slope_seeds": 3,
        "lasso_T": (10_000, 30_000), "lasso_eps": (4.0, 64.0, 1024.0, 16384.0), "lasso_seeds": 2}
QUICK = {"users": 5_000, "seeds": 3, "slope_T": (2_000, 5_000, 10_000), "slope_seeds": 3, "quick": True,
         "lasso_T": (2_000, 8_000), "lasso_eps": (4.0, 64.0), "lasso_seeds": 2}


# ---- running --------------------------------------------------------------------------------------
FALLBACK_ROUND_SIZE = 10      # round size 1 where the compiled sequential engine runs the algorithm, else this
UNIFORM_ROUND_SIZE = 1_000    # uniform play does not learn: its round size does not matter


def make_config(algorithm, env, env_params, users, round_size, eps, delta, seed, profile, params=None,
                fallback=True):
    """The RunConfig of one simulation. Round size 1 (the papers' sequential algorithms) runs on the compiled
    sequential engine (engine.run); an algorithm it does not support runs in rounds of FALLBACK_ROUND_SIZE users
    (about 10 times cheaper per user than round size 1 on the generic engine; see the price-of-batching table)."""
    from ldpfed.engine.sequential import sequential_unsupported

    base, extra = VARIANTS.get(algorithm, (algorithm, {}))
    if base == "uniform":
        round_size = UNIFORM_ROUND_SIZE
    config = RunConfig(algorithm=base, env=env, users=users, round_size=min(round_size, users), eps=eps,
                       delta=delta, seed=seed, env_params=dict(env_params), params={**extra, **(params or {})},
                       profile=profile)
    if fallback and config.round_size == 1 and sequential_unsupported(config) is not None:
        config = config.replace(round_size=min(FALLBACK_ROUND_SIZE, users))
    return config


def jobs_for(paper: dict, preset: dict) -> list[dict]:
    """Every simulation of a paper: (part, label, algorithm name as shown, config)."""
    jobs = []
    for s in paper["settings"]:
        if preset.get("round_size"):
            s = Setting(**{**s.__dict__, "round_size": preset["round_size"]})
        users = preset["users"] if (s.users is None or preset.get("quick") or preset.get("forced")) else s.users
        for profile in s.profiles:
            for name in s.algorithms:
                private = REGISTRY[VARIANTS.get(name, (name,))[0]].privacy_model != "none"
                eps_values = preset.get("eps") or s.profile_eps.get(profile, s.eps)
                for eps in (eps_values if private else eps_values[:1]):      # non-private: eps does not matter
                    for seed in range(preset["seeds"]):
                        jobs.append({"part": "main", "label": s.label, "name": name, "config": make_config(
                            name, s.env, s.env_params, users, s.round_size, eps, s.delta, seed, profile,
                            s.params.get(name))})
    for sl in paper["slopes"]:
        if preset.get("round_size"):
            sl = Slope(**{**sl.__dict__, "round_size": preset["round_size"]})
        for T in (sl.T if (sl.T and not preset.get("quick") and not preset.get("forced_T")) else preset["slope_T"]):
            for seed in range(preset["slope_seeds"]):
                jobs.append({"part": "slope", "label": sl.env, "name": sl.algorithm, "config": make_config(
                    sl.algorithm, sl.env, sl.env_params, T, sl.round_size, 1.0, sl.delta, seed, "paper", sl.params)})
    support = paper.get("support")
    if support:
        for T in preset["lasso_T"]:
            for eps in preset["lasso_eps"]:
                for seed in range(preset["lasso_seeds"]):
                    jobs.append({"part": "support", "label": "support", "name": "private-lasso", "config": make_config(
                        "private-lasso", "sparse-linear", support["env_params"], T, 10, eps, 0.01, seed, "paper")})
    return jobs


def simulate(job: dict):
    """Run one job (in a worker process); returns (job, result, cpu seconds, extra figures)."""
    start = time.process_time()
    result = run(job["config"], engine="local")
    extra = {}
    if job["config"].algorithm in ("private-lasso", "lasso-bandit") and result.state is not None:
        truth = set(make_env(job["config"]).support.tolist())
        chosen = set(np.asarray(result.state.get("support", [])).tolist())
        extra = {"support_size": len(chosen), "support_true_found": len(truth & chosen),
                 "support_exact": chosen == truth, "support_contains": truth <= chosen}
    return job, result, time.process_time() - start, extra


def row_of(job, result, cpu, extra) -> dict:
    c = job["config"]
    summary = result.summary or {}
    return {"part": job["part"], "label": job["label"], "algorithm": job["name"], "env": c.env, "profile": c.profile,
            "eps": c.eps, "delta": c.delta, "seed": c.seed, "users": c.users, "round_size": c.round_size,
            "final_regret": summary.get("final_regret"),
            "final_estimation_error": summary.get("final_estimation_error"), "cpu_s": cpu, **extra}


# ---- statistics -----------------------------------------------------------------------------------
def spread(values) -> str:
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return "n/a"
    q1, med, q3 = np.quantile(v, [0.25, 0.5, 0.75])
    return f"{_num(med)} [{_num(q1)} - {_num(q3)}]"


def _num(x: float) -> str:
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
                     "medians": ", ".join(_num(v) for v in med.to_numpy(dtype=float))})
    return pd.DataFrame(rows)


# ---- claims ---------------------------------------------------------------------------------------
def quote(paper_id: str, needle: str, width: int = 0) -> str:
    """The sentence of the paper's text that contains `needle` (checked: a claim must be quoted, not invented)."""
    text = (SEEDS_DIR / SEED_FILES[paper_id]).read_text(errors="replace")
    at = text.find(needle)
    if at < 0:
        raise KeyError(f"paper {paper_id}: quote not found: {needle!r}")
    return needle


def claim_rows(paper_id: str, runs: pd.DataFrame, slopes: pd.DataFrame) -> list[dict]:
    rows = []

    def add(claim, measured, ok, why=""):
        rows.append({"claim": claim, "measured": measured, "reproduced": "yes" if ok else "no", "why not": why})

    def slope_of(algorithm):
        hit = slopes[slopes["algorithm"] == algorithm]
        return (float(hit["slope_of_medians"].iloc[0]), hit.iloc[0]) if len(hit) else (float("nan"), None)

    def slope_claim(claim, algorithm, theory, tol=0.1):
        s, row = slope_of(algorithm)
        if row is None:
            return
        ok = s <= theory + tol
        add(claim, f"{algorithm}: slope {s:.2f} over T = {row['T']} (per seed {row['per_seed_slopes']}); "
                   f"theory {theory:g}", ok,
            "" if ok else f"measured growth faster than T^{theory:g} over this range (pre-asymptotic: see text)")

    if paper_id == "000":
        slope_claim(quote("000", "Theorem 3.1\t$\\tilde{O}(T^{1/2}/\\varepsilon)$") + " (single parameter, no margin)",
                    "ldp-sgd", 0.5)
        slope_claim("(same row, LDP-OLS)", "ldp-ols", 0.5)
        claim = quote("000", "our methods significantly outperform existing ones in all settings consistently")
        for profile in ("paper", "authors-code"):
            for eps in (0.5, 1.0):
                ours = {a: values(runs, a, eps, profile) for a in ("ldp-ols", "ldp-sgd")}
                theirs = {a: values(runs, a, eps, profile) for a in ("ldp-ucb", "ldp-gloc")}
                if not all(len(v) for v in (*ours.values(), *theirs.values())):
                    continue
                tests = [(o, t, *less(ours[o], theirs[t])) for o in ours for t in theirs]
                ok = all(t[2] for t in tests)
                failed = [f"{o} vs {t} (p={p:.2g})" for o, t, good, p in tests if not good]
                add(f"{claim} [{profile}, eps={eps:g}, single parameter]",
                    "; ".join(f"{a} {spread(v)}" for a, v in {**ours, **theirs}.items()), ok,
                    "" if ok else "not significantly lower: " + ", ".join(failed))
        claim = quote("000", "LDP-SGD achieves better performance under more stringent privacy requirements")
        for profile in ("paper", "authors-code"):
            sgd, ols = values(runs, "ldp-sgd", 0.5, profile), values(runs, "ldp-ols", 0.5, profile)
            if len(sgd) and len(ols):
                ok, p = less(sgd, ols)
                add(f"{claim} [{profile}, eps=0.5: LDP-SGD below LDP-OLS]",
                    f"ldp-sgd {spread(sgd)}; ldp-ols {spread(ols)} (Mann-Whitney p={p:.2g})", ok,
                    "" if ok else "LDP-SGD is not significantly below LDP-OLS at eps = 0.5")
        claim = quote("000", "Theorem 4.1\t$O((\\log T/\\varepsilon)^2)$") + " (multi-parameter)"
        for profile in ("paper", "authors-code"):
            uni = values(runs, "uniform", None, profile, env="linear-multi")
            for a in ("ldp-ols-multi", "ldp-sgd-multi"):
                v = values(runs, a, 1.0, profile)
                if len(v) and len(uni):
                    ratio = float(np.median(v) / np.median(uni))
                    ok = ratio <= 0.4
                    add(f"{claim} [{profile}, eps=1: {a} at most 0.4 of uniform play]",
                        f"{a} {spread(v)}; uniform {spread(uni)}; ratio {ratio:.2f}", ok,
                        "" if ok else ("signal-to-noise limit of unit contexts in d = 20 at this T "
                                       "(REPRODUCTION.md, multi parameter)" if profile == "paper" else
                                       "not at this T (the warm-up alone is 3,000 users)"))
    elif paper_id == "001":
        eps = 1.0
        dgs, priv, plain = (values(runs, a, eps) for a in ("linucb-dgs", "private-linucb", "linucb"))
        claim = quote("001", "We observe that the non-private LinUCB performs better than its two private variants")
        ok1, p1 = less(plain, dgs)
        ok2, p2 = less(plain, priv)
        add(f"{claim} [eps=1, delta=0.1]", f"linucb {spread(plain)}; linucb-dgs {spread(dgs)}; "
                                           f"private-linucb {spread(priv)}", ok1 and ok2,
            "" if ok1 and ok2 else f"p = {p1:.2g} (vs DGS), {p2:.2g} (vs private LinUCB)")
        claim = quote("001", "Our private LinUCB-DGS performs much better than private LinUCB")
        for e in (0.5, 1.0, 2.0):
            d, p_ = values(runs, "linucb-dgs", e), values(runs, "private-linucb", e)
            ok, p = less(d, p_)
            lap = values(runs, "linucb-dgs-paper-laplace", e)
            ok_lap, p_lap = less(lap, p_) if len(lap) else (False, float("nan"))
            add(f"{claim} [eps={e:g}]", f"linucb-dgs {spread(d)}; private-linucb {spread(p_)} (p={p:.2g}); with the "
                f"paper's Laplace calibration (not eps-DP) {spread(lap)} (p={p_lap:.2g})", ok,
                "" if ok else ("the privacy fix: with the paper's under-noised calibration DGS is below" if ok_lap else
                               "DGS is not significantly below private LinUCB on this world, not even with the "
                               "paper's under-noised calibration (see text)"))
        claim = quote("001", "Compared with private LinUCB, our model parameter converges faster")
        d = values(runs, "linucb-dgs", 1.0, column="final_estimation_error")
        p_ = values(runs, "private-linucb", 1.0, column="final_estimation_error")
        ok, p = less(d, p_)
        add(f"{claim} [final ||theta - theta*||, eps=1]", f"linucb-dgs {spread(d)}; private-linucb {spread(p_)}",
            ok, "" if ok else f"not significantly smaller (p={p:.2g})")
        claim = quote("001", "Stronger privacy requirement (i.e., a smaller ) requires the privacy mechanism to "
                             "inject more noise, which results in larger regret")
        meds = [float(np.median(values(runs, "linucb-dgs", e))) for e in (0.5, 1.0, 2.0)]
        ok = meds[0] >= meds[1] >= meds[2]
        add(f"{claim} [linucb-dgs, eps 0.5 / 1 / 2]", " / ".join(_num(m) for m in meds), ok,
            "" if ok else "regret is not monotone in eps over seeds (differences within the spread)")
    elif paper_id == "002":
        slope_claim(quote("002", "Strongly Convex\t$\\tilde{O}(\\log T/\\varepsilon^2)$") +
                    " (MP-BCO, two-point, log T: slope ~ 0)", "ldp-bco-two-point", 0.0, tol=0.25)
        slope_claim(quote("002", "BCO\tConvex\t$\\tilde{O}(T^{3/4}/\\varepsilon)$") + " (one-point)",
                    "ldp-bco-one-point", 0.75)
        two, one = values(runs, "ldp-bco-two-point", 1.0), values(runs, "ldp-bco-one-point", 1.0)
        ok, p = less(two, one)
        add(quote("002", "there is also a significant difference about regret bounds between BCO and Multi-Point "
                         "BCO under LDP setting") + " [eps=1]",
            f"two-point {spread(two)}; one-point {spread(one)} (p={p:.2g})", ok, "" if ok else "not significant")
        slope_claim(quote("002", "Contextual Linear Bandits\t\t$\\tilde{O}(T^{3/4}/\\varepsilon)$"), "ldp-ucb", 0.75)
        slope_claim(quote("002", "Generalize Linear Bandits\t\t$\\tilde{O}(T^{3/4}/\\varepsilon)$"), "ldp-gloc", 0.75)
        claim = quote("002", "Equipped with different non-private algorithms, the utility of our framework can match "
                             "corresponding best non-private performances")
        for e in (0.5, 1.0):
            ldp, plain = values(runs, "ldp-mab-ucb", e), values(runs, "ucb", e)
            if len(ldp) and len(plain):
                ratio = float(np.median(ldp) / np.median(plain))
                # the LDP bound is the non-private one times (1 + sigma^2/c_r^2), sigma the reward noise std
                sigma = 2 * math.sqrt(2 * math.log(1.25 / 0.01)) / e
                ok = ratio <= 1 + sigma ** 2
                add(f"{claim} [MAB, UCB black box, eps={e:g}: regret ratio within the variance factor "
                    f"1 + sigma^2/c_r^2 = {1 + sigma ** 2:.0f}]",
                    f"ldp-mab-ucb {spread(ldp)}; ucb {spread(plain)}; ratio {ratio:.1f}", ok,
                    "" if ok else "the private UCB pays more than the variance factor")
        for env, algo in (("linear", "ldp-ucb"), ("logistic", "ldp-gloc")):
            for e in (0.5, 1.0):
                v, uni = values(runs, algo, e, env=env), values(runs, "uniform", None, env=env)
                if len(v) and len(uni):
                    ok, p = less(v, uni)
                    add(f"{algo} learns at eps={e:g} (below uniform play; the paper's contextual algorithms)",
                        f"{algo} {spread(v)}; uniform {spread(uni)} (p={p:.2g})", ok,
                        "" if ok else "not below uniform play at this T: the T^{3/4}/eps regime needs larger T")
    elif paper_id == "003":
        claim = (quote("003", "We then perform privacy and regret analysis of the PrivateLASSO algorithm") +
                 " ... achieves regret O(s0^{3/2} log^3 T / eps) under the margin condition (Theorem 2)")
        for e in (1.0, 4.0):
            v, plain = values(runs, "private-lasso", e), values(runs, "lasso-bandit", e)
            uni = values(runs, "uniform", None, env="sparse-linear")
            if len(v) and len(uni):
                ok, p = less(v, uni)
                add(f"{claim} [eps={e:g}: learns, i.e. below uniform play]",
                    f"private-lasso {spread(v)}; lasso-bandit {spread(plain)}; uniform {spread(uni)} (p={p:.2g})",
                    ok, "" if ok else "the private support never contains the true support at this (T, eps): see "
                                      "the support table")
        support = runs[runs["part"] == "support"]
        if len(support):
            grid = support.groupby(["users", "eps"])["support_contains"].mean()
            found = [(t, e) for (t, e), frac in grid.items() if frac >= 0.5]
            first = min(found, key=lambda te: (te[0], te[1])) if found else None
            add("Support recovery: 'the algorithm first estimates the s0-sparse support of theta' (Section 1)",
                "smallest (T, eps) of the grid where >= half the seeds' final support contains the true support: "
                + (f"T = {first[0]:,}, eps = {first[1]:g}" if first else "none in the grid"), bool(found),
                "" if found else "never within the grid (the sparse vector threshold's noise margin dominates)")
    elif paper_id == "004":
        slope_claim("Theorem 1: the regret of SW-KLUCB-CF ... at time T " + quote("004", "is upper-bounded by") +
                    " O~(sum_a sqrt(L_T T) + ...) (slope 1/2 in T)",
                    "sw-klucb-cf", 0.5)
        claim = quote("004", "Corollary 2")
        meds = {e: float(np.median(values(runs, "sw-klucb-cf", e, label=PIECEWISE))) for e in (0.5, 1.0, 2.0)}
        ok = meds[0.5] >= meds[1.0] >= meds[2.0]
        add(claim + ": the gap term scales as 1/tanh(eps/2)^2 (regret decreases with eps)",
            " / ".join(f"eps={e:g}: {_num(m)}" for e, m in meds.items()), ok,
            "" if ok else "not monotone in eps")
        for e in (0.5, 1.0, 2.0):
            sw, cf = values(runs, "sw-klucb-cf", e, label=PIECEWISE), values(runs, "klucb-cf", e, label=PIECEWISE)
            swe = values(runs, "sw-klucb-cf-eps", e, label=PIECEWISE)
            ok, p = less(sw, cf)
            add(f"{quote('004', 'a naive strategy of restarting an algorithm')}... (the window is what handles the "
                f"changes: SW-KLUCB-CF below the stationary KLUCB-CF on a piecewise world) [eps={e:g}]",
                f"sw-klucb-cf {spread(sw)}; eps-aware window {spread(swe)}; klucb-cf {spread(cf)} (p={p:.2g})", ok,
                "" if ok else "the paper's window is too short for the randomized-response gap (tanh(eps/2)); "
                              "see the eps-aware window")
        claim = quote("004", "it is easy to construct non-stationary environments for which the algorithms "
                             "proposed in")
        for e in (0.5, 1.0, 2.0):
            sw, cf = values(runs, "sw-klucb-cf", e, label=SWAP), values(runs, "klucb-cf", e, label=SWAP)
            swe = values(runs, "sw-klucb-cf-eps", e, label=SWAP)
            if not len(sw):
                continue
            users = int(runs.loc[runs["label"] == SWAP, "users"].iloc[0])
            linear = 0.2 * (users // 2)     # the second half's gap times its users: a learner that never switches
            ok, p = less(sw, cf)
            add(f"{claim} ... will suffer regret linear in the number of time steps T (KLUCB-CF), SW-KLUCB-CF "
                f"sub-linear [swap world, eps={e:g}]",
                f"sw-klucb-cf {spread(sw)}; eps-aware window {spread(swe)}; klucb-cf {spread(cf)} (p={p:.2g}); "
                f"never switching costs {_num(linear)}", ok,
                "" if ok else "the paper's window is too short for the randomized-response gap at this eps; see "
                              "the eps-aware window")
    return rows


def markdown(rows: list[dict], columns: list[str]) -> str:
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        out.append("| " + " | ".join(str(r.get(c, "")).replace("|", "/").replace("\n", " ") for c in columns) + " |")
    return "\n".join(out)


# ---- plots ------------------------------------------------------------------------------------------
def quartile_plot(runs: pd.DataFrame, x: str, xlabel: str, title: str, path: Path,
                  ylabel: str = "final cumulative regret (median, 25-75%)") -> Path:
    """Median final regret against `x` per algorithm, with 25-75% bars, on log-log axes."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    for algorithm, group in runs.groupby("algorithm"):
        stats = group.groupby(x)["final_regret"].quantile([0.25, 0.5, 0.75]).unstack()
        ax.errorbar(stats.index.to_numpy(dtype=float), stats[0.5],
                    yerr=[stats[0.5] - stats[0.25], stats[0.75] - stats[0.5]], marker="o", capsize=3, label=algorithm)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(runs: pd.DataFrame, curves: dict, folder: Path, title: str) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    main = runs[runs["part"] == "main"].copy()
    written = []
    if len(main):
        main["env"] = main["label"] + " [" + main["profile"] + "]"
        path = plots.regret_curves(curves, main, folder / "regret_curves.png", f"Cumulative regret: {title}")
        written += [p for p in [path] if p]
        path = plots.final_vs_eps(main[main["algorithm"] != "uniform"], "final_regret",
                                  folder / "final_regret_vs_eps.png", f"Final regret against eps: {title}",
                                  "final cumulative regret")
        written += [p for p in [path] if p]
    slope = runs[runs["part"] == "slope"]
    if len(slope):
        quartile_plot(slope, "users", "T (users)", f"Regret against T (eps = 1): {title}", folder / "slopes.png")
        written.append(folder / "slopes.png")
    return written


# ---- main -------------------------------------------------------------------------------------------
SEEDS_DIR = Path("/work/shared/seeds")


def reproduce_paper(paper_id: str, preset: dict, args, tracker) -> Path:
    paper = PAPERS[paper_id]
    jobs = jobs_for(paper, preset)
    total = sum(j["config"].users for j in jobs)
    print(f"paper {paper_id}: {len(jobs)} simulations, {total:,} users", flush=True)
    rows, curves, started = [], {}, time.perf_counter()
    params = {"paper": paper_id, "quick": args.quick, **{k: v for k, v in preset.items()}}
    with tracker.sweep(f"paper-{paper_id}", params=params, tags={"job": "reproduce", "paper": paper_id}) as sweep:
        def collect(job, result, cpu, extra):
            row = sweep.log_result(result)
            curve = metric_curves(result).get("cumulative_regret")
            if curve is not None:
                curves[row["key"]] = curve
            rows.append({"key": row["key"], **row_of(job, result, cpu, extra)})
            done = len(rows)
            if done % 10 == 0 or done == len(jobs):
                print(f"  {done}/{len(jobs)} runs, {time.perf_counter() - started:,.0f} s", flush=True)

        if args.workers > 1:
            with ProcessPoolExecutor(args.workers) as pool:
                for out in pool.map(simulate, jobs):
                    collect(*out)
        else:
            for job in jobs:
                collect(*simulate(job))
        local_dir = sweep.local_dir
    runs = pd.DataFrame(rows)
    runs.to_csv(local_dir / "runs.csv", index=False)
    slopes = slope_table(runs)
    claims = claim_rows(paper_id, runs, slopes)
    cpu = runs["cpu_s"].sum()
    header = (f"### Paper {paper_id}: {paper['title']}\n\n"
              f"`{args.command}`: "
              f"T = {', '.join(f'{t:,}' for t in sorted(runs[runs['part'] == 'main']['users'].unique()))} users, "
              f"round sizes {', '.join(str(b) for b in sorted(runs['round_size'].unique()))} (1: compiled sequential "
              f"engine; 10: algorithms it does not run; 1,000: uniform play), {preset['seeds']} seeds (main), "
              f"slopes with {preset['slope_seeds']} seeds; "
              f"{len(runs)} simulations, {cpu / 60:,.2f} CPU-minutes (machine shared).\n\n")
    text = header + markdown(claims, ["claim", "measured", "reproduced", "why not"]) + "\n"
    (local_dir / "claims.md").write_text(text)
    if len(slopes):
        slope_md = markdown(slopes.to_dict("records"), ["algorithm", "env", "T", "seeds", "slope_of_medians",
                                                        "per_seed_slopes", "medians"])
        (local_dir / "slopes.md").write_text(slope_md + "\n")
        text += "\nLog-log slopes of the final regret over T (eps = 1):\n\n" + slope_md + "\n"
    support = runs[runs["part"] == "support"]
    if len(support):
        grid = support.groupby(["users", "eps"]).agg(
            seeds=("seed", "nunique"), contains_truth=("support_contains", "mean"),
            exact=("support_exact", "mean"), true_found=("support_true_found", "mean"),
            size=("support_size", "mean"), regret=("final_regret", "median")).reset_index()
        support_md = markdown(grid.to_dict("records"), list(grid.columns))
        (local_dir / "support.md").write_text(support_md + "\n")
        text += "\nprivate-lasso support selection (fraction of seeds; final support):\n\n" + support_md + "\n"
    for path in write_plots(runs, curves, local_dir / "plots", f"paper {paper_id}"):
        if tracker.enabled and sweep.parent_run_id:
            tracker.client.log_artifact(sweep.parent_run_id, str(path), "plots")
    if tracker.enabled and sweep.parent_run_id:
        for name in ("claims.md", "slopes.md", "support.md", "runs.csv"):
            if (local_dir / name).exists():
                tracker.client.log_artifact(sweep.parent_run_id, str(local_dir / name))
    print(text, flush=True)
    return local_dir


# (algorithm, env, env params): seed 000/002's contextual algorithms run at --batch-users (the issue's T = 1e6);
# the others (one per family: MAB, piecewise-stationary, central-DP LinUCB, BCO) at --batch-users-others, since
# those without a compiled sequential kernel take ~20x longer per user at round size 1.
BATCH_ALGORITHMS = [("ldp-sgd", "linear", SINGLE), ("ldp-ols", "linear", SINGLE), ("ldp-ucb", "linear", SINGLE),
                    ("ldp-gloc", "logistic", SINGLE)]
BATCH_OTHERS = [("ldp-mab-ucb", "bernoulli", {"K": 10}), ("sw-klucb-cf", "piecewise-bernoulli",
                                                           {"K": 5, "breakpoints": 4}),
                ("private-linucb", "arm-pool", {}), ("ldp-bco-two-point", "convex", {"d": 2})]
BATCH_SIZES = (1, 10, 100, 1_000, 10_000)


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


def price_of_batching(args, tracker) -> Path:
    T, T_others, seeds = args.batch_users, args.batch_users_others, args.batch_seeds
    groups = [(BATCH_ALGORITHMS, T)] + ([(BATCH_OTHERS, T_others)] if T_others else [])
    jobs = [{"part": "batching", "label": env, "name": algo, "config": make_config(
        algo, env, env_params, users, B, 1.0, 0.01, seed, "paper", fallback=False)}
        for algorithms, users in groups for algo, env, env_params in algorithms
        for B in BATCH_SIZES if B <= users for seed in range(seeds)]
    command = (f"python jobs/reproduce.py --batching --batch-users {T} --batch-users-others {T_others} "
               f"--batch-seeds {seeds}")
    print(f"batching: {len(jobs)} simulations (T = {T:,}; others T = {T_others:,})", flush=True)
    rows, started = [], time.perf_counter()
    with tracker.sweep("batching", params={"users": T, "seeds": seeds, "round_sizes": list(BATCH_SIZES)},
                       tags={"job": "reproduce", "part": "batching"}) as sweep:
        for job in jobs:
            job, result, cpu, extra = simulate(job)
            row = sweep.log_result(result)
            rows.append({"key": row["key"], **row_of(job, result, cpu, extra)})
            if len(rows) % 10 == 0:
                print(f"  {len(rows)}/{len(jobs)} runs, {time.perf_counter() - started:,.0f} s", flush=True)
        local_dir = sweep.local_dir
    runs = pd.DataFrame(rows)
    runs.to_csv(local_dir / "runs.csv", index=False)
    md = batching_markdown(runs, command, seeds)
    (local_dir / "batching.md").write_text(md)
    # every algorithm's regrets divided by its own B = 1 median: the families' scales differ by 100x
    b1_median = runs[runs["round_size"] == 1].groupby("algorithm")["final_regret"].median()
    relative = runs.assign(final_regret=runs["final_regret"].astype(float) / runs["algorithm"].map(b1_median))
    quartile_plot(relative, "round_size", "round size B (users per round)",
                  f"Price of batching, eps = 1, {seeds} seeds (T: see batching.md)", local_dir / "plots" / "batching.png",
                  ylabel="final regret / its median at B = 1 (median, 25-75%)")
    if tracker.enabled and sweep.parent_run_id:
        tracker.client.log_artifact(sweep.parent_run_id, str(local_dir / "plots" / "batching.png"), "plots")
        tracker.client.log_artifact(sweep.parent_run_id, str(local_dir / "batching.md"))
    print(md, flush=True)
    return local_dir


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paper", choices=[*PAPERS, "all"], default=None)
    parser.add_argument("--quick", action="store_true", help="small T, 3 seeds: a smoke run of the pipeline")
    parser.add_argument("--users", type=int, default=None, help="T of the main experiments (override)")
    parser.add_argument("--seeds", type=int, default=None, help="seeds of the main experiments (override)")
    parser.add_argument("--slope-T", default=None, help="comma-separated horizons of the slope fits (override)")
    parser.add_argument("--round-size", type=int, default=None, help="users per round of every run (override)")
    parser.add_argument("--eps", default=None, help="comma-separated eps values of every setting (override)")
    parser.add_argument("--lasso-T", default=None, help="seed 003's support grid: comma-separated T (override)")
    parser.add_argument("--lasso-eps", default=None, help="seed 003's support grid: comma-separated eps (override)")
    parser.add_argument("--lasso-seeds", type=int, default=None, help="seed 003's support grid: seeds (override)")
    parser.add_argument("--batching", action="store_true", help="the price-of-batching experiment")
    parser.add_argument("--batch-users", type=int, default=1_000_000,
                        help="T of seed 000/002's contextual algorithms")
    parser.add_argument("--batch-users-others", type=int, default=100_000,
                        help="T of the other families (MAB, piecewise, LinUCB, BCO); 0 skips them")
    parser.add_argument("--batch-seeds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=1, help="parallel processes (the machine is shared)")
    parser.add_argument("--tracking-uri", default=None)
    parser.add_argument("--experiment", default="reproduce")
    parser.add_argument("--out", default="results/reproduce")
    parser.add_argument("--no-tracking", action="store_true")
    parser.add_argument("--max-points", type=int, default=200, help="points per logged curve")
    args = parser.parse_args(argv)
    args.command = " ".join(["python jobs/reproduce.py", *(sys.argv[1:] if argv is None else argv)])
    if args.paper is None and not args.batching:
        parser.error("give --paper or --batching")
    preset = dict(QUICK if args.quick else FULL)
    if args.users:
        preset["users"], preset["forced"] = args.users, True       # every setting
    if args.seeds:
        preset["seeds"] = args.seeds
    if args.eps:
        preset["eps"] = tuple(float(e) for e in args.eps.split(","))
    if args.lasso_T:
        preset["lasso_T"] = tuple(int(float(t)) for t in args.lasso_T.split(","))
    if args.lasso_eps:
        preset["lasso_eps"] = tuple(float(e) for e in args.lasso_eps.split(","))
    if args.lasso_seeds:
        preset["lasso_seeds"] = args.lasso_seeds
    if args.round_size:
        preset["round_size"] = args.round_size
    if args.slope_T:
        preset["slope_T"] = tuple(int(float(t)) for t in args.slope_T.split(","))
        preset["forced_T"] = True
    try:
        # Curves of at most 200 points per child run: thousands of runs, each logged to MLflow, on a shared machine.
        tracker = Tracker(experiment=args.experiment, tracking_uri=args.tracking_uri, out_dir=args.out,
                          enabled=not args.no_tracking, max_points=args.max_points)
    except TrackingUnavailable as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n(use --no-tracking to keep local results only)\n")
    if args.paper:
        for paper_id in (PAPERS if args.paper == "all" else [args.paper]):
            reproduce_paper(paper_id, preset, args, tracker)
    if args.batching:
        price_of_batching(args, tracker)
    return 0


if __name__ == "__main__":
    sys.exit(main())

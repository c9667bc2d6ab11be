"""The five papers' experiments: what to simulate for each (settings, slopes, presets) and how one run is made.

Profiles: both "paper" and "authors-code" where they differ (seed 000's algorithms); the other papers have no
public code, so only "paper". Round size: the papers are sequential (round size 1, on the compiled sequential
engine where it supports the algorithm, else FALLBACK_ROUND_SIZE users; the price-of-batching table in
REPRODUCTION.md shows where B = 10 leaves the regret unchanged).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ldpfed.algorithms import REGISTRY
from ldpfed.config import RunConfig
from ldpfed.engine import run
from ldpfed.envs import make_env


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


# (algorithm, env, env params): seed 000/002's contextual algorithms run at --batch-users (T = 1e6, the papers'
# horizon); the others (one per family: MAB, piecewise-stationary, central-DP LinUCB, BCO) at --batch-users-others,
# since those without a compiled sequential kernel take ~20x longer per user at round size 1.
BATCH_ALGORITHMS = [("ldp-sgd", "linear", SINGLE), ("ldp-ols", "linear", SINGLE), ("ldp-ucb", "linear", SINGLE),
                    ("ldp-gloc", "logistic", SINGLE)]
BATCH_OTHERS = [("ldp-mab-ucb", "bernoulli", {"K": 10}), ("sw-klucb-cf", "piecewise-bernoulli",
                                                           {"K": 5, "breakpoints": 4}),
                ("private-linucb", "arm-pool", {}), ("ldp-bco-two-point", "convex", {"d": 2})]
BATCH_SIZES = (1, 10, 100, 1_000, 10_000)

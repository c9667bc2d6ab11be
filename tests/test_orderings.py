"""Orderings across papers. Seed 000 reports LDP-SGD < LDP-OLS < LDP-UCB (d=2, K=10, eps=1); SGD < OLS is in
test_algorithms_seed000.py, OLS < UCB (LDP-UCB is seed 002's algorithm) is here."""
import numpy as np

from ldpfed.config import RunConfig
from ldpfed.engine import run_local

SEEDS = range(5)


def median_regret(algorithm):
    return np.median([run_local(RunConfig(algorithm, env="linear", users=20_000, round_size=10, eps=1.0,
                                          delta=0.01, seed=seed)).summary["final_regret"] for seed in SEEDS])


def test_ldp_ols_beats_ldp_ucb_in_median_regret():
    assert median_regret("ldp-ols") < median_regret("ldp-ucb")

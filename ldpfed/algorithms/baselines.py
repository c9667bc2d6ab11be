"""Uniform random play: the floor every learner must beat clearly."""
from __future__ import annotations

from ldpfed.algorithms.base import Algorithm


class Uniform(Algorithm):
    name = "uniform"
    paper = "baseline"
    privacy_model = "none"
    env_kinds = ("linear", "logistic", "poisson", "linear-multi", "logistic-multi", "poisson-multi",
                 "bernoulli", "piecewise-bernoulli", "sparse-linear", "arm-pool", "classification")
    default_env = "linear"

    def initial_state(self, rng):
        return {}

    def update(self, state, sums, start, stop, rng):
        return state

    def act(self, model, contexts, users, rng):
        return rng.integers(self.K, size=len(users))

    def fields(self):
        return {}     # no message: the users send nothing

    def encode(self, model, contexts, actions, rewards, users, rng):
        return {}, {}


"""Uniform random play: the floor every learner must beat clearly."""
from __future__ import annotations

import numpy as np
from numba import njit

from ldpfed.algorithms.compiled import CompiledAlgorithm, Steps, no_weights


@njit(cache=True)
def _uniform_act(model, consts, contexts, i, user, draws, actions):
    actions[i] = int(draws[i, 0])          # the arm drawn by draw_act


@njit(cache=True)
def _nothing_to_send(model, consts, contexts, actions, reward, user, i, inputs, counts):
    return None


@njit(cache=True)
def _no_update(state, consts, sums, start, stop, server):
    return None


class Uniform(CompiledAlgorithm):
    name = "uniform"
    paper = "baseline"
    privacy_model = "none"
    env_kinds = ("linear", "logistic", "poisson", "linear-multi", "logistic-multi", "poisson-multi",
                 "bernoulli", "piecewise-bernoulli", "sparse-linear", "arm-pool", "classification")
    default_env = "linear"
    act_draws = 1

    def steps(self):
        return Steps(_uniform_act, _nothing_to_send, no_weights, _no_update)

    def initial_state(self, rng):
        return {}

    def draw_act(self, n, rng):
        return rng.integers(self.K, size=n).astype(float).reshape(n, 1)   # one arm per user, uniformly

    def fields(self):
        return {}     # no message: the users send nothing

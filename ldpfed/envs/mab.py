"""Bernoulli multi-armed bandits, stationary or piecewise stationary (seeds 002, 004)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
from numba import njit

from ldpfed.envs.base import Env, EnvSteps
from ldpfed.util.errors import ConfigError, integer
from ldpfed.util.options import Option


def mab_options(K: int, breakpoints: int) -> dict:
    return {
        "K": Option(K, kind="int", low=2, doc="arms"),
        "breakpoints": Option(breakpoints, kind="int", low=0,
                              doc="change points, evenly spaced over the users (fewer than the users); at each the "
                                  "means are redrawn and the best arm changes"),
        "means": Option(None, kind="any",
                        doc="None (drawn from U(0.05, 0.95)), or breakpoints + 1 lists of K means in [0, 1]: the "
                            "segments' means"),
    }


class PiecewiseBernoulli(Env):
    """K Bernoulli arms whose means are redrawn at `breakpoints` evenly spaced change points.

    At each change the best arm changes too (the new means are a permutation-free redraw, re-drawn until
    the best arm differs), so a learner that does not forget pays for it. `means` (a list of breakpoints + 1
    lists of K values in [0, 1]) fixes the segments' means instead of drawing them, e.g. [[0.8, 0.2], [0.2, 0.8]]
    with K = 2, breakpoints = 1: the best arm becomes the worst half-way (seed 004's case against stationary
    learners).
    """
    name = "piecewise-bernoulli"
    options = mab_options(5, 4)
    varies = "every segment's arm means, each moved by spread x N(0, 1), clipped to [0, 1]"

    def _vary(self, spread, rng):
        self.segment_means = np.clip(self.segment_means + spread * rng.standard_normal(self.segment_means.shape),
                                     0.0, 1.0)

    @classmethod
    def cross_check(cls, params, users):
        if users is not None and params["breakpoints"] >= users:
            raise ConfigError("env_params.breakpoints", params["breakpoints"], f"must be fewer than the {users} users")
        if params["means"] is not None:
            cls._given_means(params["means"], params["breakpoints"] + 1, params["K"])

    def __init__(self, rng, users, **params):
        super().__init__(rng, users, **params)
        self.K = integer("env_params.K", self.params["K"], 2)
        n_breaks = integer("env_params.breakpoints", self.params["breakpoints"], 0)
        if n_breaks >= users:
            raise ConfigError("env_params.breakpoints", n_breaks, f"must be fewer than the {users} users")
        self.change_points = np.array([(i + 1) * users // (n_breaks + 1) for i in range(n_breaks)], dtype=np.int64)
        if self.params["means"] is not None:
            self.segment_means = self._given_means(self.params["means"], n_breaks + 1, self.K)
            return
        segments = [rng.uniform(0.05, 0.95, self.K)]
        for _ in range(n_breaks):
            nxt = rng.uniform(0.05, 0.95, self.K)
            while nxt.argmax() == segments[-1].argmax():
                nxt = rng.uniform(0.05, 0.95, self.K)
            segments.append(nxt)
        self.segment_means = np.array(segments)  # (breakpoints + 1, K)

    @staticmethod
    def _given_means(means, segments, K):
        try:
            m = np.array(means, dtype=float)
        except (TypeError, ValueError):
            raise ConfigError("env_params.means", means, "must be a list of lists of numbers") from None
        if m.shape != (segments, K):
            raise ConfigError("env_params.means", means, f"must have breakpoints + 1 = {segments} rows of K = "
                                                         f"{K} means, got shape {m.shape}")
        if not np.all(np.isfinite(m)) or m.min() < 0.0 or m.max() > 1.0:
            raise ConfigError("env_params.means", means, "every mean must be in [0, 1]")
        return m

    def means_at(self, users):
        return self.segment_means[np.searchsorted(self.change_points, users, side="right")]

    def compiled(self):
        # draw_noise: one uniform per user (the Bernoulli draw)
        return EnvSteps(_bernoulli_step, (self.change_points, self.segment_means))

    def public(self):
        # Seed 004's L_T (the number of stationary segments) is public, the change times are not.
        return replace(super().public(), segments=len(self.change_points) + 1)

    def describe(self):
        return {**super().describe(), "change_points": self.change_points.tolist()}


class Bernoulli(PiecewiseBernoulli):
    """K stationary Bernoulli arms (no change points by default)."""
    name = "bernoulli"
    options = mab_options(10, 0)


@njit(cache=True)
def _bernoulli_step(truth, contexts, i, user, actions, noise):
    """User `user` pulls actions[i] in the segment it arrives in: (a Bernoulli reward, best mean - its mean)."""
    change_points, segment_means = truth
    means = segment_means[np.searchsorted(change_points, user, side="right")]
    chosen = means[actions[i]]
    return (1.0 if noise[i] < chosen else 0.0), means.max() - chosen

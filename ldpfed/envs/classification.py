"""A real classification data set shipped by an installed package, as a bandit.

"classification": scikit-learn's digits (sklearn.datasets.load_digits: 1,797 8x8 images, 10 classes), which is
installed with scikit-learn (read from the package's own data folder: no download, works offline).

As a multi-parameter contextual bandit (like the "*-multi" envs of glm.py): one arm per class (K = 10); user t is
a data point drawn uniformly with replacement (from the round's context generator); its context is the image
reduced to d - 1 principal components (a fixed PCA of the whole data set, computed with numpy: no randomness),
scaled by one global constant so the largest reduced image has norm 1, plus a bias coordinate 1, all divided by
sqrt(2): ||x|| <= 1 for every user. Pulling the arm of the true class gives reward 1, any other arm 0; the best
arm (the true class) has expected reward 1, so the regret of a user is 1 - [arm == label].
There is no parameter to estimate (estimation_error is None). With d = 16 a least-squares one-vs-rest linear
model on these contexts classifies about 91% of the data set correctly.

The compiled step (ldpfed.envs.base.EnvSteps, what the batched `step` and the sequential engine both run): the
labels are the env's truth; a user's "noise" is the index of the data point that contexts() drew for it, kept
between contexts() and the step (keyed by the users; the sequential engine's draw_noise takes the points of the
users whose contexts were drawn last, as it draws a block's contexts and then its noise).
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np
from numba import njit

from ldpfed.envs.base import Env, EnvSteps, step_loop
from ldpfed.util.errors import ConfigError, integer
from ldpfed.util.options import Option

N_FEATURES = 64   # 8x8 pixels


@lru_cache(maxsize=8)
def digits_features(d: int) -> tuple[np.ndarray, np.ndarray]:
    """(X (n, d), labels (n,)) of the digits data set reduced as described in the module docstring."""
    from sklearn.datasets import load_digits

    data = load_digits()
    pixels = np.asarray(data.data, dtype=float)
    labels = np.asarray(data.target, dtype=np.int64)
    centered = pixels - pixels.mean(axis=0)
    _, _, vt = np.linalg.svd(centered, full_matrices=False)
    components = vt[: d - 1]
    # Fix each component's sign (SVD signs are arbitrary across LAPACK builds): largest loading positive.
    signs = np.sign(components[np.arange(d - 1), np.abs(components).argmax(axis=1)])
    z = centered @ (components * signs[:, None]).T
    z /= np.linalg.norm(z, axis=1).max()
    x = np.hstack([z, np.ones((len(z), 1))]) / np.sqrt(2.0)
    x.setflags(write=False)
    labels.setflags(write=False)
    return x, labels


class DigitsClassification(Env):
    """Digits as a 10-armed multi-parameter contextual bandit (see the module docstring)."""
    name = "classification"
    multi = True
    options = {"d": Option(16, kind="int", low=2, high=N_FEATURES + 1,
                           doc="context dimension: d - 1 principal components plus a bias coordinate")}
    reward_bound = 1.0
    # For the GLM algorithms that read env.link (glm_ldp.py): the linear probability model, E[r | x, a] ~ x^T theta_a.
    link = "identity"

    def __init__(self, rng, users, **params):
        super().__init__(rng, users, **params)
        self.d = integer("env_params.d", self.params["d"], 2)
        if self.d > N_FEATURES + 1:
            raise ConfigError("env_params.d", self.d, f"at most {N_FEATURES + 1} (64 pixels plus a bias)")
        self.X, self.labels = digits_features(self.d)
        self.K = 10
        self.n_points = len(self.labels)
        # The data points of the users whose contexts were drawn but not yet stepped, keyed by their global indices.
        # A population calls contexts() then step() for the same users (engine/core.py simulate_population).
        self._pending: dict[tuple, np.ndarray] = {}

    @staticmethod
    def _key(users) -> tuple:
        users = np.asarray(users)
        return (int(users[0]), int(users[-1]), len(users)) if len(users) else (0, -1, 0)

    def draw(self, users, rng) -> np.ndarray:
        """Indices of the data points of these users (uniform with replacement)."""
        return rng.integers(self.n_points, size=len(users))

    def contexts(self, users, rng):
        idx = self.draw(users, rng)
        self._pending[self._key(users)] = idx
        return self.X[idx]

    def _take(self, key, n: int) -> np.ndarray:
        """The data points drawn by contexts() for the users of `key` (None: the last drawn), removed."""
        if key is None:
            key = next(reversed(self._pending), None)
        points = self._pending.pop(key, None) if key is not None else None
        if points is None or len(points) != n:
            raise RuntimeError("classification env: step() for users whose contexts() were not drawn")
        return points

    def compiled(self):
        return EnvSteps(_classification_step, (self.labels,))

    def draw_noise(self, n, rng):
        # the points of the users whose contexts were drawn last (nothing is drawn from rng)
        return self._take(None, n)

    def step(self, contexts, actions, users, rng):
        # the inherited batched step, with each population's own points (keyed by its users)
        n = len(actions)
        points = self._take(self._key(users), n)
        steps = self.compiled()
        rewards, regret = np.empty(n), np.empty(n)
        step_loop(steps.step)(steps.truth, self.context_rows(contexts, n), np.asarray(users, dtype=np.int64),
                  np.asarray(actions), points, rewards, regret)
        return rewards, regret

    def public(self):
        return replace(super().public(), context_bound=1.0)   # ||x|| <= 1 by construction

    def describe(self):
        return {**super().describe(), "data": "sklearn.datasets.load_digits", "points": self.n_points}


@njit(cache=True)
def _classification_step(truth, contexts, i, user, actions, noise):
    """Reward 1 for the arm of the true class of the user's data point (noise[i]), 0 otherwise; regret 1 - reward
    (the true class has expected reward 1)."""
    labels = truth[0]
    reward = 1.0 if actions[i] == labels[noise[i]] else 0.0
    return reward, 1.0 - reward

"""What every simulated world offers the engine.

An env holds the ground truth (drawn once from the run's "env" generator). Per round, a population asks it
for its users' contexts, lets the algorithm's client half act, then asks for rewards and pseudo-regret.
Regret is a simulation metric: it never travels to the server.
"""
from __future__ import annotations

import numpy as np

from ldpfed.errors import ConfigError


class Env:
    name: str = ""
    defaults: dict = {}
    # Options whose default differs under RunConfig.profile="authors-code" (make_env applies them); keys of `defaults`.
    profile_defaults: dict = {}
    d: int = 0          # context (or action) dimension; 0 for context-free worlds
    K: int = 0          # number of arms; 0 for continuous actions
    multi: bool = False  # contexts (n, d) with one parameter per arm, instead of (n, K, d)
    reward_bound: float = 1.0  # a public bound |r| <= c_r that clients clip to before privatizing

    def __init__(self, rng: np.random.Generator, users: int, **params):
        unknown = set(params) - set(self.defaults)
        if unknown:
            name = sorted(unknown)[0]
            raise ConfigError(f"env_params.{name}", params[name], f"unknown for env {self.name}; known: {sorted(self.defaults)}")
        self.params = {**self.defaults, **params}
        self.horizon = users

    def contexts(self, users: np.ndarray, rng: np.random.Generator):
        """Contexts of these users (global indices), or None for context-free worlds."""
        return None

    def step(self, contexts, actions, users: np.ndarray, rng: np.random.Generator):
        """(rewards, pseudo-regret per user) for the chosen actions."""
        raise NotImplementedError

    def estimation_error(self, estimate) -> float | None:
        """Distance of an algorithm's parameter estimate from the truth, where defined."""
        return None

    def describe(self) -> dict:
        return {"env": self.name, "d": self.d, "K": self.K, **self.params}


def positive_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ConfigError(name, value, f"must be an integer >= {minimum}")
    return int(value)


def nonneg_float(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) or value < 0:
        raise ConfigError(name, value, "must be a finite number >= 0")
    return float(value)


def unit_sphere(rng: np.random.Generator, shape, d: int) -> np.ndarray:
    """Uniform draws on the unit sphere of R^d, shape (*shape, d)."""
    x = rng.standard_normal((*np.atleast_1d(shape), d))
    return x / np.linalg.norm(x, axis=-1, keepdims=True)

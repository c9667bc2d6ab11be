"""The link functions of the generalized linear models (seeds 000, 002): mean reward mu(x^T theta).

Bottom layer (numpy, scipy, numba); the algorithms use these: `mean_function` vectorized, `link_mean` by link code
in their compiled steps.

* identity: mu(z) = z;  logistic: mu(z) = expit(z) = 1 / (1 + e^-z);  poisson: mu(z) = e^z.
* The algorithms' Poisson mean is capped: e^min(z, EXP_CAP). e^50 already exceeds any public reward bound by far,
  so a gradient clipped to a public radius is unchanged for any context of norm > R / e^50; the cap only prevents
  overflow on the algorithm side. The env's Poisson mean (the world's truth) is not capped.
* `sup_mean(link, S)`: max |mu| on [-S, S]; `inf_slope(link, S)`: min mu' on [-S, S] (the constants of seed 002's
  assumptions, for the links it supports).
"""
from __future__ import annotations

import numpy as np
from numba import njit
from scipy.special import expit

from ldpfed.util.errors import ConfigError

LINKS = ("identity", "logistic", "poisson")
# Largest linear predictor fed to exp() in an algorithm's Poisson mean (see the module doc).
EXP_CAP = 50.0


def identity(z):
    return z


def poisson_capped(z):
    """e^min(z, EXP_CAP): the algorithms' Poisson mean."""
    return np.exp(np.minimum(z, EXP_CAP))


_ENV_MEANS = {"identity": identity, "logistic": expit, "poisson": np.exp}
_ALGORITHM_MEANS = {"identity": identity, "logistic": expit, "poisson": poisson_capped}


def mean_function(link: str, *, capped: bool = True):
    """mu of `link`, vectorized. capped: the algorithms' version (Poisson capped at EXP_CAP); False: the env's."""
    table = _ALGORITHM_MEANS if capped else _ENV_MEANS
    if link not in table:
        raise ConfigError("env.link", link, f"unknown link (one of {list(LINKS)})")
    return table[link]


def sup_mean(link: str, S: float) -> float:
    """max over |z| <= S of |mu(z)| (identity: S; logistic: expit(S); poisson: e^S)."""
    if link == "identity":
        return S
    if link == "logistic":
        return float(expit(S))
    if link == "poisson":
        return float(np.exp(S))
    raise ConfigError("env.link", link, f"unknown link (one of {list(LINKS)})")


def inf_slope(link: str, S: float) -> float:
    """min over |z| <= S of mu'(z) (identity: 1; logistic: expit(S) expit(-S); poisson: e^-S)."""
    if link == "identity":
        return 1.0
    if link == "logistic":
        return float(expit(S) * expit(-S))
    if link == "poisson":
        return float(np.exp(-S))
    raise ConfigError("env.link", link, f"unknown link (one of {list(LINKS)})")


# Link codes of the compiled algorithms (ldpfed.algorithms.compiled): link_code(name) -> code, link_mean(code, z).
IDENTITY, LOGISTIC, POISSON = range(3)


def link_code(link: str) -> int:
    if link not in LINKS:
        raise ConfigError("env.link", link, f"unknown link (one of {list(LINKS)})")
    return LINKS.index(link)


@njit(cache=True)
def link_mean(code, z):
    """The algorithms' mu(z) for one value (Poisson capped at EXP_CAP, as mean_function)."""
    if code == IDENTITY:
        return z
    if code == LOGISTIC:
        return 1.0 / (1.0 + np.exp(-z))
    return np.exp(min(z, EXP_CAP))

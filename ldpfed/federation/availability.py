"""Availability: each user of a round answers with a probability, per population; the others are offline for that
round (they neither act nor send: ldpfed.federation.base). The draws come from the run's seed, one Generator per
(population, round) (purpose "federation"), so every engine, a retried round and a resumed run see the same users."""
from __future__ import annotations

import numbers

import numpy as np

from ldpfed.federation.base import Federation
from ldpfed.util.errors import ConfigError
from ldpfed.util.options import Option
from ldpfed.util.rng import derive


class Availability(Federation):
    """Each user of a round answers with probability p (per population with p_by_population), independently."""

    name = "availability"
    about = ("each user of a round answers with probability p (per population: p_by_population); the others are "
             "offline for the round: they neither act nor send")
    options = {
        "p": Option(0.9, low=0, high=1, low_open=True,
                    doc="the probability that a user of a round is available (answers)"),
        "p_by_population": Option(None, kind="any",
                                 doc="a list of one probability in (0, 1] per population, in population order "
                                     "(overrides p); none: p for every population"),
    }

    def __init__(self, seed=0, populations=1, options=None):
        super().__init__(seed, populations, options)
        per = self.options["p_by_population"]
        self.probabilities = (np.full(self.populations, self.options["p"]) if per is None
                              else np.asarray(per, dtype=float))

    @classmethod
    def checked_options(cls, given) -> dict:
        options = super().checked_options(given)
        per = options["p_by_population"]
        if per is not None:
            if not isinstance(per, (list, tuple)) or not per or not all(
                    isinstance(v, numbers.Real) and not isinstance(v, bool) and 0 < v <= 1 for v in per):
                raise ConfigError("federation_options.p_by_population", per,
                                  "must be a list of numbers in (0, 1], one per population")
            options["p_by_population"] = [float(v) for v in per]
        return options

    def check(self, config) -> None:
        per = self.options["p_by_population"]
        if per is not None and len(per) != config.populations:
            raise ConfigError("federation_options.p_by_population", per,
                              f"has {len(per)} probabilities for {config.populations} populations")

    def present(self, round_index, population, users):
        p = self.probabilities[population]
        if p >= 1.0:
            return users
        answers = derive(self.seed, "federation", population, round_index).random(len(users)) < p
        return users[answers]

"""Latency and delayed feedback: a present user's message reaches the server some rounds after the round it acted
in, because the network is slow (`latency`) or because its reward (a conversion) comes late (`reward_delay`): in
every algorithm here the message carries the reward, so it is sent when the reward is known. The two delays add
up; a message later than `deadline` rounds is lost. The server folds a late message into the aggregate of the
round it arrives in (ldpfed.federation.base). Draws: one Generator per (population, round) and aspect."""
from __future__ import annotations


import numpy as np

from ldpfed.federation.base import LOST, Federation, check_one_per_population, per_population_numbers
from ldpfed.util.options import Option

LAWS = ("geometric", "poisson", "fixed")


def draw_delays(rng: np.random.Generator, law: str, mean: float, n: int) -> np.ndarray:
    """n delays in whole rounds with the given mean: geometric on {0, 1, ...} (memoryless: most on time, a long
    tail), Poisson, or `fixed` (every one round(mean))."""
    if mean <= 0:
        return np.zeros(n, dtype=np.int64)
    if law == "fixed":
        return np.full(n, int(round(mean)), dtype=np.int64)
    if law == "poisson":
        return rng.poisson(mean, n).astype(np.int64)
    return rng.geometric(1.0 / (1.0 + mean), n).astype(np.int64) - 1     # numpy's geometric starts at 1


class Latency(Federation):
    """Each message arrives late: network latency plus a reward that comes late, per population, with a deadline."""

    name = "latency"
    about = ("messages reach the server late (latency and reward_delay rounds on average, per population with "
             "factor_by_population), and are lost after a deadline")
    options = {
        "latency": Option(1.0, low=0, doc="mean rounds a message takes to reach the server (0: on time)"),
        "reward_delay": Option(0.0, low=0, doc="mean rounds until a user's reward is known, and its message sent"),
        "law": Option("geometric", kind="choice", choices=LAWS, doc="how delays are drawn around their mean: geometric (most on "
                                                     "time, a long tail), poisson, or fixed (every one the mean)"),
        "factor_by_population": Option(None, kind="any",
                                 doc="a list of one factor >= 0 per population, in population order, multiplying "
                                     "both means (a slow region: 4.0); none: 1 for every population"),
        "deadline": Option(None, kind="int", low=0, allow=(None,),
                           doc="a message more than this many rounds late is lost; none: every message arrives"),
    }

    def __init__(self, seed=0, populations=1, options=None):
        super().__init__(seed, populations, options)
        per = self.options["factor_by_population"]
        self.factors = np.ones(self.populations) if per is None else np.asarray(per, dtype=float)

    @classmethod
    def checked_options(cls, given) -> dict:
        options = super().checked_options(given)
        per = options["factor_by_population"]
        if per is not None:
            options["factor_by_population"] = per_population_numbers(per, "factor_by_population",
                                                                     "finite numbers >= 0", 0.0, float("inf"))
        return options

    def check(self, config) -> None:
        super().check(config)
        check_one_per_population(self.options, config, {"factor_by_population": "factors"})

    late = True

    @property
    def loses(self) -> bool:
        return self.options["deadline"] is not None

    def delays(self, round_index, population, users):
        factor, law = self.factors[population], self.options["law"]
        n = len(users)
        delays = draw_delays(self.stream("delay", population, round_index), law, self.options["latency"] * factor, n)
        delays += draw_delays(self.stream("reward_delay", population, round_index), law,
                              self.options["reward_delay"] * factor, n)
        deadline = self.options["deadline"]
        if deadline is not None:
            delays[delays > deadline] = LOST
        return delays

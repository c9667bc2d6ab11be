"""A federation as it behaves: heterogeneous populations, availability and latency at once, with every option of
the three (ldpfed.federation.heterogeneous, availability, latency). Populations of their own sizes and worlds; each
user answers with its population's probability of the round (dropping before acting, or after: its message lost);
an answering user's message reaches the server latency + reward_delay rounds later, or is lost past the deadline."""
from __future__ import annotations

from ldpfed.federation.availability import Availability
from ldpfed.federation.base import LOST
from ldpfed.federation.heterogeneous import Heterogeneous
from ldpfed.federation.latency import Latency


class Realistic(Heterogeneous, Availability, Latency):
    """Heterogeneous populations, dropouts, late messages and delayed feedback together."""

    name = "realistic"
    about = ("heterogeneous populations, availability and latency together (every option of the three: "
             "`describe heterogeneous`, `describe availability`, `describe latency`)")
    options = {**Heterogeneous.options, **Availability.options, **Latency.options}

    @property
    def late(self) -> bool:
        return self.options["latency"] > 0 or self.options["reward_delay"] > 0

    @property
    def loses(self) -> bool:
        return self.options["drop"] == "after" or self.options["deadline"] is not None

    def delays(self, round_index, population, users):
        delays = Latency.delays(self, round_index, population, users)
        if self.options["drop"] == "after":
            answers = self.answers(round_index, population, users)
            if answers is not None:
                delays[~answers] = LOST
        return delays

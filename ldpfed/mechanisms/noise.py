"""What noise a server's aggregate carries, per message field: the contract between a trust model (which decides
where the noise goes) and an algorithm's server half (which may correct for it, `Algorithm.field_noise`)."""
from __future__ import annotations

from dataclasses import dataclass

# Who adds a field's noise (`FieldNoise.per`): each user's local randomizer, a trusted server once per round, or
# every user a share of it inside its (securely summed) message.
PER = ("user", "round", "shares")
# Which entries of the aggregate field carry it (`FieldNoise.entries`): every entry, or only the entries some user
# of the round can reach (known from public information: Algorithm.central_touched).
ENTRIES = ("all", "touched")


@dataclass(frozen=True)
class FieldNoise:
    """The noise on one message field that the server's aggregate carries: `variance` per entry (an upper bound
    over the data where it depends on it), added `per` "user" (each user's randomizer: a sum of B users carries B
    times it), "round" (once to a round's aggregate, by a trusted server) or "shares" (each user adds a share; the
    round's sum carries `variance` once, whatever the number of users), on `entries` "all" or "touched"."""

    kind: str              # "gaussian", "laplace", "l2-ball", "randomized-response", "skellam", or the mechanism's own
    variance: float
    per: str
    entries: str = "all"

    def __post_init__(self):
        if self.per not in PER:
            raise ValueError(f"FieldNoise.per must be one of {PER}, not {self.per!r}")
        if self.entries not in ENTRIES:
            raise ValueError(f"FieldNoise.entries must be one of {ENTRIES}, not {self.entries!r}")


def mechanism_noise(mech) -> tuple[str, float] | None:
    """(kind, per-entry variance) of what a mechanism adds: its own `noise_variance()` if it offers one, else read
    off its dp_event and output bounds; None when neither says."""
    event = mech.dp_event() or {}
    kind = event.get("noise") or ("l2-ball" if getattr(mech, "output_radius", None) is not None
                                  else type(mech).__name__)
    own = getattr(mech, "noise_variance", None)
    if callable(own):
        return kind, float(own())
    if kind in ("gaussian", "discrete-gaussian"):
        return kind, float(event["noise_std"]) ** 2
    if kind == "laplace":
        return kind, 2.0 * float(event["noise_scale"]) ** 2
    if kind == "skellam":
        return kind, float(event["noise_variance"])
    if kind == "randomized-response":
        return kind, 0.25                 # a reported bit: at most 1/4 whatever the true bit's mean
    if kind == "l2-ball":                 # every output row has norm B, so at most B^2 per row
        return kind, float(mech.output_radius) ** 2
    return None


def local_noise(mechanisms: dict) -> dict:
    """{field: FieldNoise} of local randomizers: each field's noise, added per user by its mechanism."""
    found = {}
    for key, mech in mechanisms.items():
        noise = mechanism_noise(mech)
        if noise is not None:
            found[key] = FieldNoise(*noise, "user")
    return found

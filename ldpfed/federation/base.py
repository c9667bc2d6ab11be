"""The federation-model door: how a federation really behaves, for the built-ins and a plugin's alike.

A federation model is how the federation behaves, not a different algorithm or trust model: the same run under
another federation model has the same users, world and noise, and the model decides how the populations differ,
which of each round's users answer and when their messages reach the server. A model declares (class
attributes) and implements (methods with defaults here, which are today's ideal federation):

* `name`, `about` (one line: the CLI's --federation help and `list`), `options` ({name: Option}: the model's own
  options, given as `--federation-option K=V`, a sweep file's `[federation_options]` table or
  `RunConfig.federation_options`; validated before any work by `checked_options`, recorded in the config,
  checkpoints and MLflow (`federation_options.X`));
* `ideal`: True when the model changes nothing (it draws nothing and the engines skip it);
* `partial_rounds`: True when a round's aggregate may lack some of the round's users (absent, late or lost);
* `shares()`: the populations' relative sizes (None: equal), how each round's users are split among them;
* `world(env, population)`: the env of a population's users (default: the run's env). The algorithm never sees
  it: its public world is the run's env, one world, and regret is measured against each user's own population's
  best arm (`Env.varied` builds a world drawn around the run's one);
* `present(round_index, population, users)`: the users of one population's share of a round who take part, a
  subset of `users` in their order;
* `delays(round_index, population, users)`: for each present user, the rounds its message reaches the server
  late (0: in its own round; LOST (-1): never), or None when every message is on time;
* `check(config)`: a ConfigError naming a field this model cannot run with.

Every draw comes from Generators derived from the run's seed (`stream`), so that a run stays a function of its
config: the same on every engine, after a retried round and after a resume.

The semantics every engine implements (ldpfed.engine.core `round_users` and `population_round`): a user who is not
present neither acts nor sends: no context, no action, no regret, no message. A present user acts in its round
(its regret is that round's) and its message, made with the model published for that round, reaches the server
`delay` rounds later: the server folds it into that later round's aggregate (after the round's own messages, in
the order of their rounds and populations), checked against the sum bounds of its users as a pre-aggregated
population's sum is. A reward that comes late is a message that comes late: in every algorithm here a user's
message carries its reward. A message due after the last round is never folded. An empty round folds an empty
aggregate, on its clock [start, stop) as any round.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from ldpfed.util.errors import ConfigError
from ldpfed.util.rng import derive
from ldpfed.util.options import checked_model_options, option_rows

IDEAL = "ideal"          # every user answers, at once: the default
LOST = -1                # a message's delay when it never reaches the server
# the aspects a model draws for, each from its own stream (Federation.stream): adding one changes no other's draws
ASPECTS = {"present": 0, "delay": 1, "reward_delay": 2, "world": 3, "shares": 4}


def per_population_numbers(value, key: str, what: str, low: float, high: float, low_open: bool = False) -> list:
    """An option's list of finite numbers in [low, high] (or (low, high]), one per population, as floats; else
    ConfigError naming federation_options.<key> (its length is checked against the run in `Federation.check`)."""
    if not isinstance(value, (list, tuple)) or not value or not all(
            isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
            and (low < v if low_open else low <= v) and v <= high for v in value):
        raise ConfigError(f"federation_options.{key}", value, f"must be a list of {what}, one per population")
    return [float(v) for v in value]


def check_one_per_population(options: dict, config, nouns: dict) -> None:
    """ConfigError naming federation_options.<key> for a given list (nouns: {key: what its entries are called})
    whose length is not the run's number of populations."""
    for key, noun in nouns.items():
        given = options[key]
        if given is not None and len(given) != config.populations:
            raise ConfigError(f"federation_options.{key}", given,
                              f"has {len(given)} {noun} for {config.populations} populations")


class Federation:
    """Which of a round's users take part (module doc). Found by name through the entry point group
    `ldpfed.federations`; built per run with the run's seed, populations and validated options."""

    name: str = ""
    about: str = ""
    options: dict = {}            # {option name: ldpfed.util.options.Option}
    ideal: bool = False           # every user answers: `present` returns its users unchanged and draws nothing
    partial_rounds: bool = True   # a round's aggregate may lack some of its users (refuses shuffle and shares)

    def __init__(self, seed: int = 0, populations: int = 1, options: dict | None = None):
        self.seed, self.populations = int(seed), int(populations)
        self.options = type(self).checked_options(dict(options or {}))

    @classmethod
    def of(cls, config) -> "Federation":
        """The model of a RunConfig (its options validated already)."""
        return cls(config.seed, config.populations, config.federation_options)

    # ---- options -------------------------------------------------------------------------------------------------
    @classmethod
    def checked_options(cls, given) -> dict:
        """Every option of this model, the given ones validated and the rest at their defaults (ConfigError naming
        `federation_options.<name>`: unknown, with the model that takes it or the closest name, or a bad value)."""
        from ldpfed.federation import FEDERATIONS

        return checked_model_options(cls, given, FEDERATIONS, "federation_options", "federation model",
                                     "--federation")

    @classmethod
    def option_table(cls) -> list[dict]:
        """The options as `describe` prints them (name, default, kind, bounds, doc)."""
        return option_rows(cls.options)

    def check(self, config) -> None:
        """ConfigError naming a RunConfig field that this model cannot run with (its options are checked first by
        checked_options); none by default."""

    # ---- the populations and the rounds ------------------------------------------------------------------------
    def stream(self, aspect: str, population: int, round_index: int = 0) -> np.random.Generator:
        """The Generator of one aspect's draws (ASPECTS) for one (population, round): a function of the run's seed."""
        keys = (population, round_index) if ASPECTS[aspect] == 0 else (population, round_index, ASPECTS[aspect])
        return derive(self.seed, "federation", *keys)

    def shares(self) -> np.ndarray | None:
        """The populations' relative sizes (positive, one per population), or None: equal shares."""
        return None

    def world(self, env, population: int):
        """The env of `population`'s users (the run's env by default; built once per population and kept)."""
        return env

    def present(self, round_index: int, population: int, users: np.ndarray) -> np.ndarray:
        """The users of `population`'s share of round `round_index` who take part (a subset of `users`, in order);
        all of them by default."""
        return users

    def delays(self, round_index: int, population: int, users: np.ndarray) -> np.ndarray | None:
        """Per present user, the rounds its message reaches the server late (int64; 0 on time, LOST never), or
        None: every message of these users is on time (the default)."""
        return None

    @property
    def late(self) -> bool:
        """True when this model's messages can arrive in a later round (a delay > 0): the runs count and hold them.
        Default: whether the class writes `delays`; a model says better per instance."""
        return type(self).delays is not Federation.delays

    @property
    def loses(self) -> bool:
        """True when this model's messages can be lost (a delay LOST). Default: whether the class writes `delays`."""
        return type(self).delays is not Federation.delays

    def summary(self) -> dict:
        """The run's summary entries: `federation` and each option as `federation_<name>` (lists as text)."""
        return {"federation": self.name,
                **{f"federation_{key}": (value if isinstance(value, (int, float, str, bool)) or value is None
                                         else str(value)) for key, value in sorted(self.options.items())}}


def check_federation_class(cls, where: str) -> None:
    """PluginError when a registered federation model breaks the contract (the registry's check)."""
    from ldpfed.plugins import PluginError
    from ldpfed.util.options import Option

    if not isinstance(cls.options, dict) or not all(isinstance(o, Option) for o in cls.options.values()):
        raise PluginError(f"{where}: options must be a dict of ldpfed.util.options.Option",
                          field=f"{cls.name}.options")
    if cls.ideal:
        changed = [hook for hook in ("shares", "world", "present", "delays")
                   if getattr(cls, hook) is not getattr(Federation, hook)]
        if changed:
            raise PluginError(f"{where}: an ideal federation model changes nothing (it writes {', '.join(changed)})",
                              field=f"{cls.name}.ideal")

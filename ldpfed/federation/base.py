"""The federation-model door: who of a round's users really takes part, for the built-ins and a plugin's alike.

A federation model is how the federation behaves, not a different algorithm or trust model: the same run under
another federation model has the same users, world and noise, and the model decides which of each round's users
answer. A model declares (class attributes) and implements (methods with defaults here):

* `name`, `about` (one line: the CLI's --federation help and `list`), `options` ({name: Option}: the model's own
  options, given as `--federation-option K=V`, a sweep file's `[federation_options]` table or
  `RunConfig.federation_options`; validated before any work by `checked_options`, recorded in the config,
  checkpoints and MLflow (`federation_options.X`));
* `ideal`: True when every user of every round answers (the model draws nothing and the engines skip it);
* `present(round_index, population, users)`: the users of one population's share of a round who take part, a
  subset of `users` in their order, drawn only from Generators derived from the run's seed
  (`ldpfed.util.rng.derive(seed, "federation", ...)`) so that a run stays a function of its config: the same on
  every engine, after a retried round and after a resume;
* `check(config)`: a ConfigError naming a field this model cannot run with.

The semantics every engine implements (ldpfed.engine.core `round_users`): a user who is not present neither acts
nor sends. It is not served in that round: no context, no action, no regret, no message; its message cannot reach
the aggregate because it is never made. The server folds the round's aggregate of the present users as usual,
with the round's user indices [start, stop) as its clock (an empty round folds an empty aggregate). A trust model
whose accounting counts on every user of a round being in its aggregate (a shuffled batch, noise shares that add
up to the round's noise) is refused with a model whose rounds can lose users (`partial_rounds`).
"""
from __future__ import annotations

import numpy as np

from ldpfed.util.options import checked_model_options, option_rows

IDEAL = "ideal"          # every user answers, at once: the default


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

    # ---- the rounds ------------------------------------------------------------------------------------------------
    def present(self, round_index: int, population: int, users: np.ndarray) -> np.ndarray:
        """The users of `population`'s share of round `round_index` who take part (a subset of `users`, in order);
        all of them by default."""
        return users

    def summary(self) -> dict:
        """The run's summary entries: `federation` and each option as `federation_<name>` (lists as text)."""
        return {"federation": self.name,
                **{f"federation_{key}": (value if isinstance(value, (int, float, str, bool)) or value is None
                                         else str(value)) for key, value in sorted(self.options.items())}}


def check_federation_class(cls, where: str) -> None:
    """PluginError when a registered federation model breaks the contract (the registry's check)."""
    from ldpfed.plugins import PluginError
    from ldpfed.util.options import Option

    if not callable(getattr(cls, "present", None)):
        raise PluginError(f"{where}: a federation model writes present", field=f"{cls.name}.present")
    if not isinstance(cls.options, dict) or not all(isinstance(o, Option) for o in cls.options.values()):
        raise PluginError(f"{where}: options must be a dict of ldpfed.util.options.Option",
                          field=f"{cls.name}.options")
    if cls.ideal and cls.present is not Federation.present:
        raise PluginError(f"{where}: an ideal federation model keeps every user (it writes no present)",
                          field=f"{cls.name}.ideal")

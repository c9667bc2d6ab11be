"""Options, declared once (an algorithm's, an env's, a trust model's): default, kind, bounds, documentation.

It sits at the bottom (ldpfed.util) so that both envs and algorithms declare their options with it; an env's are
checked the same way, with errors naming `env_params.<option>` (ldpfed.envs.base.Env.checked_params).

An algorithm lists its options as `options = {"alpha": Option(0.1, low=0, high=1, low_open=True, high_open=True,
doc="..."), ...}`; `Algorithm` derives `defaults` from them and validates every option of a run (defaults, the
profile's defaults, the user's values) in one place, before `setup()`, with `Option.validate`. A failure raises
ConfigError naming `params.<option>`. What depends on other options or on the world (e.g. s0 "auto", a value
resolved from the env) stays in `setup`, which may call `Option.validate` on the resolved value.

Kinds: "float" (a real number, bool excluded; nan never; inf only with allow_inf), "int" (an integer, bool
excluded), "choice" (one of `choices`), "bool" (true or false), "any" (accepted as it is: options of classes that
list plain `defaults`). `allow`: values accepted as they are whatever the kind (e.g. None, "auto"), compared by
type and value (so 1 is not True).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import KW_ONLY, dataclass, replace
from typing import Any

import numpy as np

from ldpfed.util.errors import ConfigError

KINDS = ("float", "int", "choice", "bool", "any")


def _same(a, b) -> bool:
    return a is b or (type(a) is type(b) and isinstance(a, (str, int, float)) and a == b)


def _number(x) -> str:
    """A bound as text: 1.0 -> 1, inf -> inf."""
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    return str(x)


@dataclass(frozen=True)
class Option:
    """One option: its default and what values it accepts (see the module doc)."""

    default: Any
    _: KW_ONLY
    kind: str = "float"
    low: float | None = None
    high: float | None = None
    low_open: bool = False       # low itself excluded
    high_open: bool = False      # high itself excluded
    allow_inf: bool = False      # a float option that may be +inf (e.g. "no projection")
    choices: tuple | None = None
    allow: tuple = ()            # values accepted as they are (None, "auto", ...)
    doc: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise TypeError(f"Option kind {self.kind!r} must be one of {KINDS}")
        if self.kind == "choice" and not self.choices:
            raise TypeError("a choice Option needs choices")
        if self.choices is not None:
            object.__setattr__(self, "choices", tuple(self.choices))
        object.__setattr__(self, "allow", tuple(self.allow))

    # ---- checking ------------------------------------------------------------------------------------------
    def validate(self, name: str, value, where: str = "params"):
        """The value as the algorithm (or env) uses it (a float option as float, an int option as int), or
        ConfigError naming <where>.<name> (where: "params" for an algorithm's, "env_params" for an env's) with what
        is accepted; "trust_options" for a trust model's)."""
        if any(_same(value, a) for a in self.allow):
            return value
        kind = self.kind
        if kind == "any":
            return value
        if kind == "bool":
            if isinstance(value, (bool, np.bool_)):
                return bool(value)
            self._fail(name, value, where)
        if kind == "choice":
            if any(_same(value, c) for c in self.choices):
                return value
            self._fail(name, value, where)
        if isinstance(value, (bool, np.bool_)):
            self._fail(name, value, where)
        if kind == "int":
            if not isinstance(value, numbers.Integral):
                self._fail(name, value, where)
            v = int(value)
        else:
            if not isinstance(value, numbers.Real):
                self._fail(name, value, where)
            v = float(value)
            if math.isnan(v) or (math.isinf(v) and not (self.allow_inf and v > 0)):
                self._fail(name, value, where)
        if self.low is not None and (v < self.low or (self.low_open and v == self.low)):
            self._fail(name, value, where)
        if self.high is not None and (v > self.high or (self.high_open and v == self.high)):
            self._fail(name, value, where)
        return v

    def _fail(self, name, value, where):
        raise ConfigError(f"{where}.{name}", value, f"must be {self.accepts()}")

    # ---- description ---------------------------------------------------------------------------------------
    def bounds(self) -> str:
        """The accepted range or choices as text: "(0, 1)", "[0, inf]", "one of ['classic', 'analytic']", ""."""
        if self.kind == "choice":
            return f"one of {list(self.choices)}"
        if self.kind in ("bool", "any"):
            return ""
        if self.low is None and self.high is None:
            return "[-inf, inf]" if self.allow_inf else ""
        low = "-inf" if self.low is None else _number(self.low)
        high = ("inf" if self.high is None else _number(self.high))
        left = "(" if (self.low is None or self.low_open) else "["
        right = "]" if (self.high is None and self.allow_inf) else (")" if (self.high is None or self.high_open)
                                                                    else "]")
        return f"{left}{low}, {high}{right}"

    def accepts(self) -> str:
        """What validate accepts, as the end of "must be ..."."""
        if self.kind == "bool":
            text = "true or false"
        elif self.kind == "choice":
            text = f"one of {list(self.choices)}"
        elif self.kind == "any":
            text = "anything"
        else:
            what = "an integer" if self.kind == "int" else ("a number" if self.allow_inf else "a finite number")
            bounds = self.bounds()
            text = f"{what} in {bounds}" if bounds else what
        if self.allow:
            text += ", or " + " or ".join(repr(a) for a in self.allow)
        return text

    def row(self, name: str) -> dict:
        """One row of Algorithm.option_table() and Env.option_table()."""
        return {"name": name, "default": self.default, "kind": self.kind, "bounds": self.bounds(),
                "choices": list(self.choices) if self.choices else None, "allow": list(self.allow), "doc": self.doc,
                "accepts": self.accepts()}


def options_from_defaults(defaults: dict, inherited: dict) -> dict:
    """Options for a class that lists plain `defaults`: an inherited Option of the same name keeps its checks with
    the new default; any other option is of kind "any" (accepted as it is)."""
    return {name: (replace(inherited[name], default=value) if name in inherited else Option(value, kind="any"))
            for name, value in defaults.items()}


# ---- what every owner of options (algorithm, env, trust model) does with them, in one place ----------------------
def declare_options(cls, group: str) -> None:
    """For a class's `__init_subclass__`: `defaults` derived from the class's own `options` (each Option's default
    must pass its own check: TypeError naming the class otherwise); for a class that lists plain `defaults`,
    options built from them (options_from_defaults). group: what errors call the options ("params", "env_params")."""
    own = cls.__dict__
    if "options" in own:
        if "defaults" in own:
            raise TypeError(f"{cls.__qualname__}: declare `options` only; `defaults` is derived from them")
        for name, option in cls.options.items():
            if not isinstance(option, Option):
                raise TypeError(f"{cls.__qualname__}.options[{name!r}] must be an Option, not {option!r}")
            try:
                option.validate(name, option.default, group)
            except ConfigError as error:
                raise TypeError(f"{cls.__qualname__}: the default of option {name!r} fails its own check: "
                                f"{error}") from None
        cls.defaults = {name: option.default for name, option in cls.options.items()}
    elif isinstance(own.get("defaults"), dict):
        cls.options = options_from_defaults(own["defaults"], super(cls, cls).options)


def refuse_unknown(given: dict, known, group: str, owner: str) -> None:
    """ConfigError naming <group>.<name> for the first name of `given` that is not `known`, with the closest known
    name and the list of them (owner: "of ldp-sgd", "of env linear", ...)."""
    unknown = set(given) - set(known)
    if not unknown:
        return
    import difflib

    name = sorted(unknown, key=str)[0]
    close = difflib.get_close_matches(str(name), [str(k) for k in known], n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ConfigError(f"{group}.{name}", given[name], f"unknown option {owner}{hint}; known: {sorted(known)}")


def checked_model_options(cls, given, registry, group: str, kind: str, flag: str) -> dict:
    """Every option of a pluggable model (a trust model, a federation model), the given ones validated and the rest
    at their defaults. ConfigError naming `<group>.<name>`: an option of another registered model says which one
    takes it; an unknown one gets the closest name; a bad value says what is accepted.
    registry: the models by name; kind: "trust model"; flag: the CLI flag that picks the model ("--trust")."""
    if not isinstance(given, dict):
        raise ConfigError(group, given, "must be a mapping of option names to values")
    for key in given:
        takers = [name for name in sorted(registry) if key in registry[name].options]
        if key not in cls.options and takers:      # another model's option: say which
            plural = len(takers) > 1
            raise ConfigError(f"{group}.{key}", given[key],
                              f"only the {' and '.join(takers)} {kind}{'s' if plural else ''} "
                              f"take{'' if plural else 's'} it (this run's {kind} is {cls.name!r}); "
                              f"use {flag} {takers[0]} or drop it")
    refuse_unknown(given, cls.options, group, f"of the {cls.name} {kind}")
    return {key: option.validate(key, given.get(key, option.default), group) for key, option in cls.options.items()}


def option_rows(options: dict, profile_defaults: dict | None = None) -> list[dict]:
    """One `Option.row` per option, with the profiles whose default differs ({"authors-code": value}): what
    `describe` prints of an algorithm's, an env's or a trust model's options."""
    rows = []
    for name, option in options.items():
        row = option.row(name)
        row["profiles"] = {profile: values[name] for profile, values in (profile_defaults or {}).items()
                           if name in values}
        rows.append(row)
    return rows

"""Algorithm options declared once (ldpfed/algorithms/options.py): the checks of Option, the defaults derived from
the options, the one validation of a run's options before setup, and option_table."""
import math
from types import SimpleNamespace

import numpy as np
import pytest

from ldpfed.algorithms import REGISTRY
from ldpfed.algorithms.base import Algorithm
from ldpfed.algorithms.options import Option
from ldpfed.util.errors import ConfigError

BUILT_IN = sorted(name for name in REGISTRY if REGISTRY.source(name) == "ldpfed")


def _fails(option, value, name="x"):
    with pytest.raises(ConfigError) as info:
        option.validate(name, value)
    assert info.value.field == f"params.{name}"
    return str(info.value)


def test_float_options():
    unit = Option(0.1, low=0, high=1, low_open=True, high_open=True)
    assert unit.validate("x", 0.5) == 0.5 and type(unit.validate("x", np.float32(0.25))) is float
    for bad in (0, 1, 1.5, -0.1, math.nan, math.inf, True, "0.5", None, [0.5]):
        assert "(0, 1)" in _fails(unit, bad)
    half_open = Option(1.0, low=0)
    assert half_open.validate("x", 0) == 0.0 and type(half_open.validate("x", 3)) is float
    assert type(half_open.validate("x", np.int64(3))) is float
    _fails(half_open, -1e-300)
    _fails(half_open, math.inf)
    infinite = Option(math.inf, low=0, low_open=True, allow_inf=True)
    assert infinite.validate("x", math.inf) == math.inf
    for bad in (-math.inf, math.nan, 0.0):
        _fails(infinite, bad)
    auto = Option("auto", low=0, allow=("auto",))
    assert auto.validate("x", "auto") == "auto" and auto.validate("x", 2) == 2.0
    assert "'auto'" in _fails(auto, "AUTO")


def test_int_choice_bool_and_allowed_values():
    count = Option(None, kind="int", low=1, allow=(None,))
    assert count.validate("x", None) is None and count.validate("x", np.int64(4)) == 4
    for bad in (0, 2.0, 2.5, True, "3"):
        _fails(count, bad)
    choice = Option("a", kind="choice", choices=("a", "b"))
    assert choice.validate("x", "b") == "b"
    for bad in ("c", 1, None):
        assert "one of ['a', 'b']" in _fails(choice, bad)
    flag = Option(True, kind="bool")
    assert flag.validate("x", np.bool_(False)) is False
    for bad in (1, 0, "true", None):
        assert "true or false" in _fails(flag, bad)
    assert Option(1, allow=(True,), kind="int").validate("x", 1) == 1          # 1 is not the allowed True ...
    assert Option(1, allow=(True,), kind="int").validate("x", True) is True     # ... and True is accepted as is
    assert Option(object(), kind="any").validate("x", "anything") == "anything"
    with pytest.raises(TypeError):
        Option("a", kind="choice")
    with pytest.raises(TypeError):
        Option(1.0, kind="complex")


def test_bounds_text():
    assert Option(0.5, low=0, high=1, low_open=True).bounds() == "(0, 1]"
    assert Option(1.0, low=0).bounds() == "[0, inf)"
    assert Option(1.0, low=0, low_open=True, allow_inf=True).bounds() == "(0, inf]"
    assert Option(1.0, high=2.5).bounds() == "(-inf, 2.5]"
    assert Option("a", kind="choice", choices=("a", "b")).bounds() == "one of ['a', 'b']"


class _Toy(Algorithm):
    name = "toy"
    options = {"rate": Option(0.5, low=0, high=1, doc="a rate"),
               "mode": Option("fast", kind="choice", choices=("fast", "slow"), doc="a mode")}
    profile_defaults = {"authors-code": {"rate": 2.0}}       # invalid on purpose: the profile's values are checked
    setups = 0

    def setup(self):
        type(self).setups += 1


def _config(params=None, profile="paper"):
    return SimpleNamespace(params=params or {}, profile=profile, eps=1.0, delta=0.1, users=10)


WORLD = SimpleNamespace(d=2, K=3)


def test_defaults_come_from_the_options_and_every_value_is_checked_before_setup():
    assert _Toy.defaults == {"rate": 0.5, "mode": "fast"}
    toy = _Toy(WORLD, _config({"rate": 1}))
    assert toy.params == {"rate": 1.0, "mode": "fast"} and type(toy.params["rate"]) is float
    before = _Toy.setups
    for params, profile, field in (({"rate": -1}, "paper", "params.rate"), ({"mode": "medium"}, "paper", "params.mode"),
                                   ({}, "authors-code", "params.rate"), ({"speed": 1}, "paper", "params.speed")):
        with pytest.raises(ConfigError) as info:
            _Toy(WORLD, _config(params, profile))
        assert info.value.field == field
    assert _Toy.setups == before                                          # setup never ran on a bad option
    assert _Toy(WORLD, _config({"rate": 0.2}, "authors-code")).params["rate"] == 0.2


def test_declaring_options_wrongly_fails_at_class_creation():
    with pytest.raises(TypeError, match="default of option 'rate'"):
        type("Bad", (Algorithm,), {"options": {"rate": Option(2.0, low=0, high=1)}})
    with pytest.raises(TypeError, match="must be an Option"):
        type("Bad", (Algorithm,), {"options": {"rate": 0.5}})
    with pytest.raises(TypeError, match="options` only"):
        type("Bad", (Algorithm,), {"options": {}, "defaults": {}})


def test_plain_defaults_still_work_and_keep_inherited_checks():
    plain = type("Plain", (Algorithm,), {"defaults": {"anything": [1, 2]}})
    assert plain.options["anything"].kind == "any" and plain(WORLD, _config({"anything": "x"})).params["anything"] == "x"
    child = type("Child", (_Toy,), {"defaults": {"rate": 0.25, "mode": "slow", "extra": None}})
    assert child.options["rate"].default == 0.25 and child.options["rate"].high == 1
    with pytest.raises(ConfigError, match="params.rate"):
        child(WORLD, _config({"rate": 5.0}))


@pytest.mark.parametrize("name", BUILT_IN)
def test_built_in_algorithms_declare_documented_options(name):
    cls = REGISTRY[name]
    assert cls.defaults == {option: o.default for option, o in cls.options.items()}
    rows = cls.option_table()
    assert [row["name"] for row in rows] == list(cls.defaults)
    for row in rows:
        assert row["doc"] and row["kind"] in ("float", "int", "choice", "bool"), row
        assert set(row) >= {"name", "default", "kind", "bounds", "choices", "allow", "accepts", "doc", "profiles"}
    for profile, values in cls.profile_defaults.items():             # the profiles' defaults pass the checks too
        cls.validate_params(values)

"""The one door for algorithms and envs (ldpfed/plugins.py) and the contract checked at it
(ldpfed/algorithms/contract.py): built-ins come through the `ldpfed.algorithms` / `ldpfed.envs` entry points,
other classes through register() or LDPFED_PLUGINS, and a class that breaks the contract is refused with an error
naming what is wrong."""
import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points

import numpy as np
import pytest

from ldpfed.algorithms import REGISTRY, Algorithm, make_algorithm
from ldpfed.algorithms.glm_ldp import LdpOls
from ldpfed.algorithms.ldp_reductions import LdpMabUcb, Ucb
from ldpfed.mechanisms import Domain
from ldpfed.config import RunConfig
from ldpfed.engine import run_local
from ldpfed.envs import ENVS, make_env
from ldpfed.plugins import ALGORITHM_GROUP, ENV_GROUP, PLUGINS_VAR, PluginError, Registry
from ldpfed.util.errors import ConfigError


def test_builtins_come_through_the_entry_points():
    """Every registered built-in is one entry point of the ldpfed package, named as the class, and back."""
    for group, registry in ((ALGORITHM_GROUP, REGISTRY), (ENV_GROUP, ENVS)):
        points = {p.name: p for p in entry_points(group=group) if p.dist.metadata["Name"] == "ldpfed"}
        builtins = {name for name in registry if registry.source(name) == "ldpfed"}
        assert builtins == set(points), group
        for name in builtins:
            assert points[name].load() is registry[name]
            assert registry[name].name == name


@pytest.fixture
def registered():
    """Classes registered by a test, removed after it."""
    names = []

    def add(cls):
        REGISTRY.register(cls)
        names.append(cls.name)
        return cls

    yield add
    for name in names:
        REGISTRY.unregister(name)


def test_a_registered_class_runs_like_a_builtin(registered):
    class MyUcb(Ucb):
        name = "my-ucb"

    registered(MyUcb)
    assert REGISTRY.source("my-ucb") == "register()"
    mine = run_local(RunConfig("my-ucb", users=300, round_size=10, seed=3))
    theirs = run_local(RunConfig("ucb", users=300, round_size=10, seed=3))
    assert mine.summary["final_regret"] == theirs.summary["final_regret"]


def test_duplicates_and_bad_names_are_refused(registered):
    class Clash(Ucb):
        name = "ucb"

    with pytest.raises(PluginError, match="'ucb' is already provided by 'ldpfed'"):
        REGISTRY.register(Clash)

    class BadName(Ucb):
        name = "Bad Name"

    with pytest.raises(PluginError, match="lower case"):
        REGISTRY.register(BadName)
    with pytest.raises(PluginError, match="subclass of ldpfed.algorithms.base.Algorithm"):
        REGISTRY.register(type("NotAnAlgorithm", (), {"name": "x"}))
    with pytest.raises(PluginError, match="was not added by register"):
        REGISTRY.unregister("ucb")


@pytest.mark.parametrize("attrs, field", [
    ({"default_env": "linear"}, "default_env"),
    ({"privacy_model": "shuffle"}, "privacy_model"),
    ({"env_kinds": ()}, "env_kinds"),
    ({"profile_defaults": {"authors-code": {"nope": 1}}}, "profile_defaults.authors-code"),
])
def test_class_contract(attrs, field):
    cls = type("Broken", (Ucb,), {"name": "broken-ucb", **attrs})
    with pytest.raises(PluginError) as caught:
        REGISTRY.register(cls)
    assert caught.value.field == f"broken-ucb.{field}"
    assert "broken-ucb" not in REGISTRY


def test_an_algorithm_must_write_its_halves():
    from ldpfed.algorithms import Algorithm

    cls = type("Half", (Algorithm,), {"name": "half", "env_kinds": ("bernoulli",), "default_env": "bernoulli",
                                      "initial_state": lambda self, rng: {}, "message_spec": lambda self: {}})
    with pytest.raises(PluginError, match="half.*update: not implemented"):
        REGISTRY.register(cls)


class HandWrittenOls(LdpOls):
    """ldp-ols in the older style: message_spec and message_domains written by hand, no fields()."""
    fields = Algorithm.fields

    def message_spec(self):
        return {"M": (self.d, self.d), "u": (self.d,)}

    def message_domains(self):
        return {"M": self.mech_M.output_domain((self.d, self.d), self.C_B ** 2),
                "u": self.mech_u.output_domain((self.d,), self.c_r * self.C_B)}


def _built(cls, registered, **config):
    registered(cls)
    config = RunConfig(cls.name, users=100, round_size=10, **config)
    return make_algorithm(make_env(config), config)


def test_a_field_without_a_domain_is_refused(registered):
    class NoDomain(HandWrittenOls):
        name = "no-domain"

        def message_domains(self):
            return {"M": super().message_domains()["M"]}

    with pytest.raises(PluginError, match="message field 'u'.*has no domain") as caught:
        _built(NoDomain, registered)
    assert caught.value.field == "no-domain.message field 'u'"


def test_an_ldp_field_no_mechanism_made_is_refused(registered):
    """Under local DP a field that is neither a mechanism's output nor public would carry raw data."""

    class Raw(HandWrittenOls):
        name = "raw-field"

        def message_spec(self):
            return {**super().message_spec(), "r": (1,)}

        def message_domains(self):
            return {**super().message_domains(), "r": Domain((1,), low=-1, high=1, source="the raw reward")}

    with pytest.raises(PluginError, match="message field 'r'.*made by no mechanism and is not public"):
        _built(Raw, registered)


def test_a_domain_of_the_wrong_shape_is_refused(registered):
    class Wide(HandWrittenOls):
        name = "wide-u"

        def message_domains(self):
            return {**super().message_domains(), "u": Domain((3,), low=0, high=1)}

    with pytest.raises(PluginError, match=r"'u'.*shape \(3,\), the spec \(2,\)"):
        _built(Wide, registered)


@pytest.mark.parametrize("row, what", [
    ({"per_user": 0}, "per_user 0"),
    ({"eps": float("nan")}, "eps nan"),
    ({"delta": 1.5}, "delta 1.5"),
])
def test_a_ledger_that_does_not_compose_is_refused(registered, row, what):
    class BadLedger(LdpMabUcb):
        name = "bad-ledger"

        def ledger(self):
            return [{**r, **row} for r in super().ledger()]

    with pytest.raises(PluginError, match=f"ledger row 'reward'.*{what}"):
        _built(BadLedger, registered)


def test_a_private_algorithm_needs_a_ledger(registered):
    class Silent(LdpMabUcb):
        name = "silent"

        def ledger(self):
            return []

    with pytest.raises(PluginError, match="ledger: empty"):
        _built(Silent, registered)


PLUGIN_MODULE = """
from ldpfed.algorithms.ldp_reductions import LdpMabUcb


class EnvUcb(LdpMabUcb):
    '''LDP-UCB under another name, found through LDPFED_PLUGINS.'''
    name = "env-ucb"
"""


def test_environment_variable_plugins(tmp_path, monkeypatch):
    (tmp_path / "my_plugin.py").write_text(PLUGIN_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(PLUGINS_VAR, "my_plugin:EnvUcb")
    from ldpfed.algorithms import Algorithm

    fresh = Registry(ALGORITHM_GROUP, "algorithm", lambda: Algorithm)
    assert fresh.source("env-ucb") == PLUGINS_VAR and "ldp-ols" in fresh
    monkeypatch.setenv(PLUGINS_VAR, "my_plugin:Missing")
    with pytest.raises(PluginError, match="module 'my_plugin' has no 'Missing'"):
        Registry(ALGORITHM_GROUP, "algorithm", lambda: Algorithm)["ldp-ols"]


@pytest.mark.slow     # a Ray instance of its own: ~33 s; run by jobs/slow_tests.py
def test_environment_plugin_runs_on_ray_workers(tmp_path):
    """A module that is not installed, listed in LDPFED_PLUGINS: the Ray engine's workers (a new local Ray, in a
    subprocess) find it too, and its run equals the same algorithm's under its built-in name."""
    (tmp_path / "my_plugin.py").write_text(PLUGIN_MODULE)
    script = textwrap.dedent("""
        import json
        from ldpfed.config import RunConfig
        from ldpfed.engine import run
        out = {}
        for name in ("env-ucb", "ldp-mab-ucb"):
            result = run(RunConfig(name, users=400, round_size=20, populations=2, seed=5), engine="ray",
                         actors=2, shards=2, mode="per-user")
            out[name] = result.summary["final_regret"]
        print(json.dumps(out))
    """)
    env = {**os.environ, PLUGINS_VAR: "my_plugin:EnvUcb", "PYTHONPATH": str(tmp_path), "RAY_ADDRESS": ""}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    regrets = json.loads(done.stdout.strip().splitlines()[-1])
    assert regrets["env-ucb"] == regrets["ldp-mab-ucb"] and np.isfinite(regrets["env-ucb"])


def test_cli_reports_a_broken_plugin(tmp_path):
    (tmp_path / "broken.py").write_text(PLUGIN_MODULE + textwrap.dedent("""

        class NoDomain(EnvUcb):
            name = "no-domain"

            def fields(self):
                from ldpfed.algorithms.fields import Field
                return {**super().fields(), "hint": Field((1,))}
    """))
    env = {**os.environ, PLUGINS_VAR: "broken:NoDomain", "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "ldpfed", "run", "no-domain", "--users", "50"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "message field 'hint' declares no domain" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_sweep_runs_a_registered_plugin(registered, tmp_path):
    from ldpfed import sweep_spec as sweeps

    class SweepUcb(Ucb):
        name = "sweep-ucb"

    registered(SweepUcb)
    sweep = sweeps.build({"name": "plugin", "algorithms": ["sweep-ucb", "ucb"], "seeds": [0, 1], "users": 200,
                          "params": {"sweep-ucb": {}}})
    configs = sweeps.configs(sweep)
    assert [c.algorithm for c in configs] == ["sweep-ucb", "sweep-ucb", "ucb", "ucb"]
    assert [c.env for c in configs] == ["bernoulli"] * 4
    results = [run_local(c.replace(round_size=20)).summary["final_regret"] for c in configs]
    assert results[:2] == results[2:]       # the same algorithm under two names, the same seeds


def test_a_broken_field_declaration_names_the_field(registered):
    """fields(): a public field without its domain, a Gaussian field without the public bound of its input; and a
    class that declares fields() while it (or a parent) writes message_domains by hand: which one holds?"""
    from ldpfed.algorithms.fields import Field
    from ldpfed.algorithms.klucb import SWKLUCBCF
    from ldpfed.mechanisms import GaussianMechanism

    class NoPublicDomain(SWKLUCBCF):
        name = "no-public-domain"

        def fields(self):
            return {**super().fields(), "pulls": Field((self.K,))}

    class NoDataBound(SWKLUCBCF):
        name = "no-data-bound"

        def fields(self):
            return {**super().fields(), "feedback": Field((self.K,), mechanism=GaussianMechanism(1.0, self.eps, 0.01))}

    with pytest.raises(PluginError, match="'pulls' declares no domain.*a public field \\(no mechanism\\) must state"):
        _built(NoPublicDomain, registered)
    with pytest.raises(PluginError, match="'feedback' declares no domain.*give the Field a data_bound"):
        _built(NoDataBound, registered)

    class Both(HandWrittenOls):
        name = "both"

        def fields(self):
            return {}

    with pytest.raises(PluginError, match="fields: declared, but .* also writes message_spec, message_domains"):
        REGISTRY.register(Both)


def _python_act(model, consts, contexts, i, user, draws, actions):      # not compiled
    actions[i] = 0


@pytest.mark.parametrize("change,what", [
    ({"steps": lambda self: LdpOls.steps(self)._replace(act=_python_act)}, "steps.act"),
    ({"model_keys": ("theta", "nowhere")}, "model_keys"),
    ({"initial_state": lambda self, rng: {**LdpOls.initial_state(self, rng), "t": 0}}, "state_keys.t"),
    ({"metric_names": ("clipped_context", 3)}, "metric_names"),
])
def test_a_compiled_algorithm_that_breaks_its_contract_is_refused(registered, change, what):
    """Written once (ldpfed.algorithms.compiled): compiled steps, model keys among the state keys, state arrays,
    metric names; each break names what is wrong."""
    broken = type("Broken", (LdpOls,), {"name": "broken-ols", **change})
    with pytest.raises(PluginError) as caught:
        _built(broken, registered)
    assert caught.value.field == f"broken-ols.{what}"


def test_a_compiled_field_needs_a_mechanism_that_privatizes_rows(registered):
    class Opaque:            # a mechanism of the protocol without the compiled row (row_kernel / draw_rows)
        def __init__(self, inner):
            self.inner, self.guarantee = inner, inner.guarantee

        def privatize(self, x, rng):
            return self.inner.privatize(x, rng)

        def output_domain(self, shape, data_bound=None, **schedule):
            return self.inner.output_domain(shape, data_bound, **schedule)

        def dp_event(self):
            return self.inner.dp_event()

    class OpaqueOls(LdpOls):
        name = "opaque-ols"

        def _setup(self):
            super()._setup()
            self.mech_u = Opaque(self.mech_u)
            self.mechanisms = {"M": self.mech_M, "u": self.mech_u}

    with pytest.raises(PluginError, match="cannot privatize a compiled row") as caught:
        _built(OpaqueOls, registered)
    assert caught.value.field == "opaque-ols.message field 'u'"


# ---- env kinds: an algorithm runs on every env of the kinds it lists ------------------------------------------------
# Which built-in algorithm ran on which built-in env when algorithms listed env names (before env kinds): the kinds
# must keep exactly these pairs.
BUILTIN_PAIRS = {
    "bco-one-point": {"convex"}, "bco-two-point": {"convex"},
    "ldp-bco-one-point": {"convex"}, "ldp-bco-two-point": {"convex"},
    "klucb": {"piecewise-bernoulli", "bernoulli"}, "klucb-cf": {"piecewise-bernoulli", "bernoulli"},
    "sw-klucb": {"piecewise-bernoulli", "bernoulli"}, "sw-klucb-cf": {"piecewise-bernoulli", "bernoulli"},
    "ldp-mab-adversarial": {"bernoulli", "piecewise-bernoulli"}, "ldp-mab-ucb": {"bernoulli", "piecewise-bernoulli"},
    "tsallis-inf": {"bernoulli", "piecewise-bernoulli"}, "ucb": {"bernoulli", "piecewise-bernoulli"},
    "lasso-bandit": {"sparse-linear"}, "private-lasso": {"sparse-linear"},
    "ldp-gloc": {"linear", "logistic"}, "ldp-ucb": {"linear", "logistic"},
    "ldp-ols": {"linear", "logistic", "poisson"}, "ldp-sgd": {"linear", "logistic", "poisson"},
    "ols": {"linear", "logistic", "poisson"},
    "ldp-ols-multi": {"linear-multi", "logistic-multi", "poisson-multi", "classification"},
    "ldp-sgd-multi": {"linear-multi", "logistic-multi", "poisson-multi", "classification"},
    "ols-multi": {"linear-multi", "logistic-multi", "poisson-multi", "classification"},
    "linucb": {"arm-pool", "linear"}, "linucb-dgs": {"arm-pool", "linear"}, "private-linucb": {"arm-pool", "linear"},
    "uniform": {"linear", "logistic", "poisson", "linear-multi", "logistic-multi", "poisson-multi", "bernoulli",
                "piecewise-bernoulli", "sparse-linear", "arm-pool", "classification"},
}


def test_env_kinds_keep_the_builtin_pairs():
    builtin_envs = {name for name in ENVS if ENVS.source(name) == "ldpfed"}
    builtins = {name for name in REGISTRY if REGISTRY.source(name) == "ldpfed"}
    assert builtins == set(BUILTIN_PAIRS)
    now = {name: {env for env in builtin_envs if REGISTRY[name].runs_on(env)} for name in builtins}
    assert now == BUILTIN_PAIRS
    for name in builtins:     # envs() lists the same, the default first; RunConfig agrees with runs_on
        envs = REGISTRY[name].envs()
        assert set(envs) >= BUILTIN_PAIRS[name] and envs[0] == REGISTRY[name].default_env
    with pytest.raises(ConfigError, match="runs on"):
        RunConfig("ldp-ols", env="linear-multi")


@pytest.fixture
def env_registered():
    """Env classes registered by a test, removed after it."""
    names = []

    def add(cls):
        ENVS.register(cls)
        names.append(cls.name)
        return cls

    yield add
    for name in names:
        ENVS.unregister(name)


def test_an_env_of_a_kind_runs_every_algorithm_of_that_kind(env_registered):
    from ldpfed.envs.glm import Linear, LinearMulti

    class Shifted(Linear):
        """A linear world under another name: of kind "linear"."""
        name = "shifted-linear"
        kinds = ("linear",)

    class Alone(Linear):
        name = "alone-linear"

    env_registered(Shifted)
    env_registered(Alone)
    assert Shifted.kinds_of() == ("shifted-linear", "linear")
    runs = {name for name, cls in REGISTRY.items() if cls.runs_on("shifted-linear")}
    assert runs == {name for name, cls in REGISTRY.items() if cls.runs_on("linear")}
    assert {"ldp-ols", "ldp-sgd", "linucb"} <= runs
    assert not any(cls.runs_on("alone-linear") for cls in REGISTRY.values())     # its own kind only
    # it runs with no patching of any algorithm, and the same seed gives the same world as "linear"
    mine = run_local(RunConfig("ldp-ols", env="shifted-linear", users=300, round_size=10, seed=2))
    theirs = run_local(RunConfig("ldp-ols", env="linear", users=300, round_size=10, seed=2))
    assert mine.summary["final_regret"] == theirs.summary["final_regret"]
    assert "shifted-linear" in REGISTRY["ldp-sgd"].envs()
    with pytest.raises(ConfigError, match="runs on"):
        RunConfig("ldp-ols", env="alone-linear")
    # an algorithm may name a plugin env of its kinds as its default env
    cls = type("DefaultsToShifted", (LdpOls,), {"name": "defaults-to-shifted", "default_env": "shifted-linear"})
    REGISTRY.register(cls)
    try:
        assert RunConfig("defaults-to-shifted", users=50).env == "shifted-linear"
    finally:
        REGISTRY.unregister("defaults-to-shifted")

    class Bad(LinearMulti):
        name = "bad-kinds"
        kinds = "linear"                          # a string, not a tuple of names

    with pytest.raises(PluginError, match="kinds"):
        ENVS.register(Bad)


@pytest.mark.parametrize("params,field", [
    ({"noise_std": float("nan")}, "env_params.noise_std"),
    ({"noise_std": float("inf")}, "env_params.noise_std"),
    ({"noise_std": "inf"}, "env_params.noise_std"),
    ({"noise_std": -0.5}, "env_params.noise_std"),
    ({"d": 2.5}, "env_params.d"),
    ({"d": float("nan")}, "env_params.d"),
    ({"d": True}, "env_params.d"),
    ({"K": 1}, "env_params.K"),
    ({"contexts": "cube"}, "env_params.contexts"),
    ({"noise_sdt": 0.1}, "env_params.noise_sdt"),
])
def test_bad_env_options_are_refused_by_runconfig(params, field):
    with pytest.raises(ConfigError) as info:          # at RunConfig: before any work
        RunConfig("ldp-ols", env="linear", users=100, env_params=params)
    assert info.value.field == field
    if "noise_sdt" in params:
        assert "did you mean 'noise_std'" in info.value.reason


def test_env_cross_checks_run_in_runconfig():
    with pytest.raises(ConfigError) as info:
        RunConfig("ucb", env="piecewise-bernoulli", users=10, env_params={"breakpoints": 10})
    assert info.value.field == "env_params.breakpoints"
    with pytest.raises(ConfigError) as info:
        RunConfig("private-lasso", users=10, env_params={"d": 5, "s0": 6})
    assert info.value.field == "env_params.s0"
    with pytest.raises(ConfigError) as info:
        RunConfig("linucb", users=10, env_params={"pool": 5, "K": 6})
    assert info.value.field == "env_params.K"


def test_env_option_table_documents_every_builtin_option():
    for name, env in ENVS.items():
        if ENVS.source(name) != "ldpfed":
            continue
        rows = env.option_table()
        assert [row["name"] for row in rows] == list(env.defaults), name
        for row in rows:
            assert row["doc"], (name, row["name"])

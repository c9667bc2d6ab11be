"""Trust models are objects (ldpfed.trust): found by name through the entry point group
ldpfed.trust_models like algorithms, each saying where the noise goes, how the run is accounted and what noise the
server's aggregate carries (`Algorithm.field_noise`); no code outside them compares trust-model names."""
import re
from pathlib import Path

import pytest

from ldpfed.algorithms import make_algorithm
from ldpfed.trust import TRUST_MODELS, FieldNoise, TrustModel, trust_model
from ldpfed.trust.central import CentralTrust
from ldpfed.trust.local import LocalTrust
from ldpfed.trust.shuffle import ShuffleTrust
from ldpfed.config import RunConfig
from ldpfed.engine import run_local
from ldpfed.envs import make_env
from ldpfed.util.errors import ConfigError

PACKAGE = Path(__file__).resolve().parents[1] / "ldpfed"


def built(name, **changes):
    config = RunConfig(name, **{**dict(users=4000, round_size=2000, eps=1.0, delta=1e-6), **changes})
    return config, make_algorithm(make_env(config), config)


def test_the_built_in_trust_models_come_through_the_entry_points():
    assert sorted(TRUST_MODELS) == ["central", "local", "secagg", "shuffle"]
    assert [TRUST_MODELS[name] for name in ("local", "shuffle", "central")] == [LocalTrust, ShuffleTrust, CentralTrust]
    assert TRUST_MODELS.source("shuffle") == "ldpfed"
    assert isinstance(trust_model(RunConfig("ldp-sgd", trust="central")), CentralTrust)
    with pytest.raises(ConfigError, match="choose from"):
        RunConfig("ldp-sgd", trust="trusted-friend")


def test_no_code_outside_the_trust_models_compares_their_names():
    """A new trust model must not need edits elsewhere: no `trust == "..."` or `== "shuffle"` outside them."""
    pattern = re.compile(r"""trust\s*[!=]=|[!=]=\s*["'](local|shuffle|central)["']|["'](local|shuffle|central)["']\s*[!=]=""")
    found = [f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"
             for path in sorted(PACKAGE.rglob("*.py")) if "trust" not in path.relative_to(PACKAGE).parts
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if pattern.search(line) and not line.lstrip().startswith("#")
             and "privacy_model" not in line and "engine" not in line]   # the names of privacy models, engines
    assert found == []


def test_the_server_half_reads_the_noise_its_trust_model_added():
    """ldp-ols's Gaussian fields: per user at the run's sigma under local; at eps0's smaller sigma under shuffle;
    under central the server's noise once per round (the twin keeps the local sigma, but per round, not user)."""
    _, local = built("ldp-ols")
    _, mixed = built("ldp-ols", trust="shuffle")
    _, central = built("ldp-ols", trust="central")
    for key in ("M", "u"):
        assert local.field_noise()[key] == FieldNoise("gaussian", local.mechanisms[key].sigma ** 2, "user")
        assert mixed.field_noise()[key].variance == mixed.mechanisms[key].sigma ** 2
        assert mixed.field_noise()[key].variance < local.field_noise()[key].variance / 2
        assert central.field_noise()[key] == FieldNoise("gaussian", central.central[key].scale ** 2, "round", "touched")
    # asked before the central model has derived its twins (from setup() or consts()): a clear error, not {}
    central.central = None
    with pytest.raises(RuntimeError, match="initial_state"):
        central.field_noise()


class HalfBudget(TrustModel):
    """A plugin's trust model: local randomizers at half the run's eps (a conservative deployment)."""

    name = "test-half-budget"

    def build(self, cls, world, config):
        algo = cls(world, config.replace(eps=config.eps / 2, trust="local"))
        algo.trust = self
        return algo


def test_a_plugins_trust_model_runs_through_the_same_door():
    TRUST_MODELS.register(HalfBudget)
    try:
        config = RunConfig("ldp-sgd", users=2000, round_size=100, eps=1.0, trust="test-half-budget")
        result = run_local(config)
        assert result.summary["privacy_eps_composed"] == pytest.approx(0.5)
        assert make_algorithm(make_env(config), config).mech.eps == 0.5
        with pytest.raises(ConfigError, match="only the shuffle trust model takes it"):
            RunConfig("ldp-sgd", trust="test-half-budget", trust_options={"shufflers": 2})
    finally:
        TRUST_MODELS.unregister(HalfBudget.name)

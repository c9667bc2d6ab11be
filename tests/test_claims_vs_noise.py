"""The accountant checks every ledger row's claim against the noise the row says it draws, and refuses a claim below
what that noise gives, for built-ins, plugin algorithms and plugin trust models alike (they all compose through
ldpfed.mechanisms.accounting.compose); it admits every built-in's calibration."""
import dataclasses
import math

import numpy as np
import pytest

from ldpfed.algorithms import REGISTRY, make_algorithm
from ldpfed.config import RunConfig
from ldpfed.envs import make_env
from ldpfed.mechanisms import accounting
from ldpfed.mechanisms.gaussian import GaussianMechanism
from ldpfed.trust import TRUST_MODELS, TrustModel, trust_model
from ldpfed.util.errors import ConfigError


def summary(config, algo=None):
    algo = algo or make_algorithm(make_env(config), config)
    return trust_model(config).summary(config, algo)


@pytest.mark.parametrize("trust", ["local", "central", "secagg"])
def test_every_built_in_calibration_is_admitted(trust):
    for name, cls in sorted(REGISTRY.items()):
        config = RunConfig(name, users=400, round_size=100, eps=1.0, delta=1e-6)
        if trust_model(trust).reach(cls, make_env(config).public(), config) is not None:
            continue
        config = config.replace(trust=trust)
        assert summary(config) is not None, name          # no ConfigError: every row meets its own noise


def test_a_central_twin_with_a_tenth_of_its_noise_is_refused_naming_the_field_and_both_numbers():
    config = RunConfig("ldp-ols", users=2000, round_size=200, trust="central", eps=1.0, delta=1e-6)
    algo = make_algorithm(make_env(config), config)
    algo.central = {key: dataclasses.replace(twin, scale=twin.scale / 10) for key, twin in algo.central.items()}
    with pytest.raises(ConfigError) as caught:
        summary(config, algo)
    error = caught.value
    assert error.field in ("ledger[M].eps", "ledger[u].eps") and error.value == 0.5
    got = float(error.reason.split("gives eps = ")[1].split(" ")[0])
    assert got > 4.0          # the noise's own eps, named beside the claim


def test_the_exact_gaussian_curve_agrees_with_dp_accounting():
    """noise_epsilon's Gaussian (the analytic curve) against dp-accounting's PLD (pessimistic, fine grid): the PLD
    is above it by at most its discretization, and never below."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    for std, sens, delta in ((1.0, 1.0, 1e-5), (3.0, 2.0, 1e-6), (0.5, 1.0, 1e-3)):
        exact = accounting.noise_epsilon({"noise": "gaussian", "noise_std": std, "sensitivity": sens,
                                          "delta": delta, "eps": 1.0, "nodes": 1})
        grid = pld.from_gaussian_mechanism(std, sensitivity=sens, value_discretization_interval=1e-4)
        assert exact - 1e-9 <= grid.get_epsilon_for_delta(delta) <= exact + 2e-3


def test_a_plugin_mechanism_that_understates_its_noise_is_refused():
    mech = GaussianMechanism(eps=1.0, delta=1e-5, sensitivity=1.0)
    row = {"message": "x", **mech.guarantee.as_dict(), **accounting.noise_fields(mech), "per_user": 1}
    accounting.compose([row], 1e-5)                            # honest: admitted
    lying = {**row, "noise_std": row["noise_std"] / 3}
    with pytest.raises(ConfigError, match=r"ledger\[x\]\.eps"):
        accounting.compose([lying], 1e-5)
    with pytest.raises(ConfigError, match=r"ledger\[x\]\.sensitivity"):      # missing input rejects
        accounting.compose([{k: v for k, v in row.items() if k != "sensitivity"}], 1e-5)


def test_laplace_claims_pure_and_approximate():
    row = {"message": "y", "noise": "laplace", "noise_scale": 2.0, "sensitivity": 1.0, "nodes": 1, "delta": 0.0}
    accounting.compose([{**row, "eps": 0.5}], 1e-6)
    with pytest.raises(ConfigError):
        accounting.compose([{**row, "eps": 0.45}], 1e-6)
    with pytest.raises(ConfigError):                           # two nodes: twice the eps
        accounting.compose([{**row, "eps": 0.5, "nodes": 2}], 1e-6)
    # at delta > 0 the Laplace mechanism's eps is below D/b (its tight curve); a claim at it is admitted
    assert accounting.noise_epsilon({**row, "eps": 0.5, "delta": 1e-2}) < 0.5


class Lying(TrustModel):
    """A plugin trust model that claims its users' randomizers at half the noise they draw."""

    name = "test-lying"

    def label_rows(self, algo, rows):
        return [{**row, "trust": self.name, "noise_std": row["noise_std"] / 2} for row in rows]


def test_a_plugin_trust_models_rows_are_checked_too():
    TRUST_MODELS.register(Lying)
    try:
        with pytest.raises(ConfigError, match=r"ledger\[.*\]\.eps"):
            summary(RunConfig("ldp-ols", users=2000, round_size=200, trust="test-lying", eps=1.0, delta=1e-6))
    finally:
        TRUST_MODELS.unregister(Lying.name)


def test_the_skellam_bound_is_above_its_exact_one_dimensional_loss_and_tends_to_the_gaussian():
    """The RDP bound (Agarwal, Kairouz and Liu 2021) against dp-accounting's exact PLD of one Skellam coordinate at
    sensitivity 1 (built from the two Skellam pmfs): never below it; and, as the variance grows, close to the
    Gaussian's of the same variance."""
    from dp_accounting.pld import privacy_loss_distribution as pld
    from scipy.stats import skellam

    for variance in (8.0, 50.0):
        mu = variance / 2
        support = np.arange(-int(12 * math.sqrt(variance)) - 5, int(12 * math.sqrt(variance)) + 6)
        lower = dict(zip(support.tolist(), skellam.logpmf(support, mu, mu).tolist()))
        upper = dict(zip(support.tolist(), skellam.logpmf(support - 1, mu, mu).tolist()))
        exact = pld.from_two_probability_mass_functions(lower, upper, value_discretization_interval=1e-4)
        for delta in (1e-3, 1e-6):
            bound = accounting.skellam_epsilon(variance, 1.0, 1.0, delta)
            assert bound >= exact.get_epsilon_for_delta(delta) - 1e-3
    big = 1e4
    gaussian = accounting.noise_epsilon({"noise": "gaussian", "noise_std": math.sqrt(big), "sensitivity": 10.0,
                                         "delta": 1e-6, "eps": 1.0})
    assert gaussian <= accounting.skellam_epsilon(big, 10.0, 10.0, 1e-6) <= 1.2 * gaussian


def test_the_skellam_calibration_meets_its_target_and_no_less_noise_would():
    for eps, delta, l2, l1 in ((1.0, 1e-6, 50.0, 200.0), (0.25, 1e-5, 3.0, 3.0)):
        v = accounting.skellam_variance_for(eps, delta, l2, l1)
        assert accounting.skellam_epsilon(v, l2, l1, delta) <= eps
        assert accounting.skellam_epsilon(0.99 * v, l2, l1, delta) > eps

"""The privacy accountant (ldpfed.mechanisms.accounting) and every calibration of ldpfed.mechanisms checked against
Google's dp-accounting (an independent implementation of the privacy maps: PLDs and the analytic Gaussian)."""
import math
import warnings

import pytest
from dp_accounting import gaussian_mechanism as dpa_gaussian
from dp_accounting.pld import privacy_loss_distribution as pld

import ldpfed.mechanisms as M
from ldpfed.algorithms import REGISTRY, make_algorithm
from ldpfed.config import RunConfig
from ldpfed.engine import run_local
from ldpfed.envs import make_env
from ldpfed.mechanisms import accounting
from ldpfed.util.errors import ConfigError

SMALL = {"users": 200, "round_size": 10, "delta": 0.05}
PRIVATE = sorted(name for name, cls in REGISTRY.items() if cls.privacy_model != "none")


def build(name, **changes):
    config = RunConfig(name, **{**SMALL, **changes})
    return config, make_algorithm(make_env(config), config)


# ---------------------------------------------------------------- every registered algorithm
@pytest.mark.parametrize("eps", [0.5, 2.0])
@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_algorithm_composes_within_its_budget(name, eps):
    config, algo = build(name, eps=eps)
    ledger = algo.ledger()
    composed = accounting.compose(ledger, config.delta)
    if algo.privacy_model == "none":
        assert ledger == [] and composed is None
        return
    for row in ledger:
        assert isinstance(row["per_user"], int) and row["per_user"] >= 1
        assert row["composition"], f"{name}.{row['message']}: the composition needs its reason"
    # basic composition, recomputed here from the rows
    assert composed.eps == pytest.approx(sum(r["per_user"] * r["eps"] for r in ledger), rel=1e-12)
    assert composed.delta == pytest.approx(sum(r["per_user"] * r["delta"] for r in ledger), rel=1e-12)
    assert composed.eps <= eps * (1 + 1e-9) and composed.delta <= config.delta * (1 + 1e-9)
    # dp-accounting's PLD total is an upper bound on the true eps; it can only be tighter than basic composition
    # (up to its discretization of the privacy loss, 1e-4 per composed mechanism)
    assert composed.eps_pld <= composed.eps + 1e-3 * len(ledger) * max(r["per_user"] for r in ledger)


def test_ledgers_state_the_protocols_composition():
    _, multi = build("ldp-ols-multi", env_params={"K": 4})
    assert {row["per_user"] for row in multi.ledger()} == {2}          # parallel composition: 2 of K slots
    assert all("parallel composition" in row["composition"] for row in multi.ledger())
    _, lasso = build("private-lasso", users=1000)
    assert {row["per_user"] for row in lasso.ledger()} == {lasso.episodes}
    _, tree = build("private-linucb")
    (row,) = tree.ledger()
    assert row["nodes"] == tree.mechanisms["gram"].depth and row["noise_std"] == tree.mechanisms["gram"].node_scale
    _, ols = build("ldp-ols")
    assert {row["message"]: row["noise_std"] for row in ols.ledger()} == {"M": ols.mech_M.sigma,
                                                                          "u": ols.mech_u.sigma}


def test_gaussian_composition_is_tighter_with_dp_accounting():
    """ldp-ols: two Gaussian mechanisms at (eps/2, delta/2) each. Their exact composition is one Gaussian with
    mu^2 = mu_M^2 + mu_u^2 (mu = sensitivity / sigma); its eps at delta (our own analytic formula) must match
    dp-accounting's PLD total, and both are well below the basic sum eps."""
    config, ols = build("ldp-ols", eps=1.0, delta=0.01)
    composed = accounting.compose(ols.ledger(), config.delta)
    mu = math.hypot(math.sqrt(2) / ols.mech_M.sigma, 2 * make_env(config).reward_bound / ols.mech_u.sigma)
    exact = dpa_gaussian.get_epsilon_gaussian(1 / mu, 0.01)
    assert composed.eps == pytest.approx(1.0)
    assert exact <= composed.eps_pld <= exact + 2e-3
    assert composed.eps_pld < 0.5


def test_run_summary_carries_the_composed_guarantee():
    result = run_local(RunConfig("ldp-ols", users=100, round_size=10, eps=1.0, delta=0.01))
    assert result.summary["privacy_eps_composed"] == pytest.approx(1.0)
    assert result.summary["privacy_delta_composed"] == pytest.approx(0.01)
    assert 0 < result.summary["privacy_eps_dp_accounting"] < 1.0
    assert all("composition" in row and "per_user" in row for row in result.ledger)
    plain = run_local(RunConfig("uniform", users=50, round_size=10))
    assert "privacy_eps_composed" not in plain.summary
    # a profile that reproduces code whose noise does not cover its inputs declares its claim void: no numbers
    void = run_local(RunConfig("ldp-ols-multi", users=50, round_size=10, profile="authors-code"))
    assert void.summary["privacy_claim_void"] and void.summary["privacy_eps_composed"] == math.inf
    assert void.summary["privacy_eps_dp_accounting"] is None


# ---------------------------------------------------------------- refusal
def test_overspending_configuration_is_refused(monkeypatch):
    """Were the K slots of ldp-ols-multi composed by basic composition (no parallel composition), K = 3 slots at
    (eps/2, delta/2) would spend 1.5 eps: the run must refuse before simulating anyone, naming eps."""
    cls = REGISTRY["ldp-ols-multi"]
    original = cls.ledger

    def all_slots(self):
        return [{**row, "per_user": self.K} for row in original(self)]

    monkeypatch.setattr(cls, "ledger", all_slots)
    with pytest.raises(ConfigError) as info:
        run_local(RunConfig("ldp-ols-multi", users=100, round_size=10, eps=1.0, delta=0.1, env_params={"K": 3}))
    assert info.value.field == "eps" and "1.5" in str(info.value)
    rows = [{"message": "x", "eps": 0.5, "delta": 0.004, "per_user": 3, "composition": "test"}]
    with pytest.raises(ConfigError) as info:
        accounting.check_budget(accounting.compose(rows, 0.01), 1.5, 0.01)
    assert info.value.field == "delta"
    accounting.check_budget(accounting.compose(rows, 0.01), 1.5, 0.012)    # exactly the budget: allowed
    with pytest.raises(ConfigError, match="per_user"):
        accounting.compose([{**rows[0], "per_user": 0}], 0.01)


# ---------------------------------------------------------------- calibrations against dp-accounting
GRID = [(eps, delta) for eps in (0.1, 1.0, 2.0, 10.0) for delta in (0.1, 1e-5)] + [(5.0, 1e-2), (20.0, 1e-2)]


@pytest.mark.parametrize("eps, delta", GRID)
def test_classic_gaussian_is_valid_by_dp_accounting(eps, delta):
    """Classic calibration must deliver (eps, delta) by dp-accounting's exact Gaussian privacy profile -- at every
    eps, including above 1 where its theorem does not apply (where it would fail, the analytic sigma is used)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", M.gaussian.CalibrationWarning)
        sigma = M.gaussian_sigma(2.0, eps, delta, "classic")
    assert dpa_gaussian.get_epsilon_gaussian(sigma / 2.0, delta) <= eps * (1 + 1e-9)
    pld_delta = pld.from_gaussian_mechanism(sigma, sensitivity=2.0).get_delta_for_epsilon(eps)
    assert pld_delta <= delta * (1 + 1e-3)
    if eps <= 1:   # the textbook formula itself, untouched where it is proven
        assert sigma == pytest.approx(2.0 * math.sqrt(2 * math.log(1.25 / delta)) / eps, rel=1e-14)


def test_classic_above_one_switches_only_where_it_under_states_delta():
    with warnings.catch_warnings():
        warnings.simplefilter("error", M.gaussian.CalibrationWarning)
        moderate = M.gaussian_sigma(1.0, 3.0, 0.01, "classic")      # valid: unchanged, no warning
    assert moderate == pytest.approx(math.sqrt(2 * math.log(125)) / 3.0, rel=1e-14)
    classic_10 = math.sqrt(2 * math.log(125)) / 10.0
    assert M.analytic_delta(10.0, classic_10) > 0.04                   # 4x the claimed delta = 0.01
    with pytest.warns(M.gaussian.CalibrationWarning, match="under-states delta"):
        switched = M.gaussian_sigma(1.0, 10.0, 0.01, "classic")
    assert switched == pytest.approx(M.gaussian_sigma(1.0, 10.0, 0.01, "analytic"), rel=1e-12)
    assert switched > classic_10


@pytest.mark.parametrize("eps, delta", GRID)
def test_analytic_gaussian_matches_dp_accounting(eps, delta):
    ours = M.gaussian_sigma(1.0, eps, delta, "analytic")
    assert ours == pytest.approx(dpa_gaussian.get_sigma_gaussian(eps, delta), rel=1e-7)
    # and the PLD of that sigma attains delta (exact calibration: not below either, up to the discretization)
    pld_delta = pld.from_gaussian_mechanism(ours, sensitivity=1.0).get_delta_for_epsilon(eps)
    assert delta * (1 - 2e-2) <= pld_delta <= delta * (1 + 2e-2)


def test_symmetric_gaussian_uses_the_same_calibration():
    mech = M.SymmetricGaussianMechanism(math.sqrt(2), 0.5, 0.005)
    assert dpa_gaussian.get_epsilon_gaussian(mech.sigma / math.sqrt(2), 0.005) <= 0.5


@pytest.mark.parametrize("eps", [0.1, 1.0, 4.0])
def test_laplace_by_dp_accounting(eps):
    mech = M.LaplaceMechanism(3.0, eps)
    loss = pld.from_laplace_mechanism(mech.b, sensitivity=3.0)
    pure_eps(loss, eps)
    assert pld.from_laplace_mechanism(mech.b * 0.9, sensitivity=3.0).get_delta_for_epsilon(eps) > 1e-3


def pure_eps(loss, eps, composed=1):
    """The PLD is eps-DP: its eps at delta = 1e-12 (the truncated tail mass) is at most eps plus the pessimistic
    rounding of the loss (1e-4 per composed mechanism); a single mechanism also attains eps (to 1e-3)."""
    found = loss.get_epsilon_for_delta(1e-12)
    assert found <= eps + 1e-4 * composed + 1e-9
    if composed == 1:
        assert found >= eps - 1e-3


@pytest.mark.parametrize("eps", [0.1, 1.0, 4.0])
def test_randomized_response_by_dp_accounting(eps):
    rr = M.RandomizedResponse(eps)
    # dp-accounting's RR keeps the bit w.p. 1 - p + p/2: p = 2 (1 - p_keep)
    pure_eps(pld.from_randomized_response(2 * (1 - rr.p_keep), 2), eps)


@pytest.mark.parametrize("horizon", [1, 7, 64, 1000])
@pytest.mark.parametrize("calibration", ["classic", "analytic"])
def test_gaussian_tree_nodes_by_dp_accounting(horizon, calibration):
    """One element lands in `depth` nodes, each with independent N(0, node_scale^2): composing depth Gaussian
    mechanisms by PLD must give (eps, delta); and the same tree with one node fewer of noise must not be
    over-noised by more than sqrt(depth / (depth - 1)) (it is one Gaussian mechanism on the node vector)."""
    eps, delta, sens = 1.0, 1e-3, 2.5
    tree = M.TreeMechanism(horizon, (3,), eps=eps, delta=delta, sensitivity=sens, calibration=calibration)
    nodes = pld.from_gaussian_mechanism(tree.node_scale, sensitivity=sens).self_compose(tree.depth)
    assert nodes.get_delta_for_epsilon(eps) <= delta * (1 + 2e-2)
    assert dpa_gaussian.get_epsilon_gaussian(tree.node_scale / (sens * math.sqrt(tree.depth)), delta) <= eps + 1e-9
    if calibration == "analytic":     # exact: the composed nodes spend the whole delta
        assert nodes.get_delta_for_epsilon(eps) >= delta * (1 - 2e-2)


@pytest.mark.parametrize("horizon", [1, 7, 64, 1000])
def test_laplace_tree_nodes_by_dp_accounting(horizon):
    eps, sens = 0.5, 1.5
    tree = M.TreeMechanism(horizon, (2,), eps=eps, sensitivity=sens, noise="laplace")
    nodes = pld.from_laplace_mechanism(tree.node_scale, sensitivity=sens).self_compose(tree.depth)
    pure_eps(nodes, eps, composed=tree.depth)


def test_accountant_sits_at_the_mechanisms_layer():
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(accounting))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert not any(name.startswith(("ldpfed.algorithms", "ldpfed.engine", "ldpfed.tracking")) for name in imported)

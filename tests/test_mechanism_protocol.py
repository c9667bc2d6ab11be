"""Every mechanism class of ldpfed.mechanisms keeps the Mechanism protocol (ldpfed/mechanisms/protocol.py), and the
privacy accountant asks the mechanism what noise it draws (its dp_event), not its class."""
import inspect

import numpy as np
import pytest

import ldpfed.mechanisms as M
from ldpfed.algorithms.base import Algorithm
from ldpfed.mechanisms import accounting
from ldpfed.mechanisms.protocol import DP_EVENT_NOISES, DataBoundRequired, Mechanism, check_dp_event
from ldpfed.util.errors import ConfigError

GUARANTEE = M.Guarantee("tree-gaussian", "central", 1.0, 0.01, 1.0, "l2")
# One small instance of every mechanism class, and a small input of the shape it privatizes (per-user mechanisms:
# 4 users; stream mechanisms: a stream of 3 elements; SVT: 2 runs of 5 queries); entries within +-1.
MECHANISMS = {
    M.GaussianMechanism: (lambda: M.GaussianMechanism(1.0, 1.0, 1e-5), (4, 3)),
    M.SymmetricGaussianMechanism: (lambda: M.SymmetricGaussianMechanism(1.0, 1.0, 1e-5), (4, 3, 3)),
    M.LaplaceMechanism: (lambda: M.LaplaceMechanism(1.0, 1.0), (4, 3)),
    M.L2BallMechanism: (lambda: M.L2BallMechanism(1.0, 1.0, 3), (4, 3)),
    M.RandomizedResponse: (lambda: M.RandomizedResponse(1.0), (4, 3)),
    M.TreeMechanism: (lambda: M.TreeMechanism(8, (3,), eps=1.0, delta=1e-5, sensitivity=1.0), (3, 3)),
    M.DynamicTreeMechanism: (lambda: M.DynamicTreeMechanism(8, (3,), noise="laplace", unit_scale=2.0,
                                                            max_sensitivity=0.5, guarantee=GUARANTEE), (3, 3)),
    M.WishartMechanism: (lambda: M.WishartMechanism(3, 1.0, 1e-5), (3, 3)),
    M.WishartTree: (lambda: M.WishartTree(8, 3, 1.0, 1e-5), (3, 3, 3)),
    M.AboveNoisyThreshold: (lambda: M.AboveNoisyThreshold(0.0, 1.0, max_positives=2), (2, 5)),
}


def _mechanism_classes():
    """Every class exported by ldpfed.mechanisms that looks like a mechanism (it has privatize or a guarantee)."""
    return {obj for obj in vars(M).values() if inspect.isclass(obj) and obj is not Mechanism
            and obj.__module__.startswith("ldpfed.mechanisms") and hasattr(obj, "privatize")}


def _input(cls, shape, rng):
    if cls is M.RandomizedResponse:
        return rng.integers(0, 2, size=shape)
    if cls in (M.WishartMechanism, M.WishartTree):       # Gram matrices (PSD, entries within 1)
        x = rng.uniform(-0.5, 0.5, size=shape[:-1] + (2,))
        return x @ np.swapaxes(x, -1, -2) / 2
    return rng.uniform(-1.0, 1.0, size=shape)


def test_every_mechanism_class_is_covered():
    assert _mechanism_classes() <= set(MECHANISMS), _mechanism_classes() - set(MECHANISMS)


@pytest.mark.parametrize("cls", list(MECHANISMS), ids=lambda cls: cls.__name__)
def test_mechanism_keeps_the_protocol(cls):
    make, shape = MECHANISMS[cls]
    mech = make()
    assert isinstance(mech, Mechanism)
    assert isinstance(mech.guarantee, M.Guarantee)
    rng = np.random.default_rng(0)
    x = _input(cls, shape, rng)
    out = mech.privatize(x, rng)
    assert isinstance(out, np.ndarray) and out.shape == x.shape            # an array, always, of the input's shape
    event = mech.dp_event()
    assert check_dp_event(event) == event
    if event:
        assert event["noise"] in DP_EVENT_NOISES and event["nodes"] >= 1
    # one signature: output_domain(shape, data_bound=None, **schedule); the per-user (or per-release) shape
    per_release = shape[1:] if cls is not M.WishartMechanism else shape
    domain = mech.output_domain(per_release, data_bound=1.0)
    assert isinstance(domain, M.Domain) and domain.shape == tuple(per_release)
    values = out if cls is not M.WishartMechanism else out[None]
    assert domain.reason(values, np.arange(len(values))) is None            # honest outputs lie in the domain
    try:
        bare = mech.output_domain(per_release)
    except DataBoundRequired as error:                                       # input plus noise: needs the bound
        assert error.field == "data_bound"
    else:
        assert bare.shape == tuple(per_release)
    assert mech.output_domain(per_release, 1.0, at_most_one=True).at_most_one      # the schedule goes to the Domain


def test_l2_ball_privatize_is_the_array_and_privatize_counted_the_count():
    mech = M.L2BallMechanism(1.0, 1.0, 3)
    g = np.array([[2.0, 0, 0], [0.1, 0, 0]])
    z = mech.privatize(g, np.random.default_rng(5))
    z2, clipped = mech.privatize_counted(g, np.random.default_rng(5))
    assert isinstance(z, np.ndarray) and np.array_equal(z, z2) and clipped == 1


def test_stream_privatize_equals_the_running_mechanism():
    """privatize of a stream = the releases of the mechanism the servers run step by step (same draws)."""
    x = np.random.default_rng(1).standard_normal((5, 2))
    tree = M.TreeMechanism(8, (2,), eps=1.0, delta=1e-5, sensitivity=1.0)
    rng = np.random.default_rng(2)
    stepwise = np.array([tree.add(row, rng) for row in x])
    assert np.array_equal(M.TreeMechanism(8, (2,), eps=1.0, delta=1e-5, sensitivity=1.0)
                          .privatize(x, np.random.default_rng(2)), stepwise)
    dyn = M.DynamicTreeMechanism(8, (2,), unit_scale=1.5, max_sensitivity=1.0, guarantee=GUARANTEE)
    sens = np.array([1.0, 0.5, 0.4, 0.3, 0.2])
    stream, rng = dyn.noise_stream(), np.random.default_rng(3)
    stepwise = np.array([x[t] + stream.step(rng, node_scale=dyn.node_scale(sens[t])) for t in range(5)])
    assert np.array_equal(dyn.privatize(x, np.random.default_rng(3), sensitivities=sens), stepwise)


def test_dp_event_is_checked():
    assert check_dp_event({}) == {}
    for bad in ({"noise": "cauchy", "nodes": 1}, {"noise": "gaussian", "nodes": 1},
                {"noise": "gaussian", "noise_std": -1.0, "nodes": 1}, {"noise": "laplace", "noise_scale": 1.0},
                {"noise": "randomized-response", "nodes": 1, "noise_std": 1.0}, [("noise", "gaussian")]):
        with pytest.raises(ConfigError):
            check_dp_event(bad)


class _CustomGaussian:
    """A mechanism written from scratch (no ldpfed class): it only keeps the protocol."""

    def __init__(self, std, sensitivity, eps, delta):
        self.std = std
        self.guarantee = M.Guarantee("gaussian", "ldp", eps, delta, sensitivity, "l2")

    def privatize(self, x, rng):
        return np.asarray(x, dtype=float) + self.std * rng.standard_normal(np.shape(x))

    def output_domain(self, shape, data_bound=None, **schedule):
        return M.Domain(shape, low=-data_bound - 10 * self.std, high=data_bound + 10 * self.std, **schedule)

    def dp_event(self):
        return {"noise": "gaussian", "noise_std": self.std, "nodes": 1}


def test_the_accountant_composes_the_mechanisms_own_dp_event():
    custom = _CustomGaussian(std=3.0, sensitivity=1.0, eps=1.0, delta=1e-3)
    assert isinstance(custom, Mechanism)
    assert accounting.noise_fields(custom) == custom.dp_event()

    class Algo(Algorithm):
        name = "custom"
        privacy_model = "ldp"

        def setup(self):
            self.mechanisms = {"v": custom}

    algo = Algo.__new__(Algo)             # only the ledger is asked for: no world needed
    algo.mechanisms = {"v": custom}
    algo.privacy_model = "ldp"
    (row,) = algo.ledger()
    assert (row["noise"], row["noise_std"], row["nodes"]) == ("gaussian", 3.0, 1)
    composed = accounting.compose([row, row], 1e-3)
    # the PLD is the Gaussian one of std 3 at sensitivity 1 composed twice, not the generic (eps, delta) claim's
    expected = accounting.pld_of(("gaussian", 3.0, 1.0, 2)).get_epsilon_for_delta(1e-3)
    assert composed.eps_pld == pytest.approx(expected) and composed.eps == 2.0
    generic = accounting.compose([{**row, "noise": None}] * 2, 1e-3)
    assert generic.eps_pld != pytest.approx(composed.eps_pld)
    # what a mechanism says is checked: a bad event is refused, naming the field
    custom.dp_event = lambda: {"noise": "gaussian", "noise_std": 0.0, "nodes": 1}
    with pytest.raises(ConfigError, match="noise_std"):
        algo.ledger()

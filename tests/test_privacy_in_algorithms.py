"""Privacy tested where it is spent: in the algorithms' client halves, not only in the mechanisms.

* every LDP algorithm's encode(), fed contexts and rewards far outside the public bounds, hands its mechanisms
  data whose spread stays within the sensitivity its ledger claims (so the noise it draws is enough);
* the l2-ball messages have exactly the norm B of the closed form, computed here (not by the library);
* end-to-end audits of encode() on neighbouring users (out-of-bound raw inputs, so the clipping is exercised):
  ldp-ols, ldp-ucb, ldp-gloc with the Gaussian-DP bound on the likelihood-ratio statistic, ldp-sgd and
  sw-klucb-cf with the model-free event bound (ldpfed/mechanisms/audit.py). Each audit must pass for the real
  client and FLAG a weakened one (clipping removed, or a randomizer that keeps too much), so it can fail;
* the tree mechanism audited over all T of its outputs.
"""
import math

import numpy as np
import pytest
from scipy.special import expit

from ldpfed.algorithms import REGISTRY, make_algorithm
from ldpfed.config import RunConfig
from ldpfed.envs import make_env
from ldpfed.mechanisms import TreeMechanism, accounting, audit
from ldpfed.testing import hostile, record_inputs, units

LDP = sorted(name for name, cls in REGISTRY.items() if cls.privacy_model == "ldp")
SMALL = {"users": 300, "round_size": 5, "eps": 1.0, "delta": 0.05}


def build(name, **changes):
    config = RunConfig(name, **{**SMALL, **changes})
    env = make_env(config)
    return config, env, make_algorithm(env, config)


def max_pairwise_distance(vectors: np.ndarray, norm: str) -> float:
    diff = vectors[:, None, :] - vectors[None, :, :]
    if norm == "l1":
        return float(np.abs(diff).sum(axis=-1).max())
    return float(np.sqrt((diff ** 2).sum(axis=-1)).max())


@pytest.mark.parametrize("name", LDP)
def test_encode_keeps_the_data_within_the_ledgers_sensitivity(name):
    """Raw contexts scaled by up to 1e6 and rewards of +-1e6: whatever the user feeds in, the data part of every
    message (what the mechanism is asked to privatize) must stay within what the ledger's noise was calibrated
    for -- the clipping to the public bounds must happen before privatizing."""
    config, env, algo = build(name, seed=2)
    rng = np.random.default_rng(7)
    seen = record_inputs(algo)
    users = np.arange(60)
    model = algo.publish(algo.initial_state(rng))
    contexts = env.contexts(users, rng)
    actions = algo.act(model, contexts, users, rng)
    rewards, _ = env.step(contexts, actions, users, rng)
    if contexts is not None:
        contexts = hostile(np.asarray(contexts, dtype=float), rng, [1e-3, 1.0, 7.0, 1e6])
    rewards = rng.choice([-1e6, -7.0, 0.0, 0.4, 1.0, 7.0, 1e6], size=np.shape(rewards))
    algo.encode(model, contexts, actions, rewards, users, rng)
    ledger = {row["message"]: row for row in algo.ledger()}
    assert set(seen) == set(ledger)
    for key, calls in seen.items():
        assert calls, f"{name}: mechanism {key} was never used by encode()"
        row, data = ledger[key], np.concatenate([c.reshape(-1, *c.shape[1:]) for c in calls])
        kind = row["mechanism"]
        if kind == "randomized-response":          # the input domain is a bit
            assert set(np.unique(data)) <= {0.0, 1.0}, f"{name}.{key}"
        elif kind == "l2-ball":                    # the ledger's bound is the radius of the input ball
            norms = np.linalg.norm(data.reshape(-1, data.shape[-1]), axis=1)
            assert norms.max() <= row["sensitivity"] * (1 + 1e-9), f"{name}.{key}: input norm {norms.max()}"
        else:                                      # Gaussian / Laplace: the spread of any two users' data
            spread = max_pairwise_distance(units(kind, data), row["norm"])
            assert spread <= row["sensitivity"] * (1 + 1e-9), \
                f"{name}.{key}: two users' data differ by {spread:.4g} > sensitivity {row['sensitivity']:.4g}"


def l2_ball_radius_closed_form(R: float, eps: float, d: int) -> float:
    """B = R sqrt(pi) coth(eps/2) Gamma((d+1)/2) / Gamma(d/2) (seed 000, Lemma 2.2), written out here."""
    return R * math.sqrt(math.pi) / math.tanh(eps / 2) * math.exp(math.lgamma((d + 1) / 2) - math.lgamma(d / 2))


@pytest.mark.parametrize("name", ["ldp-sgd", "ldp-sgd-multi"])
def test_l2_ball_messages_have_the_closed_form_norm_and_mean(name):
    """Every sent slot of an LDP-SGD message has norm B exactly (B from the closed form above, at the slot's eps:
    eps, or eps/2 for the K-slot version) and the messages are unbiased for the clipped gradient: with n users of
    the same gradient g, each coordinate of the mean of Z is within 5 B / sqrt(n) of g (|Z_i| <= B, so the
    standard error is at most B / sqrt(n); 5 of them is exceeded with probability < 1e-6 per coordinate)."""
    config, env, algo = build(name, env_params={"d": 3, "K": 2}, seed=1)
    n = 20_000
    d, c_r = env.d, env.reward_bound
    slot_eps = config.eps / 2 if name.endswith("-multi") else config.eps
    B = l2_ball_radius_closed_form(2 * c_r, slot_eps, d)
    x = np.zeros(d)
    x[0] = 5.0                                                    # clipped to the unit context bound
    users = np.arange(n) + 10 ** 6                                # after any warm-up: every slot is sent
    model = algo.publish(algo.initial_state(np.random.default_rng(0)))
    model["theta"] = np.zeros_like(model["theta"])                # gradient (0 - r) x = -c_r e1 after clipping
    contexts = np.tile(x, (n, 1)) if name.endswith("-multi") else np.tile(x, (n, env.K, 1))
    actions = np.zeros(n, dtype=np.int64)
    messages, _ = algo.encode(model, contexts, actions, np.full(n, 5.0 * c_r), users, np.random.default_rng(3))
    Z = messages["Z"].reshape(n, -1, d)
    np.testing.assert_allclose(np.linalg.norm(Z, axis=-1), B, rtol=1e-12)
    g = np.zeros(d)
    g[0] = -c_r
    assert np.all(np.abs(Z[:, 0].mean(axis=0) - g) < 5 * B / math.sqrt(n)), (Z[:, 0].mean(axis=0), g)
    if name.endswith("-multi"):                                   # psi(0, 0) slots: mean zero
        assert np.all(np.abs(Z[:, 1].mean(axis=0)) < 5 * B / math.sqrt(n))


# ---------------------------------------------------------------- end-to-end audits of encode()
N_AUDIT = 40_000
# Confidence of the audits' lower bounds: a mechanism that meets its claim exactly (randomized response below) is
# flagged with probability at most ALPHA, whatever the seed.
ALPHA = 1e-3
# Sample size: the GDP bound is computed from Clopper-Pearson upper bounds on the two error rates of the threshold
# test; with 40,000 runs per input those are within ~0.005 of the rates at the rates seen here, i.e. mu within
# ~0.03: the real clients (mu <= 0.4 below) stay far under the claim, and the weakened ones (mu > 3) far above.


def encode_copies(algo, model, context, action, reward, n, seed):
    """n users with the same raw (context, reward), each with its own randomness (one rng for the batch)."""
    contexts = None if context is None else np.repeat(context[None], n, axis=0)
    actions = np.full(n, action, dtype=np.int64)
    rewards = np.full(n, reward, dtype=float)
    users = np.arange(n)
    messages, _ = algo.encode(model, contexts, actions, rewards, users, np.random.default_rng(seed))
    return messages


def gaussian_llr_audit(algo, model, user_a, user_b, eps, delta):
    """GDP audit of the whole message of two neighbouring users under independent Gaussian noise per field.

    The statistic is the log-likelihood ratio of the honest mechanism, sum over fields of
    <m - (D_a + D_b)/2, D_b - D_a> / sigma^2 on the independent entries (the upper triangle of symmetric
    matrix noise), with D_a, D_b the data parts encode() handed to the mechanisms (recorded on a first
    pass with other randomness): it is fixed before the audit's samples are drawn, and optimal for the honest
    mechanism, whose mu is then sqrt(sum ||D_b - D_a||^2 / sigma^2)."""
    seen = record_inputs(algo)
    encode_copies(algo, model, *user_a, 1, seed=11)
    encode_copies(algo, model, *user_b, 1, seed=12)
    kinds = {key: mech.guarantee.mechanism for key, mech in algo.mechanisms.items()}
    clean = {key: (units(kinds[key], calls[0])[0], units(kinds[key], calls[1])[0]) for key, calls in seen.items()}

    def statistic(messages):
        total = 0.0
        for key, (d_a, d_b) in clean.items():
            m = units(kinds[key], messages[key]).reshape(len(messages[key]), -1)
            total = total + (m - (d_a + d_b) / 2) @ (d_b - d_a) / algo.mechanisms[key].sigma ** 2
        return total

    stat_a = statistic(encode_copies(algo, model, *user_a, N_AUDIT, seed=21))
    stat_b = statistic(encode_copies(algo, model, *user_b, N_AUDIT, seed=22))
    mu_data = math.sqrt(sum(np.sum((d_b - d_a) ** 2) / algo.mechanisms[k].sigma ** 2
                            for k, (d_a, d_b) in clean.items()))
    return audit.gdp_audit(stat_a, stat_b, 0.0, eps, delta, alpha=ALPHA), mu_data


def composed_claim(config, algo):
    composed = accounting.compose(algo.ledger(), config.delta)
    return composed.eps, composed.delta


def _no_clipping(monkeypatch, name, algo):
    """The weakened client: contexts and rewards reach the mechanisms unclipped."""
    # written once: the clip bounds C_B, c_r are the first constants of their compiled prepare
    consts = algo.compiled_consts()
    monkeypatch.setattr(algo, "compiled_consts", lambda: (math.inf, math.inf, *consts[2:]))


@pytest.mark.parametrize("name", ["ldp-ols", "ldp-ucb", "ldp-gloc"])
@pytest.mark.parametrize("weakened", [False, True], ids=["real", "unclipped"])
def test_gaussian_clients_pass_the_audit_and_unclipped_ones_are_flagged(name, weakened, monkeypatch):
    """Neighbouring users with raw contexts of norm 10 and rewards of 10 c_r (ten times the public bounds):
    x = 10 e1, r = 10 c_r against x' = 10 e2, r' = -10 c_r. The real client clips them to the bounds and passes the
    audit at its composed (eps, delta); without the clipping the same users are told apart far beyond it."""
    config, env, algo = build(name, env_params={"d": 2, "K": 2}, eps=1.0, delta=0.01)
    eps, delta = composed_claim(config, algo)
    assert (eps, delta) == pytest.approx((1.0, 0.01))
    if weakened:
        _no_clipping(monkeypatch, name, algo)
    c_r = env.reward_bound
    e1, e2 = np.eye(2)
    model = algo.publish(algo.initial_state(np.random.default_rng(0)))
    if "theta_hat" in model:
        model["theta_hat"] = 0.5 * e1                      # the online learner's prediction z = x^T theta_hat
    context = (lambda x: x) if name.endswith("multi") else (lambda x: np.stack([x, x]))   # (K, d): both arms
    result, mu_data = gaussian_llr_audit(algo, model, (context(10 * e1), 0, 10 * c_r),
                                         (context(10 * e2), 0, -10 * c_r), eps, delta)
    if weakened:
        assert mu_data > 3 and result.flagged, (str(result), mu_data)
    else:
        assert mu_data < audit.gdp_mu(eps, delta), mu_data   # the honest mu is within the claim (calibration)
        assert not result.flagged, str(result)


@pytest.mark.parametrize("weakened", [False, True], ids=["real", "under-randomized"])
def test_ldp_sgd_passes_the_event_audit(weakened):
    """ldp-sgd (eps-LDP l2-ball on the clipped gradient): theta = 0, raw x = 5 e1, r = +-5 c_r, so the clipped
    gradients are -+c_r e1, and the event "Z . e1 > 0" has probabilities 1/2 -+ tanh(eps/2)/4: the real client
    passes at eps = 1; a randomizer that skips the tanh(eps/2) damping (hemisphere probability 1/2 -+ 1/4,
    likelihood ratio 3 > e^1) is flagged."""
    config, env, algo = build("ldp-sgd", env_params={"d": 2, "K": 2}, eps=1.0)
    eps, delta = composed_claim(config, algo)
    if weakened:
        algo.mech.tanh_half = 1.0
    c_r = env.reward_bound
    context = np.stack([5.0 * np.eye(2)[0]] * 2)
    model = {"theta": np.zeros(2)}
    z_a = encode_copies(algo, model, context, 0, 5 * c_r, N_AUDIT, seed=31)["Z"]
    z_b = encode_copies(algo, model, context, 0, -5 * c_r, N_AUDIT, seed=32)["Z"]
    result = audit.event_audit(z_b[:, 0] > 0, z_a[:, 0] > 0, eps, delta, alpha=ALPHA)
    assert result.flagged == weakened, str(result)


@pytest.mark.parametrize("weakened", [False, True], ids=["real", "under-randomized"])
def test_sw_klucb_cf_passes_the_event_audit(weakened):
    """sw-klucb-cf: neighbouring users on the same public arm with raw rewards 7 and -3 (rounded to the bits 1
    and 0); the event "feedback of the arm = 1" has probabilities expit(eps) and expit(-eps), a likelihood ratio
    of exactly e^eps: the real client passes, randomized response at 2 eps is flagged."""
    config, env, algo = build("sw-klucb-cf", eps=1.0)
    eps, delta = composed_claim(config, algo)
    if weakened:
        algo.rr.p_keep = float(expit(2 * eps))
    model = algo.publish(algo.initial_state(np.random.default_rng(0)))
    f_a = encode_copies(algo, model, None, 0, -3.0, N_AUDIT, seed=41)["feedback"]
    f_b = encode_copies(algo, model, None, 0, 7.0, N_AUDIT, seed=42)["feedback"]
    result = audit.event_audit(f_b[:, 0] == 1, f_a[:, 0] == 1, eps, delta, alpha=ALPHA)
    assert result.flagged == weakened, str(result)


# ---------------------------------------------------------------- the tree over all T outputs
@pytest.mark.parametrize("noise", ["gaussian", "laplace"])
def test_tree_audit_over_all_outputs(noise):
    """Neighbouring streams: all zeros, and the same with its first element raised by the sensitivity. Each of the
    n coordinates of the stream is an independent run (the noise is i.i.d. per coordinate), so one pass of T steps
    gives n runs. The statistic is the sum of all T released prefix sums (the first element is in every one):
    with one node of noise per set bit the nodes are shared by many outputs and the sum stays noisy; a tree that
    gave each output a single fresh node would let the sum average T independent noises out (mu ~ sqrt(T / depth)
    times the claim). GDP bound for Gaussian nodes, event bound (sum above the midpoint) for Laplace ones."""
    T, n, eps, sens = 256, 20_000, 1.0, 1.0
    delta = 1e-3 if noise == "gaussian" else 0.0
    outputs = {}
    for name, first in (("a", 0.0), ("b", sens)):
        tree = TreeMechanism(T, (n,), eps=eps, delta=delta, sensitivity=sens, noise=noise)
        rng = np.random.default_rng(5 if name == "a" else 6)
        total = np.zeros(n)
        for t in range(T):
            total += tree.add(np.full(n, first if t == 0 else 0.0), rng)
        outputs[name] = total
    midpoint = T * sens / 2                                   # the two means are 0 and T * sens
    if noise == "gaussian":
        result = audit.gdp_audit(outputs["a"], outputs["b"], midpoint, eps, delta, alpha=ALPHA)
    else:
        result = audit.event_audit(outputs["b"] > midpoint, outputs["a"] > midpoint, eps, delta, alpha=ALPHA)
    assert not result.flagged, str(result)

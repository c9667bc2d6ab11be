"""Seed 001 (Wang, Zhao, Wang 2022): linucb, private-linucb, linucb-dgs on the arm-pool world."""
import math

import numpy as np
import pytest

from ldpfed.algorithms import make_algorithm
from ldpfed.config import RunConfig
from ldpfed.engine import run_local
from ldpfed.engine.sequential import run_sequential
from ldpfed.envs import make_env
from ldpfed.mechanisms import tree_depth
from ldpfed.util.errors import ConfigError
from ldpfed.util.normals import standard_normals
from ldpfed.util.rng import derive


def run(name, users, round_size, eps=1.0, seed=0, **params):
    return run_local(RunConfig(name, env="arm-pool", users=users, round_size=round_size, eps=eps, delta=0.1,
                               seed=seed, params=params))


# ---- the world -------------------------------------------------------------------------------------------
def test_arm_pool_world():
    env = make_env(RunConfig("linucb", env="arm-pool", users=100))
    assert env.pool.shape == (1000, 25) and env.K == 10
    np.testing.assert_allclose(np.linalg.norm(env.pool, axis=1), 1.0)
    assert abs(np.linalg.norm(env.theta) - 1.0) < 1e-12
    shown = env.shown(np.arange(5000), np.random.default_rng(0))
    assert shown.shape == (5000, 10)
    assert all(len(set(row)) == 10 for row in shown), "the K arms shown to a user are distinct"
    # every arm of the pool is equally likely to be shown: counts ~ Binomial(50000, 1/1000), mean 50, sd ~7
    counts = np.bincount(shown.ravel(), minlength=1000)
    assert abs(counts.mean() - 50) < 1e-9 and counts.min() > 50 - 6 * 7.1 and counts.max() < 50 + 6 * 7.1
    # lambda_0 of the pool: isotropic features on the sphere give about 1/d
    assert 0.5 / 25 < env.context_min_eig < 1.0 / 25
    assert env.reward_bound == 1.0 + 3 * 0.5


# ---- regret ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def regrets():
    """Final regret at T = 20,000 (rounds of 50), eps = 1, three seeds."""
    out = {}
    for name in ("uniform", "linucb", "private-linucb", "linucb-dgs"):
        out[name] = [run(name, 20_000, 50, seed=s).summary["final_regret"] for s in (0, 1, 2)]
    return out


def test_every_algorithm_beats_uniform(regrets):
    # uniform play pays E[max of 10 - mean] per user (~0.3 here) with small spread; a learner that is better by
    # 20% at every seed is far outside the seed-to-seed spread of uniform (~3% at 20,000 users).
    uniform = np.array(regrets["uniform"])
    assert np.all(uniform > 0.25 * 20_000)
    assert np.all(np.array(regrets["linucb"]) < 0.1 * uniform)
    assert np.all(np.array(regrets["private-linucb"]) < 0.8 * uniform)
    assert np.all(np.array(regrets["linucb-dgs"]) < 0.9 * uniform)


def test_linucb_beats_private_linucb(regrets):
    assert max(regrets["linucb"]) < 0.5 * min(regrets["private-linucb"])
    assert max(regrets["linucb"]) < 0.5 * min(regrets["linucb-dgs"])


@pytest.mark.xfail(strict=True, reason=(
    "seed 001's headline claim (LinUCB-DGS below constant-sensitivity Private LinUCB at the same eps) "
    "does not reproduce under the reconstructed Delta_e = 2L(R+LS)/(lam + lambda_0 e): with lambda_0 ~ 1/d the "
    "released theta is noise-dominated up to ~1e4-1e5 users at eps = 1, while the noisy augmented Gram of "
    "private-linucb already points the right way (measured medians at T = 2e4, B = 50: Gaussian DGS 3559, "
    "Laplace DGS with the paper's L2-as-L1 sensitivity 4467, private-linucb 2731)"))
def test_dgs_beats_private_linucb_at_the_same_eps(regrets):
    assert np.median(regrets["linucb-dgs"]) < np.median(regrets["private-linucb"])


# ---- the dynamic sensitivity ---------------------------------------------------------------------------
def test_dgs_noise_shrinks_with_t():
    T = 4096
    result = run("linucb-dgs", T, 1, noise="laplace")
    state = result.state
    config = RunConfig("linucb-dgs", env="arm-pool", users=T, round_size=1, eps=1.0, delta=0.1,
                       params={"noise": "laplace"})
    algo = make_algorithm(make_env(config), config)
    scales, stds, norms = state["node_scale"], state["noise_std"], state["noise_norm"]
    t = np.arange(1, T + 1)
    # the node closing at t is scaled to Delta_t exactly (Laplace: b = depth * sqrt(d) * Delta_t / eps, the
    # sqrt(d) turning the L2 bound Delta_t into an L1 bound)
    delta_t = algo.numerator / (algo.lam + algo.lambda_0 * t)
    np.testing.assert_allclose(scales, tree_depth(T) * math.sqrt(algo.d) * delta_t / 1.0, rtol=1e-12)
    assert np.all(np.diff(scales) < 0), "the node scale shrinks with t"
    # every node covering t closed at some e >= 2^floor(log2 t) > t/2, so the std of n_t is bounded by
    # sqrt(2 popcount(t)) * b_(2^floor(log2 t)) (Laplace variance 2 b^2), and is at least that of the node closing at t
    popcount = np.array([bin(k).count("1") for k in t])
    top = 2 ** np.floor(np.log2(t)).astype(int)
    bound = np.sqrt(2 * popcount) * scales[top - 1]
    assert np.all(stds <= bound * (1 + 1e-12)) and np.all(stds >= np.sqrt(2) * scales * (1 - 1e-12))
    # the noise actually drawn follows: E||n_t||^2 = d std_t^2. Early (t in [16, 64)) its std exceeds the late
    # one (t in [2048, 4096)) by ~11x (node scales ~40x smaller, but up to 12 nodes cover a late t instead of
    # 1-5); the mean norms (~sqrt(d) std_t, shared nodes) differ by ~25-30x at seeds 0-3
    early, late = norms[15:63].mean(), norms[2047:].mean()
    assert stds[2047:].max() < stds[15:63].min() / 10
    assert late < early / 10
    # and the released model converges: its error at the end is far below the error after 100 users
    table = result.table.dropna(subset=["estimation_error"])
    early = table[table["users"] >= 100]["estimation_error"].iloc[0]
    assert table["estimation_error"].iloc[-1] < early / 5


# ---- B = 1 is the sequential algorithm ------------------------------------------------------------------
class _ReferenceTree:
    """The binary mechanism's noise written out independently of ldpfed.mechanisms (so a bug there cannot hide
    in the reference): the node of level i closes at the steps t whose lowest set bit is i and gets fresh noise
    (Gaussian: the upper triangle incl. the diagonal i.i.d. N(0, scale^2), mirrored, its normals from
    ldpfed.util.normals, one call per node; Laplace: i.i.d. Lap(scale) from numpy), drawn from the generator in the
    library's order; the noise of prefix t sums the nodes of ALL set bits of t."""

    def __init__(self, shape, noise):
        self.shape, self.noise, self.t, self.nodes = shape, noise, 0, {}

    def step(self, rng, scale):
        self.t += 1
        level = (self.t & -self.t).bit_length() - 1
        if self.noise == "gaussian":
            d = self.shape[0]
            upper = np.triu_indices(d)
            node = np.zeros((d, d))
            node[upper] = standard_normals(rng, len(upper[0])) * scale   # the generator: tests/test_sphere.py
            node = node + node.T - np.diag(np.diag(node))
        else:
            node = rng.laplace(0.0, scale, size=self.shape)
        self.nodes[level] = node
        return sum(self.nodes[j] for j in range(self.t.bit_length()) if (self.t >> j) & 1)


def _sequential(name, users, seed, eps=1.0):
    """The paper's loop written out: one user at a time, the same derived generators as the engine, and the
    tree's noise drawn by the reference itself (_ReferenceTree), with the node scales from the formulas."""
    config = RunConfig(name, env="arm-pool", users=users, round_size=1, eps=eps, delta=0.1, seed=seed)
    env = make_env(config)
    d, lam, alpha = env.d, 1.0, 0.3
    L, R, S = 1.0, env.reward_bound, 1.0
    A, b = lam * np.eye(d), np.zeros(d)
    theta_pub, Ainv_pub = np.zeros(d), np.eye(d) / lam
    depth = int(math.floor(math.log2(users))) + 1          # the most nodes one element lands in
    if name == "private-linucb":
        sens = math.sqrt(2) * (L ** 2 + R ** 2)
        # classic Gaussian at (eps, delta) = (1, 0.1) for the L2 sensitivity sqrt(depth) sens of the node vector
        # (same order of operations as the library: the first user's arms tie up to rounding)
        node_scale = math.sqrt(depth) * (sens * math.sqrt(2 * math.log(1.25 / 0.1)) / eps)
        tree = _ReferenceTree((d + 1, d + 1), "gaussian")
        upsilon = node_scale * math.sqrt(depth) * (4 * math.sqrt(d + 1) + 2 * math.log(2 * users / 0.05))
        Ainv_pub = np.eye(d) / (lam + 2 * upsilon)
        prefix = np.zeros((d + 1, d + 1))
    else:
        tree = _ReferenceTree((d,), "laplace")
    regrets = []
    for t in range(users):
        world = derive(seed, "context", 0, t)
        contexts = env.contexts(np.array([t]), world)
        X = contexts[0]
        width = np.sqrt(np.maximum(np.einsum("kd,de,ke->k", X, Ainv_pub, X), 0))
        a = int(np.argmax(X @ theta_pub + alpha * width))
        reward, regret = env.step(contexts, np.array([a]), np.array([t]), world)
        regrets.append(regret[0])
        x, r = X[a], float(np.clip(reward[0], -R, R))
        server = derive(seed, "server", t)
        if name == "private-linucb":
            z = np.append(x, r)
            prefix += np.outer(z, z)
            M = prefix + tree.step(server, node_scale)
            At = M[:d, :d] + (lam + 2 * upsilon) * np.eye(d)
            Ainv_pub = np.linalg.inv(At)
            theta_pub = Ainv_pub @ M[:d, d]
        else:
            A += np.outer(x, x)
            b += r * x
            Ainv_pub = np.linalg.inv(A)
            delta_e = 2 * L * (R + L * S) / (lam + env.context_min_eig * (t + 1))
            theta_pub = np.linalg.solve(A, b) + tree.step(server, depth * math.sqrt(d) * delta_e / eps)
    return np.array(regrets)


@pytest.mark.parametrize("name", ["linucb-dgs", "private-linucb"])
def test_round_size_one_is_the_sequential_algorithm(name):
    options = {"noise": "laplace"} if name == "linucb-dgs" else {}   # the loop below writes the Laplace variant
    engine = run(name, 300, 1, seed=5, **options).table["regret"].to_numpy()
    np.testing.assert_allclose(engine, _sequential(name, 300, seed=5), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("params", [{"noise": "laplace"}, {"noise": "laplace", "l1_sensitivity": False}])
def test_sequential_engine_reproduces_the_rounds(params):
    """Written once: at B = 1 the compiled sequential loop, fed the round engine's draws, equals run_local bit for
    bit (the Laplace tree's draws too; tests/test_sequential.py covers the defaults)."""
    config = RunConfig("linucb-dgs", env="arm-pool", users=300, round_size=1, delta=0.1, seed=5, params=params)
    local, seq = run_local(config), run_sequential(config, streams="generic")
    assert seq.summary["engine"] == "sequential"
    for column in local.table.columns:
        np.testing.assert_array_equal(local.table[column].to_numpy(), seq.table[column].to_numpy(), err_msg=column)
    for key, value in local.state.items():
        np.testing.assert_array_equal(value, seq.state[key], err_msg=key)


def test_batched_rounds_use_round_sums():
    """B > 1: one tree element per round; the stream has `rounds` elements."""
    result = run("linucb-dgs", 1000, 50)
    assert result.state["tree_t"][0] == 20 and len(result.state["node_scale"]) == 20
    private = run("private-linucb", 1000, 50)
    assert private.state["tree_t"][0] == 20


# ---- options and ledger -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name, params, field", [
    ("linucb", {"alpha": -1}, "params.alpha"),
    ("linucb", {"lam": 0}, "params.lam"),
    ("private-linucb", {"upsilon_alpha": 1.5}, "params.upsilon_alpha"),
    ("linucb-dgs", {"noise": "cauchy"}, "params.noise"),
    ("linucb-dgs", {"lambda_0": "big"}, "params.lambda_0"),
    ("linucb-dgs", {"l1_sensitivity": 1}, "params.l1_sensitivity"),
    ("linucb", {"beta": 1.0}, "params.beta"),
])
def test_bad_options_name_the_field(name, params, field):
    with pytest.raises(ConfigError) as info:      # RunConfig checks the options; the world-dependent ones at build
        config = RunConfig(name, env="arm-pool", users=100, params=params)
        make_algorithm(make_env(config), config)
    assert info.value.field == field


def test_ledgers():
    config = RunConfig("private-linucb", env="arm-pool", users=1000, eps=0.5, delta=0.1)
    env = make_env(config)
    (row,) = make_algorithm(env, config).ledger()
    assert row["mechanism"] == "tree-gaussian" and row["model"] == "central" and row["eps"] == 0.5
    assert row["sensitivity"] == pytest.approx(math.sqrt(2) * (1 + env.reward_bound ** 2))
    (dgs,) = make_algorithm(env, config.replace(algorithm="linucb-dgs")).ledger()
    # Gaussian DGS: delta/2 for the high-probability sensitivity event plus delta/2 for the Gaussian tree, whose
    # nodes are calibrated at (eps, delta/2)
    assert dgs["mechanism"] == "tree-gaussian" and dgs["eps"] == 0.5 and dgs["delta"] == pytest.approx(0.1)
    gaussian = make_algorithm(env, config.replace(algorithm="linucb-dgs"))
    classic = math.sqrt(2 * math.log(1.25 / 0.05)) / 0.5
    assert gaussian.unit_scale == pytest.approx(math.sqrt(gaussian.depth) * classic)
    laplace = config.replace(algorithm="linucb-dgs", params={"noise": "laplace"})
    (row,) = make_algorithm(env, laplace).ledger()
    assert row["mechanism"] == "tree-laplace" and row["delta"] == 0.1
    paper = make_algorithm(env, config.replace(algorithm="linucb-dgs",
                                               params={"noise": "laplace", "l1_sensitivity": False}))
    # the default is the true L1 bound, sqrt(d) = 5 times the paper's L2 bound used as if it were L1
    assert row["sensitivity"] == pytest.approx(5 * paper.sensitivity_at(1))
    assert paper.ledger()[0]["sensitivity"] == pytest.approx(paper.sensitivity_at(1))
    assert make_algorithm(env, config.replace(algorithm="linucb")).ledger() == []


def test_tree_partial_sums_are_the_prefix_noise():
    """The compiled trees keep partial sums (central_linucb.tree_above): at every step, partial[lowbit(t)] is the
    sum of the nodes of t's set bits, each node drawn once, when its level closes."""
    from ldpfed.algorithms.central_linucb import tree_above, tree_level
    horizon = 300
    depth = tree_depth(horizon)
    rng = np.random.default_rng(0)
    nodes, partial = np.zeros((depth, 4)), np.zeros((depth, 4))
    for t in range(1, horizon + 1):
        level = tree_level(t)
        above = tree_above(t, level, depth)
        nodes[level] = rng.standard_normal(4)
        partial[level] = nodes[level] + (partial[above] if above >= 0 else 0.0)
        expected = sum(nodes[j] for j in range(depth) if (t >> j) & 1)
        np.testing.assert_allclose(partial[level], expected, rtol=0, atol=1e-12)
        assert above == next((j for j in range(level + 1, depth) if (t >> j) & 1), -1)


@pytest.mark.parametrize("diagonal_noise", [0.0, -50.0])
def test_private_linucb_publishes_the_inverse_factor_or_the_inverse(diagonal_noise):
    """The released A~ = M[:d, :d] + shift I goes out as its inverse Cholesky factor L^{-1} (factored = 1) when it is
    positive definite, as A~^{-1} itself (factored = 0) when the node's noise makes it indefinite; theta~ =
    A~^{-1} u~ and the UCB width the user computes are the same either way (up to rounding)."""
    from ldpfed.algorithms.central_linucb import factor_ucb_act, private_linucb_update

    d, w = 4, 5
    rng = np.random.default_rng(7)
    z = np.append(rng.uniform(-0.5, 0.5, d), 0.3)
    noise = rng.standard_normal(w * (w + 1) // 2) * 0.1
    upper = np.triu_indices(w)
    noise[upper[0] == upper[1]] += diagonal_noise * (np.arange(w) < d)    # the node's diagonal, on A's entries
    partial, total = np.zeros((tree_depth(8), w, w)), np.zeros((w, w))
    inverse, factored, theta = np.eye(d), np.zeros(1, dtype=np.int64), np.zeros(d)
    state = (partial, total, np.zeros(1, dtype=np.int64), inverse, factored, theta, np.zeros(1, dtype=np.int64),
             np.zeros(1, dtype=np.int64))
    node_scale, shift = 1.0, 2.0
    private_linucb_update(state, (1.0, 1.0, False, 1, 0.3, node_scale, shift), z.copy(), 0, 1, noise[None, :])
    M = np.outer(z, z)
    M[upper] += noise * node_scale
    M = np.triu(M) + np.triu(M, 1).T
    A = M[:d, :d] + shift * np.eye(d)
    definite = np.linalg.eigvalsh(A)[0] > 0
    assert definite == (diagonal_noise == 0.0) and factored[0] == int(definite)
    if definite:
        assert np.array_equal(inverse, np.tril(inverse))
        np.testing.assert_allclose(inverse.T @ inverse, np.linalg.inv(A), rtol=1e-10, atol=1e-12)
    else:
        assert np.array_equal(inverse, inverse.T)
        np.testing.assert_allclose(inverse, np.linalg.inv(A), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(theta, np.linalg.solve(A, M[:d, d]), rtol=1e-10, atol=1e-12)
    # the client's index from the published (theta, inverse, factored): argmax x^T theta + alpha sqrt(max(w, 0))
    contexts = rng.uniform(-1, 1, (1, 6, d))
    actions = np.zeros(1, dtype=np.int64)
    factor_ucb_act((theta, inverse, factored), (1.0, 1.0, False, 1, 0.3), contexts, 0, 0, None, actions)
    widths = np.einsum("kd,de,ke->k", contexts[0], np.linalg.inv(A), contexts[0])
    assert actions[0] == int(np.argmax(contexts[0] @ theta + 0.3 * np.sqrt(np.maximum(widths, 0))))

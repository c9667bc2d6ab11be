"""The integer primitives of secure aggregation (ldpfed.mechanisms.secagg): rounding, sensitivity, Skellam shares,
modular helpers, the wrap bound, the generator and SecAgg+ masking and unmasking. Statistical checks use fixed seeds
and bounds of 5 standard deviations."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from ldpfed.mechanisms import secagg as S
from ldpfed.util.errors import ConfigError


# ---- quantization ---------------------------------------------------------------------------------------------------
def test_randomized_round_is_unbiased_and_within_one():
    rng = np.random.default_rng(1)
    values = np.array([0.3, -1.7, 2.5, 7.0, -0.01, 1e6 + 0.9])
    n = 200_000
    x = np.repeat(values[None, :], n, axis=0)
    q = S.randomized_round(x, rng.random(x.shape))
    assert q.dtype == np.int64
    assert np.all((q == np.floor(x)) | (q == np.floor(x) + 1))
    frac = values - np.floor(values)
    sd = np.sqrt(frac * (1 - frac) / n)          # the mean of n Bernoulli(frac) rounding-ups
    assert np.all(np.abs(q.mean(axis=0) - values) <= 5 * sd + 1e-12)


def test_randomized_round_uses_the_callers_uniforms():
    x = np.array([0.25, 0.75, -0.5])
    assert S.randomized_round(x, np.array([0.2, 0.2, 0.2])).tolist() == [1, 1, 0]
    assert S.randomized_round(x, np.array([0.3, 0.8, 0.5])).tolist() == [0, 0, -1]
    with pytest.raises(ConfigError):
        S.randomized_round(np.array([np.nan]), np.array([0.5]))
    with pytest.raises(ConfigError):
        S.randomized_round(x, np.array([0.5, 0.5]))


def test_quantized_sensitivity_holds_on_worst_cases():
    rng = np.random.default_rng(2)
    dim, scale, l2 = 10, 37.5, 0.02
    l2_q, l1_q = S.quantized_sensitivity(l2, math.sqrt(dim) * l2, dim, scale)
    assert (l2_q, l1_q) == (scale * l2 + 2 * math.sqrt(dim), scale * math.sqrt(dim) * l2 + 2 * dim)
    worst = 0.0
    for _ in range(2000):
        x = rng.normal(size=dim) * 5
        step = rng.normal(size=dim)
        step *= l2 / np.linalg.norm(step)          # ||x - x'||_2 = l2, so ||x - x'||_1 <= sqrt(dim) l2
        xs, xps = scale * x, scale * (x + step)
        # adversarial rounding: x's entries up, x''s down wherever that widens the gap (uniforms in [0, 1))
        up = step < 0
        u = np.where(up, 0.0, 1 - 1e-12)
        q, qp = S.randomized_round(xs, u), S.randomized_round(xps, 1 - 1e-12 - u)
        diff = (q - qp).astype(float)
        assert np.linalg.norm(diff) <= l2_q and np.abs(diff).sum() <= l1_q
        worst = max(worst, np.linalg.norm(diff))
    # the rounding's share really exceeds sqrt(dim): a bound with 1 sqrt(dim) instead of 2 would fail here
    assert worst > scale * l2 + math.sqrt(dim)


# ---- Skellam shares ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("variance", [0.3, 40.0])       # the compiled path and numpy's
def test_skellam_shares_moments(variance):
    shares = S.skellam_shares(np.random.default_rng(3), 1000, 100, variance)
    assert shares.dtype == np.int64 and shares.shape == (1000, 100)
    n = shares.size
    assert abs(shares.mean()) <= 5 * math.sqrt(variance / n)
    # Skellam's fourth cumulant equals its variance: Var(sample variance) ~ (v + 2 v^2) / n
    assert abs(shares.var() - variance) <= 5 * math.sqrt((variance + 2 * variance ** 2) / n)


@pytest.mark.parametrize("variance", [0.01, 3.0, 25.0])
def test_skellam_shares_are_numpys_draws(variance):
    a = S.skellam_shares(np.random.default_rng(4), 30, 7, variance)
    rng = np.random.default_rng(4)
    b = rng.poisson(variance / 2, (30, 7)) - rng.poisson(variance / 2, (30, 7))
    assert np.array_equal(a, b)


def test_sum_of_shares_is_skellam_of_the_summed_variance():
    users, samples, total = 50, 40_000, 2.0
    sums = S.skellam_shares(np.random.default_rng(5), users, samples, total / users).sum(axis=0)
    values = np.arange(-8, 9)
    pmf = special.ive(np.abs(values), total)      # Skellam(mu, mu), 2 mu = total: e^-total I_k(total)
    observed = np.array([(sums == k).mean() for k in values])
    assert np.all(np.abs(observed - pmf) <= 5 * np.sqrt(pmf * (1 - pmf) / samples) + 1e-4)
    assert abs(sums.var() - total) <= 5 * math.sqrt((total + 2 * total ** 2) / samples)


# ---- modular helpers ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [1, 8, 33, 62])
def test_mod_and_to_signed_round_trip(bits):
    half = 1 << (bits - 1)
    rng = np.random.default_rng(6)
    v = rng.integers(-half, half, 1000, dtype=np.int64)
    v[:2] = [-half, half - 1]
    r = S.mod(v, bits)
    assert r.dtype == np.uint64 and int(r.max()) < (1 << bits)
    assert np.array_equal(S.to_signed(r, bits), v)
    assert np.array_equal(S.to_signed(v + (1 << bits) if bits < 62 else v, bits), v)
    with pytest.raises(ConfigError):
        S.mod(v, 63)


def test_modular_sum_is_the_sum_mod_m():
    q = np.random.default_rng(7).integers(-(2 ** 40), 2 ** 40, (500, 3))
    assert np.array_equal(S.to_signed(S.modular_sum(q, 50), 50), q.sum(axis=0))


# ---- wrap-around ----------------------------------------------------------------------------------------------------
def _exact_tail(a: int, variance: float) -> float:
    """P(Z >= a), Z ~ Skellam of that variance, summed from its pmf e^-v I_k(v)."""
    k = np.arange(a, a + 2000)
    return float(special.ive(k, variance).sum())


def test_wrap_bound_dominates_the_exact_probability():
    for users, amax, variance, bits in [(20, 3, 50.0, 7), (1000, 10, 1e4, 15), (5, 0, 2.0, 4), (100, 1, 400.0, 9)]:
        a = 2 ** (bits - 1) - users * amax
        exact = _exact_tail(a, variance) + _exact_tail(a + 1, variance)   # Z >= a or Z <= -a - 1
        bound = S.wrap_probability(users, amax, variance, 1, bits)
        assert exact <= bound <= 1
        assert bound < 1000 * exact + 1e-12       # and not vacuous


def test_wrap_bound_dominates_simulated_wraps():
    users, amax, variance, bits, samples = 20, 3, 50.0, 7, 100_000
    rng = np.random.default_rng(8)
    noise = S.skellam_shares(rng, users, samples, variance / users).sum(axis=0)
    true = users * amax * rng.choice([-1, 1], samples) + noise      # the worst-case data sums, either sign
    frequency = S.count_wraps(true, bits) / samples
    bound = S.wrap_probability(users, amax, variance, 1, bits)
    assert 0.01 < frequency <= bound
    # decoding: a sum that did not wrap comes back exactly, one that did does not
    decoded = S.to_signed(S.mod(true, bits), bits)
    assert np.array_equal(decoded == true, ~S.wrapped(true, bits))


def test_wrap_bound_edges_and_union():
    assert S.wrap_probability(10, 100.0, 1.0, 5, 10) == 1.0           # the data alone may reach m/2
    assert S.wrap_probability(10, 1.0, 0.0, 5, 10) == 0.0             # no noise, data inside
    one = S.wrap_probability(100, 1.0, 1e3, 1, 12)
    assert S.wrap_probability(100, 1.0, 1e3, 7, 12) == pytest.approx(7 * one)


def test_default_bits_meets_the_target_and_is_monotone():
    base = dict(users=1000, max_abs_per_user=10, noise_variance=1e8, entries=110, rounds=1000)   # noise dominates
    bits = S.default_bits(**base)
    assert 1000 * S.wrap_probability(1000, 10, 1e8, 110, bits) < 1e-9 <= 1000 * S.wrap_probability(1000, 10, 1e8,
                                                                                                   110, bits - 1)
    for name, factor in [("users", 10), ("max_abs_per_user", 100), ("noise_variance", 1e4), ("entries", 100),
                         ("rounds", 1e6)]:
        previous = bits
        for step in range(1, 4):
            value = base[name] * factor ** step
            now = S.default_bits(**{**base, name: int(value) if name != "noise_variance" else value})
            assert now >= previous
            previous = now
        if name != "entries":       # (the Skellam tail falls so fast with m that 1e6 x the entries costs no bit)
            assert previous > bits, name
    assert S.default_bits(**base, target=1e-3) <= bits
    with pytest.raises(ConfigError):
        S.default_bits(10 ** 9, 2 ** 40, 1.0, 1, 1)


# ---- the generator and the seeds ------------------------------------------------------------------------------------
def test_expand_slices_are_the_full_stream():
    seeds = np.array([0, 1, 2, 2 ** 63 + 5, 12345678901234567], np.uint64)
    full = S.expand(seeds, 0, 300, 62)
    for a, b in [(0, 1), (7, 110), (100, 300), (299, 300)]:
        assert np.array_equal(S.expand(seeds, a, b - a, 62), full[:, a:b])
    assert np.array_equal(S.expand(seeds, 0, 300, 20), full & np.uint64(2 ** 20 - 1))


def test_expand_looks_uniform():
    out = S.expand(np.arange(1000, dtype=np.uint64), 0, 100, 62)          # neighbouring seeds
    n = out.size
    u = out.astype(np.float64) / 2.0 ** 62
    assert abs(u.mean() - 0.5) <= 5 * math.sqrt(1 / 12 / n)
    for bit in (0, 1, 31, 61):
        ones = ((out >> np.uint64(bit)) & np.uint64(1)).mean()
        assert abs(ones - 0.5) <= 5 * math.sqrt(0.25 / n)
    # neighbouring seeds, neighbouring counters: no two rows alike
    assert len(np.unique(out[:, 0])) == 1000 and len(np.unique(out)) == n


def test_seeds_symmetric_and_separated():
    u, v = np.arange(0, 50), np.arange(50, 100)
    assert np.array_equal(S.pair_seeds(9, 4, u, v), S.pair_seeds(9, 4, v, u))
    pair = S.pair_seeds(9, 4, u, v)
    own = S.self_seeds(9, 4, np.arange(100))
    assert len(np.unique(np.concatenate([pair, own]))) == 150
    assert not np.array_equal(S.pair_seeds(9, 5, u, v), pair)      # another round
    assert not np.array_equal(S.pair_seeds(10, 4, u, v), pair)     # another run


# ---- the graph ----------------------------------------------------------------------------------------------------
def test_graph_shape_and_defaults():
    assert [S.default_neighbours(n) for n in (1, 2, 3, 8, 1000, 10 ** 6)] == [0, 1, 2, 6, 20, 40]
    assert S.threshold(6) == 4 and S.threshold(7) == 4 and S.threshold(40) == 21
    g = S.ring_graph(1, 2, np.arange(100, 200))
    nb = g.neighbours(np.arange(100))
    assert g.k == 14 and nb.shape == (100, 14)
    assert all(i not in row and len(set(row)) == 14 for i, row in enumerate(nb.tolist()))
    adjacency = np.zeros((100, 100), bool)
    adjacency[np.repeat(np.arange(100), 14), nb.ravel()] = True
    assert np.array_equal(adjacency, adjacency.T)
    complete = S.ring_graph(1, 2, np.arange(6))
    assert complete.complete and complete.k == 5
    assert not np.array_equal(S.ring_graph(1, 3, np.arange(100, 200)).order, g.order)
    with pytest.raises(ConfigError):
        S.ring_graph(1, 2, np.arange(10), k=3)


def test_neighbours_for_dropout_keeps_aborts_rare():
    for n in (1000, 10 ** 6):
        for d in (0.1, 0.3):
            k = S.neighbours_for_dropout(n, d, failure=1e-6)
            assert S.abort_probability(n, k, d) <= 1e-6 < S.abort_probability(n, k - 2, d)


# ---- masking and unmasking -------------------------------------------------------------------------------------------
KEY, ROUND, BITS = 0xC0FFEE, 17, 40


@pytest.mark.parametrize("n", [5, 64])           # the complete graph and a ring
def test_masks_cancel_without_dropouts(n):
    g = S.ring_graph(KEY, ROUND, np.arange(n) * 7 + 3)
    q = np.random.default_rng(9).integers(-1000, 1000, (n, 12))
    y = S.mask(q, np.arange(n), g, KEY, ROUND, BITS)
    assert np.array_equal(S.to_signed(S.modular_sum(y, BITS) - S.modular_sum(S.expand(
        S.self_seeds(KEY, ROUND, g.users), 0, 12, BITS), BITS), BITS), q.sum(axis=0))
    assert not np.any(y == S.mod(q, BITS))                  # every entry masked
    everyone = np.ones(n, bool)
    assert np.array_equal(S.to_signed(S.unmask(S.modular_sum(y, BITS), everyone, everyone, g, KEY, ROUND, BITS),
                                      BITS), q.sum(axis=0))


def test_mask_in_chunks_and_entry_ranges():
    n, length = 64, 30
    g = S.ring_graph(KEY, ROUND, np.arange(n))
    q = np.random.default_rng(10).integers(0, 2 ** 30, (n, length))
    full = S.mask(q, np.arange(n), g, KEY, ROUND, BITS)
    rows = np.array([5, 0, 63, 17])
    assert np.array_equal(S.mask(q[rows, 10:25], rows, g, KEY, ROUND, BITS, offset=10), full[rows, 10:25])


@pytest.mark.parametrize("pattern", ["before", "after", "both", "neighbours of one user"])
def test_unmask_under_dropouts(pattern):
    n, length = 200, 9
    rng = np.random.default_rng(11)
    g = S.ring_graph(KEY, ROUND, rng.choice(10 ** 9, n, replace=False))
    q = rng.integers(-(2 ** 20), 2 ** 20, (n, length))
    y = S.mask(q, np.arange(n), g, KEY, ROUND, BITS)
    sent, responded = np.ones(n, bool), np.ones(n, bool)
    if pattern in ("before", "both"):
        sent[rng.choice(n, 20, replace=False)] = False
    responded &= sent
    if pattern in ("after", "both"):
        responded[rng.choice(np.flatnonzero(sent), 15, replace=False)] = False
    if pattern == "neighbours of one user":       # half of user 0's neighbours never send: its key is needed
        sent[g.neighbours([0])[0, : g.k // 2 - 1]] = False
        responded &= sent
    total = S.unmask(S.modular_sum(y[sent], BITS), sent, responded, g, KEY, ROUND, BITS)
    assert np.array_equal(S.to_signed(total, BITS), q[sent].sum(axis=0))
    # a shard unmasking entries [3, 7) from its slice of the masked vectors gets the same entries
    part = S.unmask(S.modular_sum(y[sent, 3:7], BITS), sent, responded, g, KEY, ROUND, BITS, offset=3)
    assert np.array_equal(part, total[3:7])


def test_unmask_aborts_when_a_secret_is_short_of_shares():
    n = 100
    g = S.ring_graph(KEY, ROUND, np.arange(1000, 1000 + n))
    y = S.mask(np.zeros((n, 3), np.int64), np.arange(n), g, KEY, ROUND, BITS)
    sent = np.ones(n, bool)
    responded = sent.copy()
    silent = g.neighbours([42])[0, : g.k - S.threshold(g.k) + 1]     # one too many of user 42's holders silent
    responded[silent] = False
    with pytest.raises(S.ReconstructionFailed) as failed:
        S.unmask(S.modular_sum(y, BITS), sent, responded, g, KEY, ROUND, BITS)
    e = failed.value
    assert e.holders == S.threshold(g.k) - 1 < e.threshold and e.secret == "self-mask seed"
    assert e.user == 1042 or e.failures > 1
    responded[silent[0]] = True                   # one share more: it goes through
    S.unmask(S.modular_sum(y, BITS), sent, responded, g, KEY, ROUND, BITS)
    not_sent = sent.copy()
    not_sent[7] = False
    with pytest.raises(ConfigError):              # a user cannot answer for shares without having sent
        S.unmask(S.modular_sum(y[not_sent], BITS), not_sent, sent, g, KEY, ROUND, BITS)

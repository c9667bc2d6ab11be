"""Privacy amplification by shuffling (ldpfed.mechanisms.shuffle): FMT 2021's closed form and numerical bound checked
by hand, against the authors' published value, against brute force on small batches, and for the shape any
amplification bound must have (monotone, <= eps0, -> 0 as the batch grows)."""
import math

import numpy as np
import pytest
from scipy.stats import binom

from ldpfed.util.errors import ConfigError
from ldpfed.mechanisms.shuffle import (EPS_RTOL, Amplified, amplify, approximate_eps_delta, closed_form_eps,
                                       closed_form_limit, closed_form_valid, largest_eps0, numerical_eps)

DELTA = 1e-6
NS = [10**3, 10**4, 10**5, 10**6, 10**7]
EPS0S = [0.5, 1.0, 2.0, 4.0]


# ---------------------------------------------------------------- brute force
def hockey(p, q, eps):
    """D_{e^eps}(p || q) of two pmfs on one support."""
    return float(np.maximum(p - math.exp(eps) * q, 0.0).sum())


def exact_eps(pairs, delta, top):
    """The smallest eps (bisection to 2^-60 * top, rounded up) at which every pair is (eps, delta)-close both ways."""
    def worst(eps):
        return max(max(hockey(p, q, eps), hockey(q, p, eps)) for p, q in pairs)

    if worst(0.0) <= delta:
        return 0.0
    lo, hi = 0.0, top
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if worst(mid) <= delta else (mid, hi)
    return hi


def rr_count_pairs(eps0, n):
    """Binary randomized response, n users, the shuffled batch = the count of 1s. User 1 holds 0 or 1; the other
    n - 1 hold m ones, every m (the worst case is among them)."""
    keep = math.exp(eps0) / (1.0 + math.exp(eps0))
    pairs = []
    for m in range(n):
        others = np.convolve(binom.pmf(np.arange(m + 1), m, keep), binom.pmf(np.arange(n - m), n - 1 - m, 1 - keep))
        pairs.append((np.convolve(others, [keep, 1 - keep]), np.convolve(others, [1 - keep, keep])))
    return pairs


def clone_pair(eps0, n):
    """FMT's pair, enumerated on its joint support (c, a): P0 = (A + D, C - A + 1 - D), P1 = (A + 1 - D, C - A + D),
    C ~ Bin(n - 1, e^-eps0), A ~ Bin(C, 1/2), D ~ Bern(e^eps0 / (e^eps0 + 1)); a is the first coordinate."""
    alpha = math.exp(eps0) / (math.exp(eps0) + 1.0)
    p0, p1 = np.zeros((n, n + 1)), np.zeros((n, n + 1))
    for c in range(n):
        pc, half = binom.pmf(c, n - 1, math.exp(-eps0)), binom.pmf(np.arange(c + 1), c, 0.5)
        p0[c, :c + 1] += pc * alpha * half
        p0[c, 1:c + 2] += pc * (1 - alpha) * half
        p1[c, :c + 1] += pc * (1 - alpha) * half
        p1[c, 1:c + 2] += pc * alpha * half
    return [(p0.ravel(), p1.ravel())]


@pytest.mark.parametrize("n", [5, 10, 20])
@pytest.mark.parametrize("eps0", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("delta", [1e-2, 1e-3])
def test_numerical_bound_covers_the_exact_randomized_response_batch(n, eps0, delta):
    exact = exact_eps(rr_count_pairs(eps0, n), delta, eps0)
    bound = numerical_eps(eps0, n, delta)
    assert exact <= bound <= eps0                 # an upper bound, never above the message's own eps0
    assert bound <= 2.0 * exact                   # and not absurd: FMT's "small constant factor" (here <= 1.46x)


@pytest.mark.parametrize("n", [2, 7, 30])
@pytest.mark.parametrize("eps0", [0.5, 2.0, 5.0])
def test_numerical_bound_is_the_exact_eps_of_the_clone_pair(n, eps0):
    exact = exact_eps(clone_pair(eps0, n), 1e-3, eps0)
    assert exact <= numerical_eps(eps0, n, 1e-3) <= exact * (1 + 2 * EPS_RTOL) + 1e-12


@pytest.mark.parametrize("eps0", [0.5, 2.0, 6.0])
def test_a_batch_of_one_is_randomized_response(eps0):
    # n = 1: no clones; the pair is binary RR, whose eps at delta is log(e^eps0 - delta (1 + e^eps0)).
    # eps0 = 2, delta = 1e-3: log(7.389056 - 0.008389) = log(7.380667) = 1.998864.
    expected = math.log(math.exp(eps0) - 1e-3 * (1 + math.exp(eps0)))
    assert numerical_eps(eps0, 1, 1e-3) == pytest.approx(expected, rel=2 * EPS_RTOL)


# ---------------------------------------------------------------- values worked out elsewhere
@pytest.mark.parametrize("n, eps0, expected", [
    # e^4 = 54.59815, tanh(2) = 53.59815/55.59815 = 0.964028, log(4/1e-6) = 15.201805;
    # 8 sqrt(54.59815 * 15.201805 / 1e5) = 8 sqrt(0.0082999) = 0.728830; 8 * 54.59815 / 1e5 = 0.004368;
    # 0.964028 * (0.728830 + 0.004368) = 0.706823; log(1.706823) = 0.534634
    (10**5, 4.0, 0.534634),
    # e = 2.718282, tanh(1/2) = 0.462117; 8 sqrt(2.718282 * 15.201805 / 1e4) = 8 * 0.0642828 = 0.514262;
    # 8e / 1e4 = 0.002175; 0.462117 * 0.516437 = 0.238654; log(1.238654) = 0.214026
    (10**4, 1.0, 0.214026),
    # e^2 = 7.389056, tanh(1) = 0.761594; 8 sqrt(7.389056 * 15.201805 / 1e6) = 8 * 0.0105984 = 0.084788;
    # 8 e^2 / 1e6 = 0.0000591; 0.761594 * 0.084847 = 0.064619; log(1.064619) = 0.062617
    (10**6, 2.0, 0.062617),
])
def test_closed_form_by_hand(n, eps0, expected):
    assert closed_form_eps(eps0, n, DELTA) == pytest.approx(expected, abs=2e-6)


def test_numerical_bound_matches_the_authors_published_value():
    # apple/ml-shuffling-amplification README (the FMT authors' code, example.py's output): shuffling n = 100000
    # 4-DP randomizers is (eps, 1e-6)-DP "for eps between 0.1675385583317841 and 0.172790550755978" (their lower
    # and upper bounds on the same clone-pair quantity, computed on blocks of c).
    assert 0.1675385583317841 <= numerical_eps(4.0, 10**5, 1e-6) <= 0.172790550755978


# ---------------------------------------------------------------- shape
@pytest.mark.parametrize("eps0", EPS0S)
def test_numerical_bound_decreases_in_n_and_tends_to_zero(eps0):
    values = [numerical_eps(eps0, n, DELTA) for n in NS]
    assert all(a > b for a, b in zip(values, values[1:]))
    assert all(v <= eps0 for v in values)
    assert numerical_eps(eps0, 10**8, DELTA) < numerical_eps(eps0, 10**4, DELTA) / 30   # ~ 1/sqrt(n): 100x


@pytest.mark.parametrize("n", NS)
def test_numerical_bound_increases_in_eps0(n):
    values = [numerical_eps(eps0, n, DELTA) for eps0 in EPS0S]
    assert all(a < b for a, b in zip(values, values[1:]))


def test_closed_form_is_monotone_and_never_below_the_numerical_bound():
    for n in NS + [10**8]:
        valid = [eps0 for eps0 in EPS0S if closed_form_valid(eps0, n, DELTA)]
        closed = [closed_form_eps(eps0, n, DELTA) for eps0 in valid]
        assert all(a < b for a, b in zip(closed, closed[1:]))
        for eps0, value in zip(valid, closed):
            assert numerical_eps(eps0, n, DELTA) <= value
    for eps0 in EPS0S:
        ns = [n for n in NS if closed_form_valid(eps0, n, DELTA)]
        closed = [closed_form_eps(eps0, n, DELTA) for n in ns]
        assert len(ns) >= 3 and all(a > b for a, b in zip(closed, closed[1:]))


def test_amplify_never_exceeds_eps0():
    for n in (1, 2, 10, 100, 10**4):
        for eps0 in (0.0, 0.1, 1.0, 4.0, 10.0):
            result = amplify(eps0, n, DELTA)
            assert result.eps <= eps0 and result.delta == DELTA
    assert amplify(0.1, 10**3, 1e-2, bound="closed-form").eps <= 0.1


# ---------------------------------------------------------------- validity and errors
def test_closed_form_validity_names_the_parameter():
    # 16 log(2/1e-6) = 16 * 14.508658 = 232.14: a batch of 232 covers no eps0 > 0
    with pytest.raises(ConfigError) as err:
        closed_form_eps(0.5, 232, DELTA)
    assert err.value.field == "n"
    # log(1e4 / 232.14) = log(43.078) = 3.7630: eps0 = 4 is outside, 3.7 inside
    assert closed_form_limit(10**4, DELTA) == pytest.approx(3.763006, abs=1e-6)
    assert closed_form_valid(3.7, 10**4, DELTA) and not closed_form_valid(4.0, 10**4, DELTA)
    with pytest.raises(ConfigError) as err:
        amplify(4.0, 10**4, DELTA, bound="closed-form")
    assert err.value.field == "eps0"


@pytest.mark.parametrize("call, field", [
    (lambda: numerical_eps(-1.0, 100, DELTA), "eps0"),
    (lambda: numerical_eps(1.0, 0, DELTA), "n"),
    (lambda: numerical_eps(1.0, 10.5, DELTA), "n"),
    (lambda: numerical_eps(1.0, 100, 0.0), "delta"),
    (lambda: amplify(1.0, 100, DELTA, bound="blanket"), "bound"),
    (lambda: amplify(1.0, 100, DELTA, delta0=-1e-9), "delta0"),
    (lambda: amplify(1.0, 10**6, DELTA, delta0=1e-6), "delta0"),   # the added term would exceed 1
    (lambda: largest_eps0(0.5, 200, DELTA, bound="closed-form"), "round_size"),   # 200 < 232.14
    (lambda: largest_eps0(1e-12, 10**4, DELTA, bound="closed-form"), "round_size"),   # unreachable target
    (lambda: largest_eps0(0.0, 10**4, DELTA), "target_eps"),
])
def test_bad_input_names_the_parameter(call, field):
    with pytest.raises(ConfigError) as err:
        call()
    assert err.value.field == field


# ---------------------------------------------------------------- approximate randomizers, the ledger row
@pytest.mark.parametrize("bound", ["numerical", "closed-form"])
def test_approximate_randomizers_add_the_stated_delta(bound):
    eps0, delta0, n = 2.0, 1e-12, 10**5
    pure = amplify(eps0, n, DELTA, bound=bound)
    eps, total = approximate_eps_delta(eps0, delta0, n, DELTA, bound=bound)
    assert eps == pure.eps
    assert total == pytest.approx(DELTA + (math.exp(eps) + 1) * (1 + math.exp(-eps0) / 2) * n * delta0, rel=1e-12)
    row = amplify(eps0, n, DELTA, delta0=delta0, bound=bound)
    assert (row.eps, row.delta, row.delta0, row.n, row.bound) == (eps, total, delta0, n, bound)


def test_amplified_is_a_frozen_ledger_row():
    row = amplify(4.0, 10**5, DELTA)
    assert isinstance(row, Amplified) and row.eps0 == 4.0 and row.n == 10**5 and row.bound == "numerical"
    assert "n = 100000" in row.reason and "FMT 2021" in row.reason and "\n" not in row.reason
    with pytest.raises(AttributeError):
        row.eps = 0.0


# ---------------------------------------------------------------- largest_eps0
@pytest.mark.parametrize("target, n, bound", [
    (0.1, 10**4, "numerical"), (0.5, 10**5, "numerical"), (0.05, 10**6, "numerical"),
    (0.1, 10**5, "closed-form"), (0.5, 10**6, "closed-form"),
])
def test_largest_eps0_inverts_amplify(target, n, bound):
    eps0 = largest_eps0(target, n, DELTA, bound=bound)
    assert eps0 > target                                   # shuffling buys a larger local eps0
    eps = amplify(eps0, n, DELTA, bound=bound).eps
    assert target * (1 - 1e-3) <= eps <= target
    assert amplify(eps0 * (1 + 1e-3), n, DELTA, bound=bound).eps > target


def test_largest_eps0_stops_at_the_closed_form_condition():
    # n = 1e4: Thm 3.1 covers eps0 <= 3.763, where its eps (1.094) is below a target of 2
    assert largest_eps0(2.0, 10**4, DELTA, bound="closed-form") == closed_form_limit(10**4, DELTA)

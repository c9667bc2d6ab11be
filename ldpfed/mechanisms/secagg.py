"""Secure aggregation with distributed noise: the integer arithmetic of the "secagg" trust model, simulated as it runs.

Each user of a round quantizes its message to integers (`randomized_round` of its scaled vector), adds its share of
Skellam noise (`skellam_shares`), masks the result (`mask`) and sends it; the server adds the masked vectors modulo
m = 2**bits and removes the masks that did not cancel (`unmask`). What the server learns is the sum, modulo m, of
the sending users' quantized vectors plus their noise: exactly Skellam noise when every share arrived (a sum of
independent Skellam variables is Skellam, with the variances added; the distributed discrete Gaussian's sum is only
close to a discrete Gaussian, which is why this project uses Skellam). The privacy accounting of that noise is in
ldpfed/mechanisms/accounting.py; this module holds the integers.

Everything is integer arithmetic in Z_m, m = 2**bits, 1 <= bits <= 62, held in uint64 arrays: every result is
bit-exact and independent of the order of a sum (uint64 adds wrap modulo 2**64, a multiple of m, so a sum reduced
modulo m at the end equals the sum reduced at every step). `mod` reduces integers into Z_m and `to_signed` reads
Z_m back as integers in [-m/2, m/2); a true sum outside that range "wraps" and is read wrong: `wrap_probability`
bounds that probability, `default_bits` picks m so that it is negligible and `count_wraps` counts the wrapped
entries of a simulated sum.

**SecAgg+** (Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving Machine Learning", CCS 2017;
Bell et al., "Secure Single-Server Aggregation with (Poly)Logarithmic Overhead", CCS 2020). The round's users sit on
a ring in a seeded random order (`ring_graph`); each is joined to the k/2 users before it and the k/2 after it
(every other user when the round is small). User u masks its vector q_u as

    y_u = q_u + PRG(b_u) + sum over neighbours v of sign(u, v) PRG(s_uv)   (mod m),

sign(u, v) = +1 if u's ring position is below v's, else -1, so each pair's masks cancel in the sum of both. b_u is
u's self-mask seed, s_uv the seed both u and v derive by key agreement; u secret-shares b_u and its key-agreement
secret key among its k neighbours with threshold t = `threshold(k)`. When some users do not send, the server asks
the neighbours that are still there for shares: of b_u for every user u that sent, of the secret key for every user
that did not (so it can recompute the pair masks that user's sending neighbours added). A secret held by fewer than
t responding neighbours cannot be reconstructed and the round aborts (`ReconstructionFailed`).

The simulation replaces the cryptography by hashing: `pair_seeds` and `self_seeds` derive the seeds from a key and
the round (the pairwise seed is symmetric in the pair, as key agreement makes it), `expand` is a counter-based
generator that stands in for the stream cipher (a 64-bit mixing function of (seed, counter), statistically strong,
not cryptographic), and the secret sharing is reduced to its one observable effect: counting the responding holders
of each secret the server needs. tests/test_secagg_protocol.py runs the real protocol (X25519, HKDF, ChaCha20,
Shamir) at a small n and checks that both give the same sums under the same drop-outs.

Users are numbered by their index in `ring_graph(...).users` (the rows of a round's arrays); the user ids in that
array (non-negative integers below 2**63, e.g. population-wide user numbers) feed the seeds. Work is vectorized over
users by compiled loops (no Python loop per user) and takes `rows` (which users) and `offset` (which entries), so a
population actor can mask a chunk of its users and a server shard can unmask its range of entries.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit

from ldpfed.util.errors import ConfigError

MAX_BITS = 62           # m = 2**62: sums of two residues and the centred range stay inside int64 / uint64
POISSON_NUMPY_FROM = 10.0   # numpy's Poisson sampler is faster from this mean up, numba's below (same draws)

_M1 = np.uint64(0xBF58476D1CE4E5B9)      # splitmix64's finalizer (Steele, Lea, Flood 2014)
_M2 = np.uint64(0x94D049BB133111EB)
_GAMMA = np.uint64(0x9E3779B97F4A7C15)   # 2**64 / golden ratio: splitmix64's counter step
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_KEY_A = np.uint64(0x6A09E667F3BCC908)   # stream keys of expand (digits of sqrt(2), sqrt(3): nothing up the sleeve)
_KEY_B = np.uint64(0xBB67AE8584CAA73B)
_TAG_SELF = np.uint64(0x3C6EF372FE94F82B)  # domain separation of the self-mask and pair seeds
_TAG_PAIR = np.uint64(0xA54FF53A5F1D36F1)


class ReconstructionFailed(RuntimeError):
    """A secret the server needs to unmask has fewer than `threshold` responding holders: the round aborts.

    user: the user's id; secret: "self-mask seed" (the user sent) or "secret key" (it did not, and a sending
    neighbour added a pair mask with it); holders: how many of its neighbours responded; failures: how many users
    of the round lack a secret (the first, by index, is the one named)."""

    def __init__(self, user: int, secret: str, holders: int, threshold: int, failures: int):
        self.user, self.secret, self.holders, self.threshold, self.failures = user, secret, holders, threshold, failures
        super().__init__(f"user {user}: its {secret} has {holders} responding holder(s), {threshold} needed to "
                         f"reconstruct it ({failures} user(s) of the round short of shares); the round aborts")


# ---- modular arithmetic ----------------------------------------------------------------------------------------------
def _bits(bits) -> int:
    if isinstance(bits, (bool, np.bool_)) or not isinstance(bits, (int, np.integer)) or not 1 <= bits <= MAX_BITS:
        raise ConfigError("bits", bits, f"must be an integer in [1, {MAX_BITS}] (the modulus is 2**bits)")
    return int(bits)


def mod(values, bits) -> np.ndarray:
    """values (any integer array, signed or not) reduced into Z_m, m = 2**bits, as uint64: v mod m, in [0, m).
    A negative int64 goes through its two's complement (v + 2**64), the same residue since m divides 2**64."""
    b = _bits(bits)
    v = np.asarray(values)
    if v.dtype.kind not in "iu":
        raise ConfigError("values.dtype", str(v.dtype), "must be an integer type")
    return v.astype(np.uint64) & np.uint64((1 << b) - 1)


def to_signed(values, bits) -> np.ndarray:
    """Residues of Z_m (any integers, reduced first) as the int64 in [-m/2, m/2) of the same class: the decoding of
    a sum whose true value lies in that range (outside it, the sum wrapped; see wrap_probability)."""
    b = _bits(bits)
    v = mod(values, b).astype(np.int64)
    return np.where(v >= (1 << (b - 1)), v - (1 << b), v)


def modular_sum(values, bits, axis: int = 0) -> np.ndarray:
    """The sum of integer arrays along `axis` in Z_m, as uint64 (what the server adds up; order-independent)."""
    return np.sum(mod(values, bits), axis=axis, dtype=np.uint64) & np.uint64((1 << _bits(bits)) - 1)


# ---- quantization ----------------------------------------------------------------------------------------------------
_ROUND_LIMIT = float(2 ** 62)


def randomized_round(x, uniforms) -> np.ndarray:
    """floor(x) + (uniforms < x - floor(x)), entrywise, as int64: x rounded down or up at random, up with probability
    its fractional part, so E[result] = x (unbiased) and |result - x| < 1. `uniforms` (same shape, in [0, 1)) come
    from the caller's own seeded stream, so the rounding is reproducible and independent of the noise's draws.
    x must be finite with |x| < 2**62 (ConfigError otherwise)."""
    x = np.asarray(x, dtype=np.float64)
    u = np.asarray(uniforms, dtype=np.float64)
    if u.shape != x.shape:
        raise ConfigError("uniforms.shape", u.shape, f"must equal x's shape {x.shape}")
    if not np.all(np.isfinite(x)) or float(np.max(np.abs(x), initial=0.0)) >= _ROUND_LIMIT:
        raise ConfigError("x", "non-finite or |x| >= 2**62", "must be finite with |x| < 2**62")
    if u.size and (float(u.min()) < 0.0 or float(u.max()) >= 1.0):
        raise ConfigError("uniforms", "outside [0, 1)", "must lie in [0, 1)")
    low = np.floor(x)
    return low.astype(np.int64) + (u < x - low)


def quantized_sensitivity(l2, l1, dim, scale) -> tuple[float, float]:
    """(l2_q, l1_q): bounds, holding for every draw of the rounding, on the L2 and L1 norms of q(x) - q(x'), where
    q(x) = randomized_round(scale * x) and x, x' are two inputs of one user (replace-one neighbours) whose difference
    has real L2 norm <= l2 and L1 norm <= l1, in `dim` entries:

        l2_q = scale * l2 + 2 sqrt(dim),   l1_q = scale * l1 + 2 dim.

    Why: q(x) = scale x + e(x) with every entry of the rounding error e in (-1, 1), so q(x) - q(x') =
    scale (x - x') + (e(x) - e(x')), each entry of the second term in (-2, 2): its L2 norm is < 2 sqrt(dim) and its
    L1 norm < 2 dim, and the triangle inequality adds them to scale l2 and scale l1. It needs nothing of the draws
    (fail-safe: no probability of exceeding it), and is looser than the conditional rounding of Kairouz, Liu and
    Steinke ("The Distributed Discrete Gaussian Mechanism for Federated Learning with Secure Aggregation", ICML
    2021), which re-draws the rounding until the norm is small and pays a small probability instead."""
    l2, l1, scale = float(l2), float(l1), float(scale)
    for name, value in (("l2", l2), ("l1", l1), ("scale", scale)):
        if not math.isfinite(value) or value < 0 or (name == "scale" and value == 0):
            raise ConfigError(name, value, "must be finite and >= 0" + (" (> 0)" if name == "scale" else ""))
    d = _positive_int("dim", dim)
    return scale * l2 + 2.0 * math.sqrt(d), scale * l1 + 2.0 * d


def _positive_int(name, value) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(name, value, "must be an integer >= 1")
    return int(value)


# ---- Skellam noise ---------------------------------------------------------------------------------------------------
@njit(cache=True)
def _poisson_difference(rng, n, length, lam):
    """rng.poisson(lam, (n, length)) - rng.poisson(lam, (n, length)), the same draws in the same order (numba's
    Generator.poisson is numpy's algorithm on the same bit generator), without the two temporaries."""
    out = np.empty((n, length), np.int64)
    for i in range(n):
        for j in range(length):
            out[i, j] = rng.poisson(lam)
    for i in range(n):
        for j in range(length):
            out[i, j] -= rng.poisson(lam)
    return out


def skellam_shares(rng: np.random.Generator, n, length, variance) -> np.ndarray:
    """n users' noise shares, int64 (n, length): every entry an independent Poisson(variance/2) - Poisson(variance/2)
    (symmetric Skellam, mean 0, variance `variance`), drawn from `rng`.

    `variance` is each share's: for noise of total variance v on the sum of n users' vectors, each user adds a share
    of variance v / n, and the sum of the n shares is exactly Skellam of variance v (Poisson laws add their means).
    When users drop out, the sum holds only the shares that arrived: the caller accounts for the variance that did.

    The values equal rng.poisson(variance/2, (n, length)) - rng.poisson(variance/2, (n, length)) bit for bit; below
    a Poisson mean of POISSON_NUMPY_FROM a compiled loop draws them (3x faster there, e.g. 7 ns instead of 22 ns an
    entry at mean 0.005), from there on numpy does."""
    n, length = _positive_int("n", n), _positive_int("length", length)
    v = float(variance)
    if not math.isfinite(v) or v < 0:
        raise ConfigError("variance", variance, "must be finite and >= 0")
    lam = v / 2.0
    if lam >= POISSON_NUMPY_FROM:
        return rng.poisson(lam, (n, length)) - rng.poisson(lam, (n, length))
    return _poisson_difference(rng, n, length, lam)


# ---- wrap-around -----------------------------------------------------------------------------------------------------
def _log_wrap_bound(users, max_abs_per_user, noise_variance, entries, bits) -> float:
    b = _bits(bits)
    users, entries = _positive_int("users", users), _positive_int("entries", entries)
    a_user, v = float(max_abs_per_user), float(noise_variance)
    if not math.isfinite(a_user) or a_user < 0:
        raise ConfigError("max_abs_per_user", max_abs_per_user, "must be finite and >= 0")
    if not math.isfinite(v) or v < 0:
        raise ConfigError("noise_variance", noise_variance, "must be finite and >= 0")
    a = 2.0 ** (b - 1) - users * a_user          # the noise must reach a to wrap
    if a <= 0:
        return 0.0
    if v == 0:
        return -math.inf
    r = a / v
    # V (cosh t - 1) - t a at sinh t = a / V; sqrt(1 + r^2) - 1 written without cancellation
    log_tail = v * (r * r / (math.sqrt(1.0 + r * r) + 1.0)) - a * math.asinh(r)
    return min(0.0, math.log(2.0 * entries) + log_tail)


def wrap_probability(users, max_abs_per_user, noise_variance, entries, bits) -> float:
    """An upper bound on the probability that some entry of the sum, over `users` users, of their quantized vectors
    plus Skellam noise of total variance `noise_variance` leaves [-m/2, m/2), m = 2**bits (there it wraps: see
    to_signed). Every entry of every user's quantized vector has |.| <= max_abs_per_user (a deterministic bound, e.g.
    from clipping; it includes no noise), so each of the `entries` entries of the sum is s + Z with |s| <= users *
    max_abs_per_user and Z ~ Skellam(noise_variance), Z = P1 - P2, P1, P2 ~ Poisson(V/2), V = noise_variance.

    Derivation. With a = m/2 - users * max_abs_per_user (if a <= 0 the bound is 1), the entry leaves the range only
    if Z >= a (s + Z >= m/2) or Z <= -a - 1 (s + Z < -m/2); Z is symmetric, so both together have probability
    <= 2 P(Z >= a). Z's moment generating function is E e^{tZ} = exp(V/2 (e^t - 1)) exp(V/2 (e^-t - 1)) =
    exp(V (cosh t - 1)), so for every t > 0 (Chernoff) P(Z >= a) <= exp(V (cosh t - 1) - t a); the exponent is
    smallest at sinh t = a / V, where, with r = a / V,

        P(Z >= a) <= exp(V (sqrt(1 + r^2) - 1) - a asinh(r)).

    A union bound over the entries gives 2 * entries * that, capped at 1 (0 when V = 0 and a > 0: no noise, no
    wrap). For one round; over R rounds multiply by R (default_bits does)."""
    return math.exp(_log_wrap_bound(users, max_abs_per_user, noise_variance, entries, bits))


def default_bits(users, max_abs_per_user, noise_variance, entries, rounds, target: float = 1e-9) -> int:
    """The smallest bits (1..62) with rounds * wrap_probability(users, max_abs_per_user, noise_variance, entries,
    bits) < target: a modulus at which no entry of any of `rounds` rounds wraps, except with probability below
    `target`. ConfigError if even 62 bits do not reach it. Non-decreasing in users, max_abs_per_user,
    noise_variance, entries and rounds (so is the bound)."""
    rounds = _positive_int("rounds", rounds)
    t = float(target)
    if not (0 < t <= 1):
        raise ConfigError("target", target, "must be in (0, 1]")
    log_limit = math.log(t) - math.log(rounds)
    for bits in range(1, MAX_BITS + 1):
        if _log_wrap_bound(users, max_abs_per_user, noise_variance, entries, bits) < log_limit:
            return bits
    raise ConfigError("bits", f"> {MAX_BITS}",
                      f"no modulus up to 2**{MAX_BITS} keeps {rounds} round(s) of {users} users' sums (entries up to "
                      f"{max_abs_per_user} each, noise variance {noise_variance}) from wrapping with probability "
                      f"< {target}")


def wrapped(true_sums, bits) -> np.ndarray:
    """bool array: which entries of the exact (not reduced) integer sums lie outside [-m/2, m/2), m = 2**bits, i.e.
    would be decoded wrong by to_signed after the modular sum. `true_sums` is int64 (the simulation can add the
    users' quantized vectors and noise exactly: |sum| < 2**63) or an object array of Python ints."""
    b = _bits(bits)
    s = np.asarray(true_sums)
    half = 1 << (b - 1)
    return (s < -half) | (s >= half)


def count_wraps(true_sums, bits) -> int:
    """How many entries of the exact integer sums wrapped modulo 2**bits (see wrapped)."""
    return int(np.count_nonzero(wrapped(true_sums, bits)))


# ---- the generator and the seeds -------------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def _mix(z):
    """splitmix64's finalizer: a bijection of uint64 with full avalanche."""
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@njit(cache=True, inline="always")
def _stream_keys(seed):
    return _mix(seed ^ _KEY_A), _mix(seed ^ _KEY_B)


@njit(cache=True, inline="always")
def _stream_at(ka, kb, counter):
    """The stream of the seed with keys (ka, kb) at `counter`: splitmix64's output at that counter under key ka,
    mixed once more with kb (so streams of seeds whose ka differ by a multiple of the counter step do not overlap)."""
    return _mix(_mix(ka + _GAMMA * (counter + np.uint64(1))) ^ kb)


@njit(cache=True)
def _expand(seeds, offset, length, mask_bits, out):
    for i in range(seeds.shape[0]):
        ka, kb = _stream_keys(seeds[i])
        for j in range(length):
            out[i, j] = _stream_at(ka, kb, np.uint64(offset + j)) & mask_bits


def _offset(offset) -> int:
    if isinstance(offset, (bool, np.bool_)) or not isinstance(offset, (int, np.integer)) or not 0 <= offset < 2 ** 62:
        raise ConfigError("offset", offset, "must be an integer in [0, 2**62)")
    return int(offset)


def expand(seeds, offset, length, bits) -> np.ndarray:
    """uint64 (P, length): row i is the stream of seeds[i] (uint64, (P,)) at counters offset .. offset + length - 1,
    reduced mod 2**bits. A counter-based generator, so a shard that owns entries [a, b) of the vector expands only
    those (expand(s, a, b - a, bits) == expand(s, 0, b, bits)[:, a:b]).

    It simulates the stream cipher (e.g. ChaCha20 or AES-CTR) that expands a key-agreement seed into a mask: output
    c of seed s is mix(mix(ka + gamma (c + 1)) xor kb), mix being splitmix64's finalizer and (ka, kb) two mixes of s.
    Statistically strong (each output a full-avalanche function of seed and counter); not a cipher."""
    s = np.ascontiguousarray(seeds, dtype=np.uint64).reshape(-1)
    length = _positive_int("length", length)
    out = np.empty((s.shape[0], length), np.uint64)
    _expand(s, _offset(offset), length, np.uint64((1 << _bits(bits)) - 1), out)
    return out


@njit(cache=True, inline="always")
def _self_seed(key, rnd, u):
    return _mix(_mix(_mix(key ^ _TAG_SELF) ^ rnd) ^ u)


@njit(cache=True, inline="always")
def _pair_seed(key, rnd, u, v):
    a, b = (u, v) if u <= v else (v, u)
    return _mix(_mix(_mix(_mix(key ^ _TAG_PAIR) ^ rnd) ^ a) ^ b)


@njit(cache=True)
def _self_seeds(key, rnd, users, out):
    for i in range(users.shape[0]):
        out[i] = _self_seed(key, rnd, np.uint64(users[i]))


@njit(cache=True)
def _pair_seeds(key, rnd, u, v, out):
    for i in range(u.shape[0]):
        out[i] = _pair_seed(key, rnd, np.uint64(u[i]), np.uint64(v[i]))


def _key(key) -> np.uint64:
    if isinstance(key, (bool, np.bool_)) or not isinstance(key, (int, np.integer)) or not 0 <= int(key) < 2 ** 64:
        raise ConfigError("key", key, "must be an integer in [0, 2**64)")
    return np.uint64(int(key))


def _ids(name, users) -> np.ndarray:
    a = np.asarray(users)
    if a.dtype.kind not in "iu" or (a.size and (a.min() < 0 or int(a.max()) >= 2 ** 63)):
        raise ConfigError(name, "not integers in [0, 2**63)", "user ids must be integers in [0, 2**63)")
    return np.ascontiguousarray(a, dtype=np.int64).reshape(-1)


def self_seeds(key, round, users) -> np.ndarray:
    """uint64 (n,): each user's self-mask seed b_u for this round (what the user draws at random in the protocol),
    a hash of (key, round, user id)."""
    u = _ids("users", users)
    out = np.empty(u.shape[0], np.uint64)
    _self_seeds(_key(key), np.uint64(_positive_or_zero("round", round)), u, out)
    return out


def pair_seeds(key, round, u, v) -> np.ndarray:
    """uint64 (n,): the seed s_uv of each pair (u[i], v[i]) for this round, symmetric (pair_seeds(k, r, u, v) ==
    pair_seeds(k, r, v, u)): what the two users agree on by key agreement in the protocol, a hash of (key, round,
    min, max)."""
    a, b = _ids("u", u), _ids("v", v)
    if a.shape != b.shape:
        raise ConfigError("v.shape", b.shape, f"must equal u's shape {a.shape}")
    out = np.empty(a.shape[0], np.uint64)
    _pair_seeds(_key(key), np.uint64(_positive_or_zero("round", round)), a, b, out)
    return out


def _positive_or_zero(name, value) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or not 0 <= value < 2 ** 63:
        raise ConfigError(name, value, "must be an integer in [0, 2**63)")
    return int(value)


# ---- the SecAgg+ graph -----------------------------------------------------------------------------------------------
def default_neighbours(n) -> int:
    """k for a round of n users: 2 ceil(log2 n) (even), at most n - 1 (then every user is every other one's
    neighbour: the complete graph of the original protocol). Bell et al. prove that k = O(log n) neighbours keep
    the protocol secure and correct against given fractions of dropped and corrupt users, the constant growing with
    those fractions and the security parameters. The constant 2 is the smallest that keeps rounds with independent
    drop-outs of 10% from aborting (every user needs threshold(k) responding neighbours): at n = 1e3, 1e4, 1e5, 1e6
    (k = 20, 28, 34, 40) a round aborts with probability at most 7e-3, 1e-3, 4e-4, 2e-4 (n times the binomial tail;
    the constant 1 would leave most rounds aborted). Heavier drop-outs need a larger k: neighbours_for_dropout.
    Cost is linear in k."""
    n = _positive_int("n", n)
    if n == 1:
        return 0
    return min(2 * math.ceil(math.log2(n)), n - 1)


def _log_binomial_cdf(x: int, k: int, p: float) -> float:
    """log P(Binomial(k, p) <= x), summed in log space (k is at most a few thousand here)."""
    if x < 0:
        return -math.inf
    if x >= k:
        return 0.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return -math.inf
    logs = [math.lgamma(k + 1) - math.lgamma(i + 1) - math.lgamma(k - i + 1) + i * math.log(p)
            + (k - i) * math.log1p(-p) for i in range(x + 1)]
    top = max(logs)
    return top + math.log(sum(math.exp(v - top) for v in logs))


def abort_probability(n, k, dropout) -> float:
    """An upper bound on the probability that a round of n users on the graph with k neighbours each aborts when
    every user independently fails to respond with probability `dropout`: n times the probability that one user has
    fewer than threshold(k) responding neighbours (a union bound over the secrets the server may need). For the
    complete graph (k = n - 1) the same count applies."""
    n = _positive_int("n", n)
    d = float(dropout)
    if not 0.0 <= d <= 1.0:
        raise ConfigError("dropout", dropout, "must be in [0, 1]")
    k = int(k)
    return min(1.0, n * math.exp(_log_binomial_cdf(threshold(k) - 1, k, 1.0 - d)))


def neighbours_for_dropout(n, dropout, failure: float = 1e-6) -> int:
    """The smallest even k >= default_neighbours(n) at which abort_probability(n, k, dropout) <= failure, at most
    n - 1 (the complete graph, which may still miss `failure`: the caller sees it in abort_probability). E.g. at
    n = 1e6 and failure 1e-6: 52 neighbours at 10% drop-outs and 290 at 30% (40 by default)."""
    n = _positive_int("n", n)
    f = float(failure)
    if not 0.0 < f <= 1.0:
        raise ConfigError("failure", failure, "must be in (0, 1]")
    k = default_neighbours(n)
    while k < n - 1 and abort_probability(n, k, dropout) > f:
        k = min(k + 2, n - 1)
    return k


def threshold(k) -> int:
    """Shares needed to reconstruct a secret shared among k neighbours: k // 2 + 1, a strict majority. Above k/2 so
    two disjoint sets of holders can never both reconstruct: an honest holder answers for each neighbour either a
    share of its self-mask seed (it sent) or of its secret key (it dropped), never both, so a server that claims
    different drop-outs to different holders cannot learn both secrets of one user, which would unmask its vector
    (Bonawitz et al., Sec. 4)."""
    k = int(k)
    if k < 0:
        raise ConfigError("k", k, "must be >= 0")
    return k // 2 + 1


@dataclass(frozen=True)
class RingGraph:
    """The SecAgg+ graph of a round: users (int64 (n,), ids), position (int64 (n,), ring position of the user at
    each index), order (int64 (n,), index of the user at each ring position) and offsets (int64 (k,)): user i's
    neighbours are the users at ring positions (position[i] + offsets) mod n."""
    users: np.ndarray
    position: np.ndarray
    order: np.ndarray
    offsets: np.ndarray

    @property
    def n(self) -> int:
        return int(self.users.shape[0])

    @property
    def k(self) -> int:
        return int(self.offsets.shape[0])

    @property
    def complete(self) -> bool:
        return self.k == self.n - 1

    def neighbours(self, rows) -> np.ndarray:
        """int64 (len(rows), k): the indices of the neighbours of users `rows` (ring order: after, then before)."""
        rows = np.asarray(rows, dtype=np.int64)
        return self.order[(self.position[rows][:, None] + self.offsets[None, :]) % self.n]


def ring_graph(key, round, users, k=None) -> RingGraph:
    """The round's SecAgg+ graph: the users (ids, int (n,)) in a random order on a ring (a permutation seeded by
    (key, round)), each joined to the k/2 users before it and the k/2 after it (a Harary graph on the permuted ring).
    k: even, < n; None: default_neighbours(n). A k >= n - 1 (or n small enough that the default reaches n - 1)
    gives the complete graph: every user neighbour of every other."""
    ids = _ids("users", users)
    n = ids.shape[0]
    if n == 0:
        raise ConfigError("users", "empty", "a round needs at least one user")
    if len(np.unique(ids)) != n:
        raise ConfigError("users", "repeated ids", "a round's user ids must be distinct")
    k = default_neighbours(n) if k is None else int(k)
    if k < 0 or (k < n - 1 and k % 2):
        raise ConfigError("k", k, "must be even and >= 0 (or >= n - 1: the complete graph)")
    if k >= n - 1:
        offsets = np.arange(1, n, dtype=np.int64)
    else:
        h = k // 2
        offsets = np.concatenate([np.arange(1, h + 1), np.arange(n - h, n)]).astype(np.int64)
    entropy = [int(_key(key)), _positive_or_zero("round", round), 0x5EC]     # 0x5EC: the ring's own stream
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))
    order = rng.permutation(n).astype(np.int64)
    position = np.empty(n, np.int64)
    position[order] = np.arange(n, dtype=np.int64)
    return RingGraph(ids, position, order, offsets)


# ---- client and server -----------------------------------------------------------------------------------------------
@njit(cache=True)
def _add_stream(acc, seed, offset, sign_plus):
    """acc += (or -=) the stream of `seed` at counters offset .. offset + len(acc) - 1, modulo 2**64."""
    ka, kb = _stream_keys(seed)
    for j in range(acc.shape[0]):
        x = _stream_at(ka, kb, np.uint64(offset + j))
        if sign_plus:
            acc[j] += x
        else:
            acc[j] -= x


@njit(cache=True)
def _mask_rows(q, rows, ids, position, order, offsets, key, rnd, offset, mask_bits, out):
    n = ids.shape[0]
    length = q.shape[1]
    acc = np.empty(length, np.uint64)
    for r in range(rows.shape[0]):
        i = rows[r]
        u = np.uint64(ids[i])
        for j in range(length):
            acc[j] = q[r, j]
        _add_stream(acc, _self_seed(key, rnd, u), offset, True)
        p = position[i]
        for o in range(offsets.shape[0]):
            pv = (p + offsets[o]) % n
            v = np.uint64(ids[order[pv]])
            _add_stream(acc, _pair_seed(key, rnd, u, v), offset, p < pv)
        for j in range(length):
            out[r, j] = acc[j] & mask_bits


def mask(q, rows, graph: RingGraph, key, round, bits, offset=0) -> np.ndarray:
    """The masked vectors y (uint64 (len(rows), L)) of users `rows` (indices into graph.users) for the entries
    offset .. offset + L - 1 of their integer vectors q (any integer dtype, (len(rows), L), reduced mod m):

        y_u = q_u + PRG(b_u) + sum over neighbours v of sign(u, v) PRG(s_uv)   (mod m = 2**bits),

    b_u = self_seeds(key, round, [id_u]), s_uv = pair_seeds(key, round, id_u, id_v), PRG = expand at `offset`, and
    sign(u, v) = +1 when u's ring position is below v's, -1 otherwise. Each user expands k + 1 streams; a compiled loop
    over the users, memory O(L) beyond the output."""
    b = _bits(bits)
    rows = np.ascontiguousarray(rows, dtype=np.int64).reshape(-1)
    qm = np.ascontiguousarray(mod(q, b))
    if qm.ndim != 2 or qm.shape[0] != rows.shape[0]:
        raise ConfigError("q.shape", qm.shape, f"must be (len(rows), L) = ({rows.shape[0]}, L)")
    if rows.size and (rows.min() < 0 or rows.max() >= graph.n):
        raise ConfigError("rows", "out of range", f"must index the graph's {graph.n} users")
    out = np.empty(qm.shape, np.uint64)
    _mask_rows(qm, rows, graph.users, graph.position, graph.order, graph.offsets, _key(key),
               np.uint64(_positive_or_zero("round", round)), _offset(offset), np.uint64((1 << b) - 1), out)
    return out


@njit(cache=True)
def _unmask(acc, sent_rows, dropped_rows, sent, ids, position, order, offsets, key, rnd, offset):
    n = ids.shape[0]
    for r in range(sent_rows.shape[0]):           # the self masks of every user that sent
        _add_stream(acc, _self_seed(key, rnd, np.uint64(ids[sent_rows[r]])), offset, False)
    for r in range(dropped_rows.shape[0]):        # the pair masks each dropped user's sending neighbours added
        w = dropped_rows[r]
        pw = position[w]
        idw = np.uint64(ids[w])
        for o in range(offsets.shape[0]):
            pv = (pw + offsets[o]) % n
            v = order[pv]
            if sent[v]:
                # v added sign(v, w) PRG(s_vw): +1 when v's position is below w's; remove it
                _add_stream(acc, _pair_seed(key, rnd, idw, np.uint64(ids[v])), offset, not (pv < pw))


def _neighbour_counts(graph: RingGraph, flags: np.ndarray) -> np.ndarray:
    """int64 (n,): for each user, how many of its neighbours have flags set (k rolls of the ring; O(n k))."""
    if graph.complete:
        return int(flags.sum()) - flags.astype(np.int64)
    by_position = flags[graph.order].astype(np.int64)
    counts = np.zeros(graph.n, np.int64)
    for o in graph.offsets:
        counts += np.roll(by_position, -int(o))
    return counts[graph.position]


def _flags(name, value, n) -> np.ndarray:
    a = np.asarray(value)
    if a.dtype != np.bool_ or a.shape != (n,):
        raise ConfigError(name, f"{a.dtype} {a.shape}", f"must be a bool array of shape ({n},), one per user")
    return a


def unmask(masked_sum, sent, responded, graph: RingGraph, key, round, bits, offset=0, t=None) -> np.ndarray:
    """The sum over the users that sent of their vectors q (uint64 (L,), mod m = 2**bits), from `masked_sum` (the
    modular sum of their masked vectors y for entries offset .. offset + L - 1, e.g. modular_sum(y_sent, bits)).

    sent, responded: bool (n,) over graph.users: whose masked vectors arrived, and who answered the server's
    request for shares (responded must be a subset of sent; a user can send and then drop). The server removes
    * the self mask PRG(b_u) of every user u that sent; b_u is reconstructed from the shares of u's responding
      neighbours;
    * for every user w that did not send, the pair masks sign(v, w) PRG(s_vw) its sending neighbours v added; w's
      secret key is reconstructed from its responding neighbours' shares (needed only when w has a sending
      neighbour).
    A secret with fewer than t (default threshold(graph.k)) responding holders raises ReconstructionFailed (the
    round aborts). Cost: one stream per sending user plus one per (dropped user, sending neighbour) pair, a compiled
    loop over users; memory O(n k / 8) for the counts."""
    b = _bits(bits)
    acc = np.array(mod(masked_sum, b), dtype=np.uint64).reshape(-1)
    n = graph.n
    sent, responded = _flags("sent", sent, n), _flags("responded", responded, n)
    if np.any(responded & ~sent):
        raise ConfigError("responded", "includes users that did not send", "must be a subset of sent")
    t = threshold(graph.k) if t is None else int(t)
    holders = _neighbour_counts(graph, responded)
    dropped = ~sent
    needs_key = dropped & (_neighbour_counts(graph, sent) > 0)
    short = (sent | needs_key) & (holders < t)
    if short.any():
        i = int(np.flatnonzero(short)[0])
        raise ReconstructionFailed(int(graph.users[i]), "self-mask seed" if sent[i] else "secret key",
                                   int(holders[i]), t, int(short.sum()))
    _unmask(acc, np.flatnonzero(sent).astype(np.int64), np.flatnonzero(needs_key).astype(np.int64), sent,
            graph.users, graph.position, graph.order, graph.offsets, _key(key),
            np.uint64(_positive_or_zero("round", round)), _offset(offset))
    return acc & np.uint64((1 << b) - 1)

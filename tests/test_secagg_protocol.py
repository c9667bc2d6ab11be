"""SecAgg+ with its real cryptography at a small round, against the simulation in ldpfed.mechanisms.secagg.

Eight users on the simulation's ring graph (k = 6 neighbours each, threshold 4) run the protocol of Bonawitz et al.
(CCS 2017) restricted to the graph as in Bell et al. (CCS 2020): X25519 key pairs, pairwise seeds by key agreement
and HKDF, masks expanded by ChaCha20, random self-mask seeds, Shamir shares (over the prime 2**521 - 1) of each
user's secret key and self-mask seed among its neighbours. Some users drop before sending, some after; the server
reconstructs the secrets it needs from the responding neighbours' shares and unmasks. The sum it gets must be the
true sum of the senders' vectors and what the simulation's unmask gives for the same vectors and drop-outs (the
simulated masks are other numbers: only the sums agree), and a drop-out pattern that leaves some needed secret
short of shares must stop both, at the same user.
"""
from __future__ import annotations

import random

import numpy as np
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PrivateFormat, NoEncryption

from ldpfed.mechanisms import secagg as S

PRIME = 2 ** 521 - 1      # a Mersenne prime above the 256-bit secrets
N, L, BITS, KEY, ROUND = 8, 5, 32, 0x5EC_A66, 3
USERS = np.array([11, 23, 35, 47, 59, 61, 73, 85])


# ---- Shamir's secret sharing over GF(PRIME) ------------------------------------------------------------------------
def shamir_share(secret: int, xs, t: int, rnd: random.Random) -> dict:
    """{x: f(x)} for a random polynomial f of degree t - 1 with f(0) = secret."""
    coefficients = [secret] + [rnd.randrange(PRIME) for _ in range(t - 1)]
    return {x: sum(c * pow(x, i, PRIME) for i, c in enumerate(coefficients)) % PRIME for x in xs}


def shamir_reconstruct(shares: dict) -> int:
    """f(0) by Lagrange interpolation through the given points."""
    total = 0
    for xi, yi in shares.items():
        num, den = 1, 1
        for xj in shares:
            if xj != xi:
                num = num * (-xj) % PRIME
                den = den * (xi - xj) % PRIME
        total = (total + yi * num * pow(den, -1, PRIME)) % PRIME
    return total


# ---- the cryptographic primitives ------------------------------------------------------------------------------------
def chacha_mask(seed: bytes) -> np.ndarray:
    """L entries of Z_m from ChaCha20's keystream under the 32-byte seed (zero nonce: each seed is used once)."""
    stream = Cipher(algorithms.ChaCha20(seed, b"\0" * 16), mode=None).encryptor().update(b"\0" * (8 * L))
    return np.frombuffer(stream, dtype="<u8").astype(np.uint64) & np.uint64((1 << BITS) - 1)


def pair_seed(own: X25519PrivateKey, their_public) -> bytes:
    shared = own.exchange(their_public)
    kdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"secagg pair mask round %d" % ROUND)
    return kdf.derive(shared)


def private_bytes(key: X25519PrivateKey) -> bytes:
    return key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


class Aborted(Exception):
    def __init__(self, user, holders):
        self.user, self.holders = user, holders


def run_protocol(q: np.ndarray, sent: np.ndarray, responded: np.ndarray, graph: S.RingGraph, seed: int) -> np.ndarray:
    """The round with real cryptography: the unmasked sum (uint64 (L,)) or Aborted."""
    rnd = random.Random(seed)
    data = np.random.default_rng(seed)
    t = S.threshold(graph.k)
    neighbours = graph.neighbours(np.arange(N)).tolist()
    secret = [X25519PrivateKey.from_private_bytes(data.bytes(32)) for _ in range(N)]
    public = [key.public_key() for key in secret]           # published through the server
    b = [data.bytes(32) for _ in range(N)]                   # self-mask seeds
    # each user shares its secret key and self-mask seed among its neighbours (x-coordinate: holder index + 1)
    xs = [[v + 1 for v in neighbours[u]] for u in range(N)]
    key_shares = [shamir_share(int.from_bytes(private_bytes(secret[u]), "little"), xs[u], t, rnd) for u in range(N)]
    seed_shares = [shamir_share(int.from_bytes(b[u], "little"), xs[u], t, rnd) for u in range(N)]

    def sign(u, v):
        return 1 if graph.position[u] < graph.position[v] else -1

    modulus = np.uint64((1 << BITS) - 1)
    masked = {}
    for u in np.flatnonzero(sent).tolist():
        y = q[u].astype(np.uint64) + chacha_mask(b[u])
        for v in neighbours[u]:
            p = chacha_mask(pair_seed(secret[u], public[v]))
            y = y + p if sign(u, v) > 0 else y - p
        masked[u] = y & modulus
    total = np.zeros(L, np.uint64)
    for y in masked.values():
        total += y

    # unmasking: shares come only from responding neighbours; one kind of secret per user
    for u in range(N):
        holders = [v for v in neighbours[u] if responded[v]]
        if sent[u]:
            if len(holders) < t:
                raise Aborted(int(graph.users[u]), len(holders))
            value = shamir_reconstruct({v + 1: seed_shares[u][v + 1] for v in holders})
            assert value.to_bytes(32, "little") == b[u]
            total -= chacha_mask(value.to_bytes(32, "little"))
        elif any(sent[v] for v in neighbours[u]):
            if len(holders) < t:
                raise Aborted(int(graph.users[u]), len(holders))
            value = shamir_reconstruct({v + 1: key_shares[u][v + 1] for v in holders})
            key = X25519PrivateKey.from_private_bytes(value.to_bytes(32, "little"))
            for v in neighbours[u]:
                if sent[v]:      # v added sign(v, u) PRG(s_vu): remove it
                    p = chacha_mask(pair_seed(key, public[v]))
                    total = total - p if sign(v, u) > 0 else total + p
    return total & modulus


# (dropped before sending, dropped after sending). With 8 users and 6 neighbours each (all but the one opposite on
# the ring), any 2 silent users leave everyone >= 4 responding neighbours; 3 leave some user 3 (the abort test).
PATTERNS = {
    "none": ((), ()),
    "one before, one after": ((0,), (3,)),
    "two before": ((1, 5), ()),
    "two after": ((), (4, 7)),
}


def _flags(before, after):
    sent = np.ones(N, bool)
    sent[list(before)] = False
    responded = sent.copy()
    responded[list(after)] = False
    return sent, responded


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_real_protocol_and_simulation_give_the_true_sum(pattern):
    graph = S.ring_graph(KEY, ROUND, USERS)
    assert graph.k == 6 and not graph.complete and S.threshold(graph.k) == 4
    rng = np.random.default_rng(7)
    q = rng.integers(-(2 ** 20), 2 ** 20, (N, L))
    sent, responded = _flags(*PATTERNS[pattern])
    real = run_protocol(S.mod(q, BITS), sent, responded, graph, seed=11)
    truth = q[sent].sum(axis=0)
    assert np.array_equal(S.to_signed(real, BITS), truth)
    y = S.mask(q, np.arange(N), graph, KEY, ROUND, BITS)
    simulated = S.unmask(S.modular_sum(y[sent], BITS), sent, responded, graph, KEY, ROUND, BITS)
    assert np.array_equal(simulated, real)


def test_both_abort_at_the_same_user_when_shares_are_short():
    graph = S.ring_graph(KEY, ROUND, USERS)
    q = np.random.default_rng(8).integers(0, 100, (N, L))
    # three users silent: some user has at most 3 of its 6 neighbours responding, below the threshold of 4
    sent, responded = _flags((0,), (2, 5))
    with pytest.raises(Aborted) as real:
        run_protocol(S.mod(q, BITS), sent, responded, graph, seed=12)
    y = S.mask(q, np.arange(N), graph, KEY, ROUND, BITS)
    with pytest.raises(S.ReconstructionFailed) as simulated:
        S.unmask(S.modular_sum(y[sent], BITS), sent, responded, graph, KEY, ROUND, BITS)
    assert simulated.value.user == real.value.user
    assert simulated.value.holders == real.value.holders < simulated.value.threshold == 4

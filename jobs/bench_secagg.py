"""Cost of secure aggregation with Skellam noise (ldpfed.mechanisms.secagg) on one core, per round.

For each number of users per round and drop-out rate: the client side of every user (quantize its vector by
randomized rounding, add its Skellam noise share, mask it with SecAgg+'s k + 1 streams) and the server side (add
the masked vectors of the users that sent, unmask: one stream per sender, one per (dropped user, sending neighbour)).
The vector is L entries (default 110: what ldp-ols sends at d = 10, its d x d Gram matrix M and its d-vector u,
ldpfed/algorithms/glm_ldp.py). Half of the drop-outs happen before sending, half after (the user sent, then did not
answer for shares). k is the smallest even number of neighbours >= 2 ceil(log2 n) at which the round aborts with
probability <= 1e-6 at that drop-out rate (neighbours_for_dropout); the modulus is default_bits over 1000 rounds.
The unmasked sum is checked against the exact sum of the senders' vectors and noise. Users are processed in chunks
(--chunk) so memory stays O(chunk * L). BLAS/OpenMP threads are pinned to 1 and the process to one CPU.

    python jobs/bench_secagg.py [--users 1e3 1e4 1e5] [--length 110] [--dropouts 0 0.1 0.3] [--chunk 10000]

1e6 users per round is an option (--users 1e6): about 25 s of client time at drop-outs 0 and 0.1, 2 minutes at 0.3
(k = 290 neighbours); the whole run with 1e3 .. 1e6 about 3 minutes.
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from ldpfed.mechanisms import secagg as S  # noqa: E402

SCALE = 1000.0      # quantization scale: entries in [-1, 1] become integers in [-1000, 1000]
SIGMA = 5.0         # the sum's noise std in units of the real data (before scaling)


def _pin_one_core() -> str:
    try:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[0]})
        return f"pinned to cpu {cpus[0]} (of allowed {cpus})"
    except (AttributeError, OSError) as exc:
        return f"not pinned ({exc.__class__.__name__})"


def bench(n: int, length: int, dropout: float, chunk: int, seed: int) -> dict:
    variance = (SCALE * SIGMA) ** 2
    bits = S.default_bits(n, SCALE, variance, length, rounds=1000)
    key, rnd = 0x5EC_A66 + seed, 1
    rng = np.random.default_rng(seed)
    k = S.neighbours_for_dropout(n, dropout)
    graph = S.ring_graph(key, rnd, np.arange(n), k)
    silent = rng.random(n) < dropout
    sent = ~(silent & (rng.random(n) < 0.5))             # half the silent users drop before sending
    responded = ~silent
    data_rng, noise_rng, round_rng = (np.random.default_rng([seed, i]) for i in range(3))
    masked_sums, exact = [], np.zeros(length, np.int64)
    t_quantize = t_noise = t_mask = t_sum = 0.0
    started = time.perf_counter()
    for lo in range(0, n, chunk):
        rows = np.arange(lo, min(n, lo + chunk))
        x = data_rng.uniform(-1.0, 1.0, (rows.shape[0], length))          # the users' vectors (not timed)
        t0 = time.perf_counter()
        q = S.randomized_round(SCALE * x, round_rng.random(x.shape))
        t1 = time.perf_counter()
        q += S.skellam_shares(noise_rng, rows.shape[0], length, variance / n)
        t2 = time.perf_counter()
        y = S.mask(q, rows, graph, key, rnd, bits)
        t3 = time.perf_counter()
        keep = sent[rows]
        masked_sums.append(S.modular_sum(y[keep], bits))      # the server adds what arrives
        t4 = time.perf_counter()
        exact += q[keep].sum(axis=0)
        t_quantize += t1 - t0
        t_noise += t2 - t1
        t_mask += t3 - t2
        t_sum += t4 - t3
        done = rows[-1] + 1
        if done == n or (time.perf_counter() - started) > 10 and lo // chunk % 10 == 0:
            print(f"    {done:,}/{n:,} users masked ({time.perf_counter() - started:.1f} s)", flush=True)
    t0 = time.perf_counter()
    total = S.modular_sum(np.stack(masked_sums), bits)
    result = S.unmask(total, sent, responded, graph, key, rnd, bits)
    t_unmask = time.perf_counter() - t0
    assert np.array_equal(S.to_signed(result, bits), exact), "unmasked sum differs from the exact sum"
    return dict(n=n, k=k, bits=bits, dropped=int((~sent).sum()), silent=int(silent.sum()), t_quantize=t_quantize,
                t_noise=t_noise, t_mask=t_mask, t_server=t_sum + t_unmask,
                t_client=t_quantize + t_noise + t_mask)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=float, nargs="+", default=[1e3, 1e4, 1e5])
    ap.add_argument("--length", type=int, default=110)
    ap.add_argument("--dropouts", type=float, nargs="+", default=[0.0, 0.1, 0.3])
    ap.add_argument("--chunk", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.length < 1 or args.chunk < 1 or any(u < 2 for u in args.users) or \
            any(not 0 <= d < 1 for d in args.dropouts):
        ap.error("--length, --chunk >= 1; --users >= 2; --dropouts in [0, 1)")
    pin = _pin_one_core()
    print(f"machine: os.cpu_count()={os.cpu_count()}, platform={platform.platform()}, "
          f"python={sys.version.split()[0]}, numpy={np.__version__}; {pin}")
    print(f"L={args.length}, chunk={args.chunk:,}, quantization scale {SCALE:g}, noise std {SIGMA:g} x scale")
    S.mask(np.zeros((2, 2), np.int64), np.arange(2), S.ring_graph(1, 1, np.arange(3)), 1, 1, 8)   # compile first
    S.skellam_shares(np.random.default_rng(0), 1, 1, 0.1)
    rows = []
    for users in args.users:
        for dropout in args.dropouts:
            print(f"  n={int(users):,}, dropout={dropout:g} ...", flush=True)
            rows.append((dropout, bench(int(users), args.length, dropout, args.chunk, args.seed)))
    print()
    print(f"{'users':>10s} {'drop':>5s} {'k':>4s} {'bits':>4s} {'client s':>9s} {'(round':>7s} {'noise':>6s} "
          f"{'mask)':>7s} {'us/user':>8s} {'server s':>9s} {'dropped':>8s}")
    for dropout, r in rows:
        print(f"{r['n']:>10,d} {dropout:>5.2f} {r['k']:>4d} {r['bits']:>4d} {r['t_client']:>9.3f} "
              f"{r['t_quantize']:>7.3f} {r['t_noise']:>6.3f} {r['t_mask']:>7.3f} "
              f"{r['t_client'] / r['n'] * 1e6:>8.1f} {r['t_server']:>9.3f} {r['dropped']:>8,d}")
    print("client s: all users' quantize + Skellam share + mask (one core); server s: add the arrived masked vectors "
          "and unmask; dropped: users that did not send (as many again sent but did not answer for shares)")


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""One round of secure aggregation against the same round under the central model: the target is a round of
1e6 users (ldp-ols, d = 10) with 10% drop-outs under --trust secagg within 10x the same round under --trust central,
at the default neighbourhood size.

    python jobs/bench_secagg_round.py                                # 1e3 .. 1e6 users, drop-outs 0 and 0.1
    python jobs/bench_secagg_round.py --users 1e6 --dropouts 0.1     # the target alone (about a minute)

A round is what the round engines do for it (ldpfed.engine.core): the population simulates its users (contexts,
arms, rewards: the same for both models) and encodes their messages (central: the clipped data's means; secagg: the
means weighed, scaled, rounded, plus each user's Skellam share, masked with the SecAgg+ streams of its k neighbours
and its own), the shards add them, and the server's half updates the model (central: adds its noise; secagg:
unmasks the sum, reads it, divides by the scale). Each setting is a run of two rounds in one process; the second
round is timed (the first compiles) and split into its parts: simulate (act, env step), encode (the trust model's
client side), sum, update (the server's half). Drop-outs: half before sending, half after (the user sent, then did
not answer the unmasking), shares calibrated for 1 - drop-outs - 1% of the users. BLAS threads pinned to 1; run it
with nothing else on the machine.
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402


def one_round(trust: str, users: int, dropout: float, d: int, seed: int = 0) -> dict:
    from ldpfed.algorithms import make_algorithm
    from ldpfed.config import RunConfig
    from ldpfed.envs import make_env
    from ldpfed.util.rng import derive

    options = {}
    if trust == "secagg" and dropout:
        options = {"dropout": dropout / 2, "dropout_after": dropout / 2, "min_survivors": 1.0 - dropout / 2 - 0.01}
    config = RunConfig("ldp-ols", env="linear", env_params={"d": d, "K": 10}, users=2 * users, round_size=users,
                       eps=1.0, delta=1e-6, seed=seed, trust=trust, trust_options=options)
    started = time.perf_counter()
    env = make_env(config)
    algo = make_algorithm(env, config)
    build = time.perf_counter() - started
    state = algo.initial_state(derive(seed, "init"))
    parts = {}
    for r in range(2):
        start, stop = r * users, (r + 1) * users
        u = np.arange(start, stop, dtype=np.int64)
        nature, client = derive(seed, "context", 0, r), derive(seed, "privatize", 0, r)
        t0 = time.perf_counter()
        model = algo.publish(state)
        contexts = env.contexts(u, nature)
        actions = algo.act(model, contexts, u, client)
        rewards, _ = env.step(contexts, actions, u, nature)
        t1 = time.perf_counter()
        messages, _ = algo.encode(model, contexts, actions, rewards, u, client)
        t2 = time.perf_counter()
        sums = algo.aggregate(messages, u)
        t3 = time.perf_counter()
        state = algo.update(state, sums, start, stop, derive(seed, "server", r))
        t4 = time.perf_counter()
        parts = {"simulate": t1 - t0, "encode": t2 - t1, "sum": t3 - t2, "update": t4 - t3, "total": t4 - t0}
    return {"trust": trust, "users": users, "dropout": dropout, "build_s": build, **parts,
            "bits": getattr(getattr(algo, "secagg", None), "bits", None)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=lambda t: [int(float(x)) for x in t.split(",")], default=[1000, 10_000,
                                                                                                   100_000, 1_000_000])
    parser.add_argument("--dropouts", type=lambda t: [float(x) for x in t.split(",")], default=[0.0, 0.1])
    parser.add_argument("--d", type=int, default=10)
    args = parser.parse_args(argv)
    print(f"# {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}", flush=True)
    print("| users | drop-outs | central round s | secagg round s | ratio | secagg encode s | secagg update s | "
          "bits |\n|---|---|---|---|---|---|---|---|", flush=True)
    for n in args.users:
        central = one_round("central", n, 0.0, args.d)
        for p in args.dropouts:
            sec = one_round("secagg", n, p, args.d)
            print(f"| {n:,} | {p:g} | {central['total']:.3f} | {sec['total']:.3f} | {sec['total'] / central['total']:.1f}x"
                  f" | {sec['encode']:.3f} | {sec['update']:.3f} | {sec['bits']} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

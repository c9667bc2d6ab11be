#!/usr/bin/env python3
"""Stress the server's aggregation path: exactness under load and attack, poisoning within the domain, capacity.

    python jobs/stress_server.py [--algorithm ldp-ols] [--d 10] [--K 10] [--shards 1,2,4] [--populations 32]
                                 [--users-per-message 50] [--rounds 150] [--senders 2] [--batch 8]
                                 [--max-in-flight 8] [--inject 8] [--max-seconds 300] [--layout population]
                                 [--attack out-of-domain --fraction 0.1]
    python jobs/stress_server.py --attack in-domain [--fraction 0.001,0.003,0.01,0.03,0.1] [--plot out.png]
                                 [--trust central|secagg [--boost 1,10,100]]
    python jobs/stress_server.py --trust secagg [--round-users 1e3,1e4,1e5,1e6]   (secure aggregation's cost)
    python jobs/stress_server.py --stragglers 0,0.25,0.5 [--deadlines none,0.5] [--straggle-s 1.0]
                                 [--users 40000 --round-size 2000 --populations 8 --senders 4] [--late fold|drop]
    python jobs/stress_server.py --capacity [--algorithm ldp-sgd --users-per-message 1250 --populations 8]
                                 [--shards 1,2,4] [--levels 25,50,75,100,125] [--level-seconds 4]
                                 [--batch 256] [--linger-ms 20] [--max-in-flight 2] [--probe-rounds 8000]
                                 [--shufflers 1,2 [--round-users 10000]]   (the shuffler stage too)
    (--capacity --shards '' --shufflers 1,2: the shuffler stage only)
    add --no-domain-checks to any of them to measure what the shards' domain checks cost (that measurement only)

Three jobs, each a module of ldpfed.stress (its docstring says what is measured and how):
  exactness (default, and --attack out-of-domain): real messages sent as fast as possible to S shards, with
      duplicates, corrupted and out-of-domain copies: every round's aggregate equal to the single-process
      recomputation, every message counted once, exactly the bad ones rejected;
  --attack in-domain: a fraction of the users poison within the domain; every message accepted; how far the
      estimate and the regret move (the poisoning table);
  --attack in-domain --trust central|secagg: the same under a trusted server (its shards check each mean against
      the twin's domain) or secure aggregation (its shards see masked residues only: an attacker adds any vector,
      here --boost times the largest pull the central shard lets through, and nothing is rejected);
  --trust secagg (no attack): the cost of a round under secure aggregation against the same round under central
      (jobs/bench_secagg_round.py's table, at --round-users);
  --stragglers: real rounds on the Ray engine with a share of the population actors slow, against a round
      deadline: rounds/s and the fraction of messages folded later or never reaching the server
      (ldpfed/stress/stragglers.py);
  --capacity: an open-loop load generator; per S, the closed-loop capacity then levels at percents of it (the
      capacity table of docs/figures.md), every aggregate checked bit for bit. With --shufflers, the shuffler stage
      of the shuffle trust model too: messages/s through S shuffler actors and the latency of a share (closed
      loop, --level-seconds per S; ldpfed/stress/shuffler.py).
Loopback only: it starts a local Ray (or uses RAY_ADDRESS), bounded in count and in time.
"""
from __future__ import annotations

import argparse
import json
import sys


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithm", default=None,
                        help="default ldp-ols (exactness), ldp-sgd (capacity); in-domain: ldp-sgd,ldp-ols,sw-klucb-cf")
    parser.add_argument("--d", type=int, default=10)
    parser.add_argument("--K", type=int, default=10)
    parser.add_argument("--shards", default="1,2,4", help="comma-separated shard counts")
    parser.add_argument("--populations", type=int, default=None, help="default 32 (exactness), 8 (capacity)")
    parser.add_argument("--users-per-message", type=int, default=None,
                        help="users per (population, round) message; default 50 (exactness), 1250 (capacity)")
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--senders", type=int, default=2, help="sender (population) actors")
    parser.add_argument("--batch", type=int, default=None,
                        help="messages per fold call (default 8); capacity: at most this many (default 256)")
    parser.add_argument("--layout", default="population", choices=["population", "block"],
                        help="population: whole messages to shard p %% S; block: every message cut by key ranges")
    parser.add_argument("--max-in-flight", type=int, default=None,
                        help="fold calls outstanding per sender (capacity: per sender and shard); default 8 (2)")
    parser.add_argument("--linger-ms", type=float, default=20.0,
                        help="capacity: a call leaves when --batch messages are due or its oldest waited this long")
    parser.add_argument("--inject", type=int, default=8, help="duplicates and corrupted messages per sender")
    parser.add_argument("--attack", choices=["out-of-domain", "in-domain"], default=None)
    parser.add_argument("--fraction", default=None, help="out-of-domain: bad copies per message (default 0.1); "
                        "in-domain: comma-separated fractions of poisoning users (default 0.001,0.003,0.01,0.03,0.1)")
    parser.add_argument("--users", type=int, default=100_000, help="in-domain: users per run")
    parser.add_argument("--round-size", type=int, default=100, help="in-domain: users per round")
    parser.add_argument("--seeds", type=int, default=3, help="in-domain: seeds per fraction (figures are means)")
    parser.add_argument("--plot", default=None, help="in-domain: write the PNG plot here")
    parser.add_argument("--trust", default="local", help="in-domain: the trust model (local, central, secagg); "
                        "without --attack, secagg: the cost of its rounds")
    parser.add_argument("--boost", default="1,10,100", help="in-domain under secagg: comma-separated multiples of "
                        "the pull a central shard lets through")
    parser.add_argument("--capacity", action="store_true", help="the open-loop capacity curve")
    parser.add_argument("--levels", default="25,50,75,100,125", help="capacity: percent of the measured capacity")
    parser.add_argument("--level-seconds", type=float, default=4.0, help="capacity: seconds of load per level")
    parser.add_argument("--shufflers", default="", help="capacity: also the shuffler stage at these comma-separated "
                        "numbers of shuffler actors (trust shuffle)")
    parser.add_argument("--round-users", type=lambda t: [int(float(x)) for x in t.split(",")], default=[10_000],
                        help="shuffler stage: users per round (split among --populations and the shufflers)")
    parser.add_argument("--probe-rounds", type=int, default=8000,
                        help="capacity: rounds of the closed-loop probe (8000 x 10,000 users by default)")
    parser.add_argument("--no-domain-checks", action="store_true",
                        help="turn the shards' domain checks off: ONLY to measure what they cost")
    parser.add_argument("--stragglers", default=None, help="comma-separated shares of straggling population actors")
    parser.add_argument("--deadlines", default="none,0.5", help="stragglers: comma-separated round deadlines in "
                                                               "seconds ('none': wait for every actor)")
    parser.add_argument("--straggle-s", type=float, default=1.0, help="stragglers: a straggler's delay per round")
    parser.add_argument("--late", choices=["fold", "drop"], default="fold", help="stragglers: late messages")
    parser.add_argument("--max-seconds", type=float, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="write the report rows here")
    return parser.parse_args(argv)


def log(line: str) -> None:
    print(line, flush=True)


def in_domain(args):
    from ldpfed.stress.poisoning import IN_DOMAIN, plot_in_domain, run_in_domain

    algorithms = args.algorithm.split(",") if args.algorithm else list(IN_DOMAIN)
    fractions = [float(x) for x in (args.fraction or "0.001,0.003,0.01,0.03,0.1").split(",")]
    print(f"stress: in-domain poisoning of {algorithms}, {args.users:,} users, rounds of {args.round_size}, "
          f"fractions {fractions}", flush=True)
    seeds = list(range(args.seed, args.seed + args.seeds))
    boosts = [float(b) for b in args.boost.split(",")] if args.trust == "secagg" else [1.0]
    ok, rows = True, []
    for boost in boosts:
        if args.trust != "local":
            print(f"stress: --trust {args.trust}" + (f", attack boost {boost:g}" if args.trust == "secagg" else ""),
                  flush=True)
        got_ok, got = run_in_domain(algorithms, fractions, args.users, args.round_size, seeds, log=log,
                                    trust=args.trust, boost=boost)
        ok, rows = ok and got_ok, rows + [{**row, "trust": args.trust, "boost": boost} for row in got]
    if args.plot:
        plot_in_domain(rows, args.plot)
        print(f"stress: plot written to {args.plot}")
    return ok, rows


def stragglers(args):
    from ldpfed.config import RunConfig
    from ldpfed.stress.stragglers import straggler_rows

    shares = [float(x) for x in args.stragglers.split(",")]
    deadlines = [None if x.strip() == "none" else float(x) for x in args.deadlines.split(",")]
    users = args.users if args.users != 100_000 else 40_000
    round_size = args.round_size if args.round_size != 100 else 2_000
    config = RunConfig(args.algorithm or "ldp-ols", users=users, round_size=round_size,
                       populations=args.populations or 8, seed=args.seed)
    print(f"stress: stragglers: {config.algorithm}, {users:,} users in {config.rounds} rounds of {round_size:,}, "
          f"{args.senders} population actors", flush=True)
    rows = straggler_rows(config, args.senders, shares, deadlines, args.straggle_s, args.late, log=log)
    print("| stragglers | deadline | rounds/s | late, folded later | never reached the server |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['stragglers']:.0%} ({row['straggle_s']:g} s) | {row['deadline_s'] or 'none'} | "
              f"{row['rounds_per_s']:.2f} | {row['late_folded']:.1%} | {row['never_reached']:.1%} |")
    return True, rows


def capacity(args, shard_counts, checks):
    from ldpfed.stress.capacity import capacity_table, run_capacity
    from ldpfed.stress.shard import loadavg

    algorithm = args.algorithm or "ldp-sgd"
    P, upm = args.populations or 8, args.users_per_message or 1250
    batch, in_flight = args.batch or 256, args.max_in_flight or 2
    print(f"stress: capacity of {algorithm} d={args.d} per-user messages, {P} populations x {upm} users "
          f"per message (a round of {P * upm:,} users), {args.senders} senders, up to {batch} messages "
          f"per call (linger {args.linger_ms:g} ms), {in_flight} calls in flight per sender and shard, "
          f"domain checks {'on' if checks else 'OFF'}; load average {loadavg()}", flush=True)
    ok, rows = run_capacity(algorithm, args.d, args.K, shard_counts, P, upm, args.senders, batch, in_flight,
                            [float(x) for x in args.levels.split(",") if x.strip()], args.level_seconds,
                            probe_rounds=args.probe_rounds, linger_ms=args.linger_ms, check_domains=checks,
                            seed=args.seed, log=log)
    print("\n".join(["stress: the capacity table (docs/figures.md):"] + capacity_table(rows)), flush=True)
    return ok, rows


def shuffler_stage(args):
    from ldpfed.stress.shard import loadavg
    from ldpfed.stress.shuffler import measure_shufflers, shuffler_table

    algorithm = args.algorithm or "ldp-sgd"
    P, in_flight = args.populations or 8, args.max_in_flight or 2
    counts = [int(x) for x in args.shufflers.split(",") if x.strip()]
    round_users = args.round_users[0]
    print(f"stress: shuffler stage of {algorithm} d={args.d} under --trust shuffle, rounds of {round_users:,} "
          f"users from {P} populations, S in {counts}, {in_flight} calls in flight per shuffler, "
          f"{args.level_seconds:g} s each; load average {loadavg()}", flush=True)
    rows = [measure_shufflers(algorithm, args.d, args.K, S, round_users, P, args.level_seconds, in_flight,
                              seed=args.seed, log=log) for S in counts]
    print("\n".join(["stress: the shuffler stage:"] + shuffler_table(rows)), flush=True)
    return True, rows


def exactness(args, shard_counts, checks):
    from ldpfed.algorithms import REGISTRY
    from ldpfed.stress.exactness import run_stress

    algorithm = args.algorithm or ("ldp-ols" if "ldp-ols" in REGISTRY else "uniform")
    P, upm = args.populations or 32, args.users_per_message or 50
    batch, in_flight = args.batch or 8, args.max_in_flight or 8
    fraction = float(args.fraction or 0.1) if args.attack == "out-of-domain" else 0.0
    print(f"stress: {algorithm} d={args.d} K={args.K}, {P} populations x {upm} users x {args.rounds} "
          f"rounds = {P * upm * args.rounds:,} per-user messages per shard count; {args.senders} senders, "
          f"batch {batch}, {in_flight} calls in flight each; out-of-domain copies: {fraction:g} per "
          f"message; domain checks {'on' if checks else 'OFF'}", flush=True)
    return run_stress(algorithm, args.d, args.K, shard_counts, P, upm, args.rounds, args.senders, batch, in_flight,
                      args.inject, args.max_seconds, args.seed, log=log, layout=args.layout,
                      attack_fraction=fraction, check_domains=checks)


def main(argv=None) -> int:
    args = parse_args(argv)
    shard_counts = [int(x) for x in args.shards.split(",") if x.strip()]
    checks = not args.no_domain_checks
    if args.stragglers is not None:
        ok, rows = stragglers(args)
    elif args.attack == "in-domain":
        ok, rows = in_domain(args)
    elif args.trust == "secagg":
        import bench_secagg_round

        return bench_secagg_round.main(["--users", ",".join(str(n) for n in args.round_users)])
    else:
        import ray

        from ldpfed.stress.shard import start_ray

        started = start_ray()
        try:
            if not args.capacity:
                ok, rows = exactness(args, shard_counts, checks)
            else:
                ok, rows = capacity(args, shard_counts, checks) if shard_counts else (True, [])
                if args.shufflers.strip():
                    stage_ok, stage_rows = shuffler_stage(args)
                    ok, rows = ok and stage_ok, rows + stage_rows
        finally:
            if started:
                ray.shutdown()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2, default=str)
    print("stress: OK" if ok else "stress: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

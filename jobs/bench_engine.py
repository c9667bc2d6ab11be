#!/usr/bin/env python3
"""Benchmark the Ray engine against the single-process floor, and show its memory does not grow with users.

    python jobs/bench_engine.py                      # 1e6 users of ldp-sgd and ldp-ols (d=10, K=10)
    python jobs/bench_engine.py --users 10000000     # ldp-sgd at 1e6 then 1e7 users: peak RSS at both
    python jobs/bench_engine.py --before /tmp/before # the floor of an older checkout against this one's
    python jobs/bench_engine.py --lockstep           # the work's CPU in 2 plain processes, round by round (no Ray)
    python jobs/bench_engine.py --round-size 100000 --rounds 30     # the speed comparison at B = 1e5, 30 rounds
    python jobs/bench_engine.py --populations 2,8,16                # the same for each number of populations

Default mode: for each algorithm, in the same run, on the same config:
  * baseline: `run_local` with the contexts drawn as before ldpfed/envs/sphere.py (numpy normals, then a norm):
    the single-process figure the compiled sampler is compared with (--no-baseline skips it);
  * floor: `run_local` (one process, same round size and populations), users/s of wall and of CPU time;
  * floor and Ray alternate --repeat times (default 3); medians are printed, and every pair's Ray/floor;
  * one empty Ray actor call: its round trip and its CPU in the caller and in the actor (Ray's own cost here);
  * Ray: `run_ray` (population actors + shards + coordinator), users/s of the run (after an untimed two-round
    warm-up run that starts the pooled actor processes and loads their compiled kernels; its time is printed),
    its ratio to the floor and to twice the floor (2 cores), and whether the two results are identical (they must be);
    one row per transport (--transport, default both: "ray", the rounds as Ray calls; "direct", the rounds over
    sockets between the same actors), each run right after the same floor run;
  * privatizers alone (jobs/bench_privatize.py's loop, same d, 2e5 users): the cost floor of the client half;
  * CPU per round: the floor's (all the work in one process) against Ray's population actors, shards and driver
    (every thread of each process): on a 2-CPU machine, what Ray adds to the work bounds its speed.

How many populations a round is split into (--populations, default 8) matters beside the transport: each one is a
message for the shards to check, and a population's arrays (its users' contexts and messages) are as large as its
users. When they outgrow the caches, two processes running them at once slow each other down: `--lockstep` measures
that, with no Ray, and prints the bound it puts on any 2-process run.

--users above 1e6: ldp-sgd through Ray at 1e6 users, then at --users, in the same Ray session (the same actor
processes), printing after each the peak RSS of the driver, the population actors and the shards. Peak RSS only
rises, so equal peaks after 1e6 and after 1e7 users mean the extra 9e6 users needed no extra memory; the per-round
table (one row per round) is the only thing that grows, with rounds.
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import numpy as np
import pandas as pd

from ldpfed.algorithms import REGISTRY, make_algorithm
from ldpfed.config import RunConfig
from ldpfed.engine import run_local
from ldpfed.engine.core import population_users, round_bounds, simulate_population
from ldpfed.engine.ray_engine import ensure_ray, run_ray
from ldpfed.envs import make_env
from ldpfed.envs.base import unit_sphere
from ldpfed.envs.glm import GLMContextual
from ldpfed.util.memory import keep_freed_memory
from ldpfed.util.rng import derive


# The speed targets of the Ray engine: its users/s over the single-process floor's, by round size B, for ldp-sgd
# and ldp-ols on 2 cores with the machine otherwise idle (B = 1e4: 1.3x; B = 1e5: 1.7x)
SPEED_TARGETS = {10_000: 1.3, 100_000: 1.7}


def mb(x: float) -> str:
    return f"{x / 2**20:,.0f} MB"


def config_for(algorithm: str, users: int, args) -> RunConfig:
    return RunConfig(algorithm, env="linear", users=users, round_size=args.round_size, populations=args.populations,
                     eps=1.0, delta=0.01, seed=args.seed, env_params={"d": args.d, "K": args.K})


def ray_options(args, transport: str | None = None) -> dict:
    """The Ray engine's options of this job (transport None: the engine's default)."""
    return {"actors": args.actors, "shards": args.shards, "mode": args.mode, "transport": transport}


def numpy_contexts(self, users, rng):
    """The GLM envs' context drawing before the compiled sampler (numpy normals divided by their norm): the
    baseline of the single-process figure."""
    n = len(users)
    if self.gaussian_contexts:
        return rng.standard_normal((n, self.d) if self.multi else (n, self.K, self.d))
    return unit_sphere(rng, n if self.multi else (n, self.K), self.d)


def timed_local(config):
    w0, c0 = time.perf_counter(), time.process_time()
    result = run_local(config)
    return result, config.users / (time.perf_counter() - w0), config.users / (time.process_time() - c0)


# The floor of a checkout of this repository, in a fresh subprocess with its directory first on sys.path: its CPU
# users/s on the same config, after an untimed two-round run (kernels loaded). --before runs both checkouts this way,
# so neither is measured in a process that has imported Ray and run other benchmarks (that alone cost ~10% of
# ldp-ols's floor when measured).
_BEFORE = """
import sys, time
sys.path.insert(0, sys.argv[1])
from ldpfed.config import RunConfig
from ldpfed.engine import run_local
algorithm, users, B, P, d, K, seed = sys.argv[2], *map(int, sys.argv[3:9])
config = lambda n: RunConfig(algorithm, env="linear", users=n, round_size=B, populations=P, eps=1.0, delta=0.01,
                             seed=seed, env_params={"d": d, "K": K})
run_local(config(2 * B))
c0 = time.process_time()
run_local(config(users))
print(users / (time.process_time() - c0))
"""


def floor_in(directory: Path, algorithm: str, args) -> float:
    """CPU users/s of run_local in the checkout at `directory` (this one, or an older commit), on this benchmark's
    config, in a fresh process."""
    done = subprocess.run([sys.executable, "-c", _BEFORE, str(directory), algorithm, str(args.users),
                           str(args.round_size), str(args.populations), str(args.d), str(args.K), str(args.seed)],
                          capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def compare_before(args) -> int:
    """--before DIR: the floor of DIR's code and of this code, alternating --repeat times (CPU users/s, medians)."""
    print(f"floor (run_local, CPU users/s) of {args.before} against this checkout, alternating {args.repeat} times; "
          f"{args.users:,} users, d = {args.d}, K = {args.K}, B = {args.round_size}, {args.populations} populations")
    here = Path(__file__).resolve().parent.parent
    for algorithm in args.algorithms:
        pairs = [(floor_in(args.before, algorithm, args), floor_in(here, algorithm, args)) for _ in range(args.repeat)]
        before, now = (float(np.median(v)) for v in zip(*pairs))
        ratios = ", ".join(f"{b / a:.2f}" for a, b in pairs)
        print(f"{algorithm:<9} before {before:>10,.0f}   now {now:>10,.0f}   now/before {now / before:.2f} "
              f"(each pair: {ratios})", flush=True)
    return 0


def _lockstep_worker(conn, config, populations) -> None:
    """A plain process (no Ray) that simulates `populations` of each round it is sent; reports its CPU seconds."""
    env = make_env(config)
    algo = make_algorithm(env, config)
    keep_freed_memory()
    model = algo.publish(algo.initial_state(derive(config.seed, "init")))
    cpu = 0.0
    while (r := conn.recv()) is not None:
        c0 = time.process_time()
        start, stop = round_bounds(r, config.round_size, config.users)
        for p in populations:
            simulate_population(algo, env, model, config.seed, r, p, population_users(start, stop, p,
                                                                                       config.populations))
        if r >= 2:      # rounds 0 and 1 load the compiled kernels (numba's cache): not counted
            cpu += time.process_time() - c0
        conn.send(r)
    conn.send(cpu)


def lockstep(args) -> int:
    """--lockstep: is the population actors' extra CPU Ray's? The same populations in 2 plain processes (pipes, no
    Ray), one round at a time: both simulate their half, then both wait (as actors wait for the server's fold and the
    next model; here 4 ms of sleep), against the single process. Per round: CPU of the work in each setting, and
    the bound that puts on any 2-process run (Ray or not): 2 x one process's CPU / the 2 processes' CPU."""
    for algorithm in args.algorithms:
        for args.populations in args.population_counts:
            _lockstep(args, algorithm)
    return 0


def _lockstep(args, algorithm) -> None:
    import multiprocessing

    config = config_for(algorithm, args.users, args)
    run_local(config_for(algorithm, 2 * args.round_size, args))
    floor_cpu = timed_local(config)[2]
    pipes, workers = [], []
    for half in range(2):
        ours, theirs = multiprocessing.Pipe()
        worker = multiprocessing.Process(target=_lockstep_worker,
                                         args=(theirs, config, list(range(half, config.populations, 2))))
        worker.start()
        pipes.append(ours)
        workers.append(worker)
    for r in range(config.rounds):
        for pipe in pipes:
            pipe.send(r)
        for pipe in pipes:
            pipe.recv()
        time.sleep(0.004)
    for pipe in pipes:
        pipe.send(None)
    cpu = sum(pipe.recv() for pipe in pipes)
    for worker in workers:
        worker.join()
    one, two = 1e3 * config.users / floor_cpu / config.rounds, 1e3 * cpu / (config.rounds - 2)
    print(f"{algorithm} P = {config.populations}: CPU per round of the work: one process {one:.1f} ms; 2 plain "
          f"processes in lockstep rounds {two:.1f} ms in all ({config.rounds} rounds of {config.round_size:,} users): "
          f"{two / one - 1:+.0%}, so 2 processes run at most {2 * one / two:.2f}x one", flush=True)


def privatizer_floor(d: int) -> dict:
    """Users/s (CPU) of the privatizers alone, jobs/bench_privatize.py's loop on 2e5 users of dimension d."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_privatize", Path(__file__).with_name("bench_privatize.py"))
    bench_privatize = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_privatize)

    bench_privatize.bench(20_000, 10_000, d, 0)     # untimed: loads the compiled kernels (numba's cache)
    best = bench_privatize.bench(200_000, 10_000, d, 0)
    return {"ldp-ols": best["users"] / best["cpu_ols"], "ldp-sgd": best["users"] / best["cpu_sgd"]}


class _Empty:
    """An actor that does nothing: what one Ray call costs on this machine, with no work in it."""

    def noop(self, *args):
        return None

    def cpu(self) -> float:
        return time.process_time()


def ray_call_cost(calls: int = 300) -> tuple[float, float, float]:
    """(caller CPU ms, actor CPU ms, wall ms) per empty actor call with a d = 10 model argument, in sequence."""
    import numpy as np
    import ray

    actor = ray.remote(_Empty).options(num_cpus=0).remote()
    model = {"theta": np.zeros(10)}
    for _ in range(20):
        ray.get(actor.noop.remote(model))
    actor_cpu, caller_cpu, wall = ray.get(actor.cpu.remote()), time.process_time(), time.perf_counter()
    for _ in range(calls):
        ray.get(actor.noop.remote(model))
    wall, caller_cpu = time.perf_counter() - wall, time.process_time() - caller_cpu
    actor_cpu = ray.get(actor.cpu.remote()) - actor_cpu
    ray.kill(actor)
    return 1e3 * caller_cpu / calls, 1e3 * actor_cpu / calls, 1e3 * wall / calls


def floor_vs_ray(args) -> int:
    ok = True
    caller_ms, actor_ms, call_ms = ray_call_cost()
    print(f"one empty Ray actor call (d = 10 model argument): {call_ms:.2f} ms round trip, CPU {caller_ms:.2f} ms in "
          f"the caller + {actor_ms:.2f} ms in the actor (transport ray: a round makes {args.actors} population calls "
          f"and one per shard; transport direct: none, the rounds go over sockets)", flush=True)
    floor_privatize = privatizer_floor(args.d)
    print(f"{'algorithm':<9} {'transport':<9} {'users':>10} {'B':>6} {'P':>3}  {'baseline':>9} {'(cpu)':>9}  "
          f"{'floor':>9} {'(cpu)':>9} {'x base':>6}  {'ray':>9} {'/floor':>6} {'/2floor':>7}  {'ray wall':>9}  "
          f"{'privatize cpu':>13}  same")
    for algorithm in args.algorithms:
        for args.populations in args.population_counts:
            ok = _floor_vs_ray(args, algorithm, floor_privatize) and ok
    return 0 if ok else 1


def _floor_vs_ray(args, algorithm, floor_privatize) -> bool:
    """The rows of one algorithm at args.populations; False if a Ray run's table differs from the floor's."""
    ok = True
    config = config_for(algorithm, args.users, args)
    # Untimed: two rounds through Ray and run_local first, so the pooled actor processes have started, and every
    # process has imported ldpfed and loaded its compiled kernels (numba: ~1.4 s per process, once), before the
    # measured runs, whose rates would otherwise count that one-off cost in the first runs only.
    t0 = time.perf_counter()
    for transport in args.transports:
        run_ray(config_for(algorithm, 2 * args.round_size, args), **ray_options(args, transport))
    warm_up = time.perf_counter() - t0
    run_local(config_for(algorithm, 2 * args.round_size, args))     # and this process's kernels
    base = base_cpu = float("nan")
    if args.baseline:
        with mock.patch.object(GLMContextual, "contexts", numpy_contexts):
            _, base, base_cpu = timed_local(config)
    # the floor and each transport alternate, `repeat` times: this VM's speed drifts by tens of percent from
    # minute to minute, so each Ray run is compared with the floor run just before it, and the medians are printed
    runs = {transport: [] for transport in args.transports}
    for _ in range(args.repeat):
        local, floor_wall, floor_cpu = timed_local(config)
        for transport in args.transports:
            t0 = time.perf_counter()
            remote = run_ray(config, **ray_options(args, transport))
            wall = time.perf_counter() - t0
            same = local.table.equals(remote.table)
            ok = ok and same
            runs[transport].append({"floor": local.summary["users_per_s"], "floor_cpu": floor_cpu,
                                    "rate": remote.summary["users_per_s"], "wall": config.users / wall,
                                    "same": same, "summary": remote.summary})
    for transport, pairs in runs.items():
        ok = report(algorithm, transport, config, pairs, base, base_cpu, floor_privatize, warm_up, args) and ok
    return ok


def report(algorithm, transport, config, pairs, base, base_cpu, floor_privatize, warm_up, args) -> bool:
    """The rows of one algorithm and transport: the medians of its runs against the floor runs just before them."""
    median = {key: float(np.median([pair[key] for pair in pairs])) for key in ("floor", "floor_cpu", "rate", "wall")}
    ratios = sorted(pair["rate"] / pair["floor"] for pair in pairs)
    ratio = float(np.median(ratios))
    floor, floor_cpu, rate = median["floor"], median["floor_cpu"], median["rate"]
    same = all(pair["same"] for pair in pairs)
    print(f"{algorithm:<9} {transport:<9} {config.users:>10,} {config.round_size:>6} {config.populations:>3}  "
          f"{base:>9,.0f} {base_cpu:>9,.0f}  {floor:>9,.0f} {floor_cpu:>9,.0f} {floor / base:>6.2f}  {rate:>9,.0f} "
          f"{ratio:>6.2f} {ratio / 2:>7.2f}  {median['wall']:>9,.0f}  "
          f"{floor_privatize.get(algorithm, float('nan')):>13,.0f}  {'yes' if same else 'NO'}", flush=True)
    print(f"          {args.repeat} alternating runs each (medians above); Ray/floor of each pair: "
          f"{', '.join(f'{r:.2f}' for r in ratios)}", flush=True)
    s = pairs[len(pairs) // 2]["summary"]
    print(f"          ray: {s['actors']} actors, {s['shards']} shards, {s['nodes']} node(s), {s['mode']}, "
          f"{s['messages_per_s']:,.0f} user messages/s, fold p50 {s['fold_latency_p50_ms']:.3f} ms "
          f"p99 {s['fold_latency_p99_ms']:.3f} ms, {s['rejected_messages']} rejected; peak RSS driver "
          f"{mb(s['peak_rss_driver'])}, populations {mb(s['peak_rss_populations'])}, shards "
          f"{mb(s['peak_rss_shards'])}; 2-core efficiency target Ray/(2 floor) >= 2/3: "
          f"{'met' if ratio >= 4 / 3 else 'NOT met'}; "
          f"untimed Ray warm-up (2 rounds per transport; actor start-up, kernels loading) {warm_up:.1f} s", flush=True)
    rounds = config.rounds
    work_ms = 1e3 * config.users / floor_cpu / rounds
    ray_ms = 1e3 * (s['cpu_s_populations'] + s['cpu_s_shards'] + s['cpu_s_driver']) / rounds
    print(f"          CPU per round: floor {work_ms:.1f} ms (all the work, one "
          f"process); Ray: population actors {1e3 * s['cpu_s_populations'] / rounds:.1f} ms in all, shards "
          f"{1e3 * s['cpu_s_shards'] / rounds:.1f} ms, driver {1e3 * s['cpu_s_driver'] / rounds:.1f} ms; "
          f"wall {1e3 * config.users / rate / rounds:.1f} ms per round on {os.cpu_count()} CPUs", flush=True)
    # Ray cannot beat what its CPU allows: with every CPU busy all the time, a round takes ray_ms / CPUs
    bound = os.cpu_count() * work_ms / ray_ms
    target = SPEED_TARGETS.get(config.round_size)
    verdict = (f"; speed target at B = {config.round_size:,} (2 cores, idle): Ray/floor >= {target} "
               f"{'met' if ratio >= target else 'NOT met'}" if target else "")
    print(f"          CPU bound: with all {os.cpu_count()} CPUs busy every round, Ray/floor <= {bound:.2f} "
          f"(= CPUs x floor CPU / Ray's CPU per round); measured {ratio:.2f} ({ratio / bound:.0%} of the bound)"
          f"{verdict}", flush=True)
    return same


def memory(args) -> int:
    algorithm = "ldp-sgd" if "ldp-sgd" in REGISTRY else args.algorithms[0]
    rows = []
    for users in (10**6, args.users):
        config = config_for(algorithm, users, args)
        result = run_ray(config, **ray_options(args))
        s = result.summary
        rows.append({"users": users, "rounds": config.rounds, "users_per_s": s["users_per_s"],
                     "peak_rss_driver": s["peak_rss_driver"], "peak_rss_populations": s["peak_rss_populations"],
                     "peak_rss_shards": s["peak_rss_shards"], "final_regret": s["final_regret"]})
        print(f"{algorithm} {users:>12,} users ({config.rounds:,} rounds): {s['users_per_s']:,.0f} users/s; peak RSS "
              f"driver {mb(s['peak_rss_driver'])}, population actors {mb(s['peak_rss_populations'])}, shards "
              f"{mb(s['peak_rss_shards'])}", flush=True)
    first, last = rows[0], rows[-1]
    growth = max(last[k] - first[k] for k in ("peak_rss_driver", "peak_rss_populations", "peak_rss_shards"))
    factor = last["users"] / first["users"]
    print(f"peak RSS growth from {first['users']:,} to {last['users']:,} users ({factor:.0f}x): {mb(growth)} "
          f"(largest over driver, population actors, shards)")
    # Bounded: anything beyond a few MB per million extra users would be per-user state.
    bounded = growth <= 64 * 2**20
    print("memory does not grow with users" if bounded else "memory GROWS with users")
    return 0 if bounded else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=lambda x: int(float(x)), default=10**6)
    parser.add_argument("--algorithms", default="ldp-sgd,ldp-ols")
    parser.add_argument("--d", type=int, default=10)
    parser.add_argument("--K", type=int, default=10)
    parser.add_argument("--round-size", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=None,
                        help="the speed comparison on this many rounds (users = rounds x round size, any number; "
                             "--users above 1e6 alone runs the memory check instead)")
    parser.add_argument("--populations", default="8",
                        help="populations per round; a comma list runs each (the speed comparison and --lockstep)")
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--mode", default="pre-aggregated", choices=["pre-aggregated", "per-user"])
    parser.add_argument("--transport", default="ray,direct",
                        help="the Ray engine's transports to run, in the same run (RayBackend: ray, direct)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3, help="alternating floor and Ray runs (medians printed)")
    parser.add_argument("--before", type=Path, default=None,
                        help="a checkout of an older commit: compare its single-process floor with this one's "
                             "(e.g. git worktree add /tmp/before f2de3d7^, the code before the compiled context sampler)")
    parser.add_argument("--lockstep", action="store_true",
                        help="the work's CPU in 2 plain processes run round by round (no Ray) against one process")
    parser.add_argument("--no-baseline", dest="baseline", action="store_false",
                        help="skip the single-process run with the previous (numpy) context drawing")
    args = parser.parse_args(argv)
    args.algorithms = [a for a in args.algorithms.split(",") if a]
    args.transports = [t for t in args.transport.split(",") if t]
    args.population_counts = [int(p) for p in args.populations.split(",") if p]
    args.populations = args.population_counts[0]
    missing = [a for a in args.algorithms if a not in REGISTRY]
    if missing:
        print(f"not registered (yet): {missing}; known: {sorted(REGISTRY)}", file=sys.stderr)
        return 2
    started = ensure_ray(None, log_to_driver=False)
    try:
        import ray

        print(f"Ray {ray.__version__}, {int(ray.cluster_resources().get('CPU', 0))} CPUs, "
              f"{len([n for n in ray.nodes() if n['Alive']])} node(s); machine: {os.cpu_count()} CPUs, "
              f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, "
              f"{platform.machine()}, load average {'%.1f %.1f %.1f' % os.getloadavg()}", flush=True)
        if args.before is not None:
            return compare_before(args)
        if args.lockstep:
            return lockstep(args)
        if args.rounds is not None:
            args.users = args.rounds * args.round_size
            return floor_vs_ray(args)
        return memory(args) if args.users > 10**6 else floor_vs_ray(args)
    finally:
        if started:
            ray.shutdown()


if __name__ == "__main__":
    pd.set_option("display.width", 160)
    sys.exit(main())

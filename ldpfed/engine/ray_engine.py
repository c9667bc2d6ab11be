"""The federated engine on Ray: population actors, server shard actors, and the driver as coordinator.

One round:
1. The coordinator publishes the model with ONE `ray.put`; every population actor reads it zero-copy.
2. Each population actor simulates all the users of its logical populations for the round in one call
   (`simulate_population`, vectorized), and returns one object per server shard (the messages for that shard's
   keys, see `ray_shard`) plus the simulation metrics (regret, counters) as a separate object: metrics never go
   to the server.
3. Right away, the coordinator hands the object references (not the data) to each shard's `fold_round`; Ray
   moves each object from its actor to the shard when it is ready, and the shard validates and folds the messages
   (idempotent per (population, round), in population order) and returns the round's totals for its keys.
4. The coordinator reassembles the aggregate from the shards' totals, runs `algo.update` (the server half),
   records the round (`RoundRecorder`) and reports progress.
Per round: one `ray.put`, one call per population actor, one call per shard; the driver never touches messages.

The result equals `run_local`'s for the same config, whatever the number of actors, shards or nodes: the same
derived random streams are used per (population, round), regret and metrics are added in population order, and
every element of the aggregate is summed in population order (by the one shard that owns it, or, in per-user
mode's "population" layout, by the coordinator from the shards' per-population sums; see `ray_shard`).
Memory does not grow with the number of users: at most one round's objects are alive at a time, and the shards
keep one round's totals.
"""
from __future__ import annotations

import os
import time

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ldpfed.algorithms import make_algorithm
from ldpfed.engine.core import RoundRecorder, combine_populations, population_users, simulate_population
from ldpfed.engine.ray_security import disable_metrics_export, enable_token_auth
from ldpfed.engine.ray_shard import MODES, LatencyHistogram, ShardCore, current_rss_bytes, make_plan, peak_rss_bytes
from ldpfed.envs import make_env
from ldpfed.errors import ConfigError
from ldpfed.rng import derive


class PopulationActor:
    """Hosts a fixed set of logical populations; builds its env and algorithm (client half) once per run.

    An actor process can be reused by the next run in the same Ray session (`configure` replaces everything):
    starting a Python worker that imports numpy, scipy and pandas costs seconds on a busy machine.
    """

    def __init__(self, config=None, populations=(), plan=None):
        if config is not None:
            self.configure(config, populations, plan)

    def configure(self, config, populations: list[int], plan) -> str:
        self.config, self.populations, self.plan = config, list(populations), plan
        self.env = make_env(config)
        self.algo = make_algorithm(self.env, config)
        self.pre_aggregate = plan.mode == "pre-aggregated"
        self.shards = plan.shards
        return self.node()

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def run_round(self, model, round_index: int, start: int, stop: int):
        """All users of this actor's populations for one round: (*one object per shard, metrics)."""
        config, plan = self.config, self.plan
        per_shard = [[] for _ in range(self.shards)]
        metrics = []
        for p in self.populations:
            users = population_users(start, stop, p, config.populations)
            if len(users) == 0:
                continue
            payload, regret, pop_metrics = simulate_population(self.algo, self.env, model, config.seed, round_index,
                                                               p, users, pre_aggregate=self.pre_aggregate)
            metrics.append((p, regret, pop_metrics, len(users) if payload else 0))
            if payload and plan.sum_spec:
                for s, part in enumerate(plan.split(payload, len(users), p)):
                    if part is not None:
                        per_shard[s].append((config.algorithm, round_index, p, part))
        return (*per_shard, metrics)

    def stats(self) -> dict:
        return {"peak_rss": peak_rss_bytes(), "rss": current_rss_bytes(), "pid": os.getpid()}


class ShardActor:
    """A server shard: keeps the aggregates of its keys (see `ray_shard.ShardCore`)."""

    def __init__(self, config=None, plan=None, shard: int = 0, max_open_rounds: int = 1):
        if config is not None:
            self.configure(config, plan, shard, max_open_rounds)

    def configure(self, config, plan, shard: int, max_open_rounds: int = 1) -> str:
        algo = None
        if plan.mode == "per-user" and plan.segments[shard]:
            algo = make_algorithm(make_env(config), config)   # for its `aggregate` (public per-user weights)
        self.core = ShardCore(plan, shard, algo, max_open_rounds=max_open_rounds)
        return self.node()

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def fold(self, *batches, sent_at=None):
        accepted = rejected = 0
        for batch in batches:
            a, r = self.core.fold(batch, sent_at=sent_at)
            accepted += a
            rejected += r
        return accepted, rejected

    def collect(self, round_index: int) -> dict:
        return self.core.collect(round_index)

    def fold_round(self, round_index: int, *batches):
        """Fold one round's batches (one per population actor) and close it: (totals, accepted, rejected)."""
        accepted, rejected = self.fold(*batches)
        return self.core.collect(round_index), accepted, rejected

    def peek(self, round_index: int) -> dict:
        return self.core.peek(round_index)

    def stats(self) -> dict:
        return {**self.core.stats(), "pid": os.getpid()}


RemotePopulation = ray.remote(PopulationActor)
RemoteShard = ray.remote(ShardActor)


def _check_int(name, value, low=1):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ConfigError(name, value, f"must be an integer >= {low}")
    return int(value)


LOOPBACK_NODE_IP = "127.0.0.2"


def cluster_nodes() -> list[str]:
    """Alive nodes that have CPUs, head first then by id: where actors are placed, round robin."""
    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
    head = [n for n in nodes if "node:__internal_head__" in n.get("Resources", {})]
    rest = sorted((n for n in nodes if n not in head), key=lambda n: n["NodeID"])
    return [n["NodeID"] for n in head + rest]


class ActorPool:
    """Idle actor processes of this Ray session, by (kind, node), for the next run to reuse."""

    def __init__(self):
        self.session, self.idle = None, {}

    def _check_session(self):
        session = ray.get_runtime_context().get_job_id()
        if session != self.session:
            self.session, self.idle = session, {}

    def take(self, cls, node: str):
        self._check_session()
        idle = self.idle.get((cls, node))
        if idle:
            return idle.pop()
        strategy = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
        return cls.options(num_cpus=0, scheduling_strategy=strategy).remote()

    def give_back(self, cls, node: str, handle) -> None:
        self._check_session()
        self.idle.setdefault((cls, node), []).append(handle)

    def clear(self) -> None:
        for handles in self.idle.values():
            for handle in handles:
                _kill(handle)
        self.idle = {}


POOL = ActorPool()


def _kill(handle) -> None:
    try:
        ray.kill(handle)
    except Exception:
        pass


def ensure_ray(address=None, **init_kwargs) -> bool:
    """Connect to `address` (or RAY_ADDRESS), or start a local Ray; True if this call started it."""
    if ray.is_initialized():
        return False
    kwargs = {"include_dashboard": False, "logging_level": "WARNING", "log_to_driver": True, **init_kwargs}
    if address is not None or os.environ.get("RAY_ADDRESS"):
        kwargs.pop("include_dashboard", None)
        kwargs.pop("num_cpus", None)
    else:
        # a new local instance (never attach silently to whatever `ray start` cluster this machine runs), on
        # loopback: Ray would replace 127.0.0.1 by the machine's outward address, not 127.0.0.2
        address = "local"
        kwargs.setdefault("_node_ip_address", LOOPBACK_NODE_IP)
        # token auth on with a private (0600) token, so Ray neither writes a world-readable one nor warns; no
        # metrics exporter on all interfaces (see ray_security)
        enable_token_auth()
        disable_metrics_export()
    ray.init(address=address, **kwargs)
    return True


def run_ray(config, *, actors: int = 2, shards: int = 1, mode: str = "pre-aggregated", max_in_flight: int | None = None,
            progress=None, address: str | None = None, layout: str | None = None):
    """Run `config` on Ray; returns the same RunResult as `run_local(config)` plus Ray figures in the summary.

    actors: population actors (each hosts the populations p with p % actors == its index; at most
    config.populations are used). shards: server shard actors. mode: "pre-aggregated" (populations send their
    sums) or "per-user" (every privatized user message goes to the shards, which aggregate). max_in_flight:
    population calls in flight at once (default: all actors). progress: a callable (users_done, regret), or True
    for the standard display. address: an existing cluster (default: RAY_ADDRESS, else a new local Ray).
    layout: per-user mode only, "population" (default) or "block" (see `ray_shard.make_plan`).
    """
    actors = _check_int("actors", actors)
    shards = _check_int("shards", shards)
    if mode not in MODES:
        raise ConfigError("mode", mode, f"choose from {list(MODES)}")
    if layout not in (None, "block", "population"):
        raise ConfigError("layout", layout, "choose from ['block', 'population']")
    actors = min(actors, config.populations)
    max_in_flight = actors if max_in_flight is None else _check_int("max_in_flight", max_in_flight)
    if progress is True:
        from ldpfed.progress import Progress
        progress = Progress(config.users, label=f"{config.algorithm} (ray)")

    started = ensure_ray(address)
    taken: list = []    # (class, node, handle) of this run
    ok = False
    try:
        result = _coordinate(config, actors, shards, mode, max_in_flight, progress, taken, layout)
        ok = True
        return result
    finally:
        for cls, node, handle in taken:
            if ok and not started:
                POOL.give_back(cls, node, handle)
            else:
                _kill(handle)
        if started:
            POOL.idle = {}
            ray.shutdown()


def _coordinate(config, actors, shards, mode, max_in_flight, progress, taken, layout=None):
    env = make_env(config)
    algo = make_algorithm(env, config)
    plan = make_plan(algo, config, shards, mode, layout)
    P, B = config.populations, config.round_size

    nodes = cluster_nodes()
    populations = [[p for p in range(P) if p % actors == a] for a in range(actors)]
    pop_actors, shard_actors = [], []
    for a in range(actors):           # population actor a on node a % N, shard s on node s % N
        node = nodes[a % len(nodes)]
        pop_actors.append(POOL.take(RemotePopulation, node))
        taken.append((RemotePopulation, node, pop_actors[-1]))
    for s in range(shards):
        node = nodes[s % len(nodes)]
        shard_actors.append(POOL.take(RemoteShard, node))
        taken.append((RemoteShard, node, shard_actors[-1]))
    pop_nodes = ray.get([pop_actors[a].configure.remote(config, populations[a], plan) for a in range(actors)])
    shard_nodes = ray.get([shard_actors[s].configure.remote(config, plan, s) for s in range(shards)])
    active = plan.active_shards()

    state = algo.initial_state(derive(config.seed, "init"))
    recorder = RoundRecorder(config, algo, env)
    fold_calls = 0
    for r in range(config.rounds):
        start, stop = r * B, min(config.users, (r + 1) * B)
        model_ref = ray.put(algo.publish(state))
        metric_refs, shard_refs = [], [[] for _ in range(shards)]
        for a in range(actors):
            if len(metric_refs) >= max_in_flight:      # bound the population calls in flight
                _, running = ray.wait(metric_refs, num_returns=len(metric_refs), timeout=0)
                while len(running) >= max_in_flight:
                    _, running = ray.wait(running, num_returns=1)
            refs = pop_actors[a].run_round.options(num_returns=shards + 1).remote(model_ref, r, start, stop)
            metric_refs.append(refs[shards])
            for s in range(shards):
                shard_refs[s].append(refs[s])
        # Each shard gets the references (Ray moves the data from the actors to it when they are ready, without
        # the driver), folds them in population order and returns the round's totals for its keys.
        round_refs = {s: shard_actors[s].fold_round.remote(r, *shard_refs[s]) for s in active}
        fold_calls += len(round_refs)
        round_metrics = [m for batch in ray.get(metric_refs) for m in batch]
        folded = dict(zip(round_refs, ray.get(list(round_refs.values()))))
        rejected = sum(result[2] for result in folded.values())
        if rejected:
            raise RuntimeError(f"round {r}: the shards rejected {rejected} of the engine's messages")
        totals = [folded[s][0] if s in folded else {} for s in range(shards)]
        del model_ref, shard_refs

        regret, metrics, sending = combine_populations(round_metrics)
        sums = plan.assemble(totals)
        state = algo.update(state, sums, start, stop, derive(config.seed, "server", r))
        recorder.record(r, stop, regret, metrics, state, sending)
        if progress is not None:
            progress(stop, recorder.cumulative)

    elapsed = time.perf_counter() - recorder.started
    shard_stats = ray.get([s.stats.remote() for s in shard_actors])
    pop_stats = ray.get([a.stats.remote() for a in pop_actors])
    latency = LatencyHistogram()
    for st in shard_stats:
        latency.merge(st["latency_counts"])
    p50, p99 = latency.quantile(0.5), latency.quantile(0.99)
    extra = {
        "actors": actors, "shards": shards, "mode": mode, "max_in_flight": max_in_flight,
        "nodes": len(set(pop_nodes) | set(shard_nodes)),
        "population_nodes": {p: pop_nodes[p % actors] for p in range(P)},
        "shard_nodes": list(shard_nodes),
        "shard_layout": plan.layout,
        "messages": recorder.messages, "messages_per_s": recorder.messages / elapsed if elapsed > 0 else float("inf"),
        "shard_messages": int(sum(st["accepted"] for st in shard_stats)),
        "fold_calls": fold_calls,
        "rejected_messages": int(sum(st["rejected"] for st in shard_stats)),
        "fold_latency_p50_ms": None if p50 is None else p50 * 1e3,
        "fold_latency_p99_ms": None if p99 is None else p99 * 1e3,
        "peak_rss_driver": peak_rss_bytes(),
        "peak_rss_populations": max(st["peak_rss"] for st in pop_stats),
        "peak_rss_shards": max(st["peak_rss"] for st in shard_stats),
    }
    return recorder.result(state, engine="ray", extra=extra)

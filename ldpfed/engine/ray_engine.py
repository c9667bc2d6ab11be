"""The federated engine on Ray: population actors, server shard actors, and the driver as coordinator.

One round:
1. The coordinator publishes the model: a small one (under INLINE_MODEL_BYTES, e.g. d = 10: a few hundred bytes)
   goes by value inside each population call; a large one is stored once (`ray.put`) and every population actor
   reads it zero-copy. (A `ray.put` goes through the object store: ~1.3 ms here, a tenth of a B = 10,000 round.)
2. Each population actor simulates all the users of its logical populations for the round in one call
   (`simulate_population`, vectorized), and returns one object per server shard (the messages for that shard's
   keys, see `ray_shard`) plus the simulation metrics (regret, counters) as a separate object: metrics never go
   to the server.
3. Right away, the coordinator hands the object references (not the data) to each shard's `fold_round`; Ray
   moves each object from its actor to the shard when it is ready, and the shard validates and folds the messages
   (idempotent per (population, round), in population order) and returns the round's totals for its keys.
4. The coordinator reassembles the aggregate from the shards' totals, runs `algo.update` (the server half),
   records the round (`RoundRecorder`) and reports progress.
Per round: at most one `ray.put`, one call per population actor, one call per shard; the driver never touches
messages. In the tree shape (many actors; RayBackend's group_size) the driver calls only the first actor of each
group of actors, which calls the others and returns their objects' references, and each shard fetches the objects
it is handed references to: one call per group, the same objects folded in the same order. Under the shuffle
trust model (per-user mode) step 3 goes through S shuffler actors (`ShufflerActor`, one call each per round): a
population actor returns one object per shuffler (its users' messages in that shuffler's share,
ldpfed.shuffling), each shuffler permutes its share and returns one object per shard of chunks that carry no
population and no user index, and the shards fold those chunks.

The result equals `run_local`'s for the same config, whatever the number of actors, shards or nodes: the same
derived random streams are used per (population, round), regret and metrics are added in population order, and
every element of the aggregate is summed in population order (by the one shard that owns it, or, in per-user
mode's "population" layout, by the coordinator from the shards' per-population sums; see `ray_shard`); under the
shuffle model the chunks' sums are added in (shuffler, chunk) order (S, like the seed, is part of the run's
configuration: it changes the shares and the permutations, hence the rounding).
Memory does not grow with the number of users: at most one round's objects are alive at a time, and the shards
keep one round's totals.
"""
from __future__ import annotations

import collections
import contextlib
import math
import os
import pickle
import signal
import threading
import time
import warnings

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ldpfed.algorithms import make_algorithm
from ldpfed.algorithms.trust import trust_model
from ldpfed.engine.channels import (ChannelBroken, RemoteError, Serving, as_ready, close_all, connect, new_key,
                                    receive, watchdog)
from ldpfed.engine.core import PopulationRow, join_pieces, population_users, shuffler_pieces, simulate_population
from ldpfed.engine.driver import Backend, drive
from ldpfed.engine.ray_security import disable_metrics_export, enable_token_auth
from ldpfed.engine.ray_shard import (MODES, LatencyHistogram, ShardCore, ShuffledChunk, WireMessage, current_rss_bytes,
                                     make_plan, peak_rss_bytes)
from ldpfed.envs import make_env
from ldpfed.errors import ConfigError, describe_error
from ldpfed.memory import keep_freed_memory
from ldpfed.plugins import PLUGINS_VAR
from ldpfed.shuffling import check_groups, shard_of_chunk, shuffle_share
from ldpfed.threads import limit as limit_threads


class ServesRounds:
    """What the actors that serve rounds over channels (transport "direct") share: one `Serving` at a time, closed
    before the next one and before the actor is configured for another run."""

    serving = None

    def _serve(self, key: bytes, serve):
        """Run serve(serving, coordinator) on a new Serving's thread; `coordinator` is the list that holds the
        coordinator's connection once the loop accepted it, where an exception's traceback goes. Returns the
        address it listens on."""
        self.close_channel()
        serving = self.serving = Serving(ray.util.get_node_ip_address(), key)
        coordinator = []
        serving.start(lambda: serve(serving, coordinator),
                      lambda text: coordinator and coordinator[0].send(RemoteError(text)))
        return serving.address

    def close_channel(self) -> None:
        if self.serving is not None:
            self.serving.stop()
            self.serving = None


class PopulationActor(ServesRounds):
    """Hosts a fixed set of logical populations; builds its env and algorithm (client half) once per run.

    An actor process can be reused by the next run in the same Ray session (`configure` replaces everything):
    starting a Python worker that imports numpy, scipy and pandas costs seconds on a busy machine.
    """

    def __init__(self, config=None, populations=(), plan=None):
        if config is not None:
            self.configure(config, populations, plan)

    def configure(self, config, populations: list[int], plan) -> tuple[str, int]:
        """(node id, pid) of this actor once it is ready for the run."""
        self.close_channel()    # a previous run's rounds, if any, end before its env is replaced
        self.config, self.populations, self.plan = config, list(populations), plan
        limit_threads()         # one BLAS thread: the actor's CPU is its users' work (ldpfed.threads)
        keep_freed_memory()     # the populations' arrays reuse freed memory instead of faulting in new pages
        self.env = make_env(config)
        self.algo = make_algorithm(self.env, config)
        self.pre_aggregate = plan.mode == "pre-aggregated"
        self.shards = plan.shards
        self.shufflers = plan.shufflers      # > 0: the messages go to the shufflers, not to the shards
        self.members = None                  # a leader's group (run_group), sent again by the driver after a change
        return self.node(), os.getpid()

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def run_round(self, model, round_index: int, start: int, stop: int):
        """All users of this actor's populations for one round: (*one object per shard, metrics); under the shuffle
        trust model (*one object per shuffler: [(population, its users' messages in that shuffler's share)],
        metrics)."""
        config, plan = self.config, self.plan
        outgoing = [[] for _ in range(self.shufflers or self.shards)]   # per shard, or per shuffler
        metrics = []
        for p in self.populations:
            users = population_users(start, stop, p, config.populations)
            if len(users) == 0:
                continue
            payload, regret, pop_metrics = simulate_population(self.algo, self.env, model, config.seed, round_index,
                                                               p, users, pre_aggregate=self.pre_aggregate)
            metrics.append(PopulationRow.of(p, users, payload, regret, pop_metrics))
            if payload and self.shufflers:     # the shuffler knows who sent a piece; it tells no one
                for s, piece in enumerate(shuffler_pieces(payload, users, start, stop, self.shufflers)):
                    if piece is not None:
                        outgoing[s].append((p, piece))
            elif payload and plan.sum_spec:
                for s, part in enumerate(plan.split(payload, len(users), p)):
                    if part is not None:
                        outgoing[s].append(WireMessage(config.algorithm, round_index, p, part))
        return (*outgoing, metrics)

    def open_channel(self, key: bytes, shard_addresses: dict, index: int):
        """Serve this run's rounds over channels (transport "direct", ldpfed.engine.channels): connect to each
        active shard (saying which actor this is), take the coordinator's connection, then for each (model, round,
        start, stop) it sends, run the round, send each shard its objects and the coordinator the metrics.
        Returns the address the coordinator connects to."""
        def serve(serving, coordinator):
            shards = {s: serving.connect(address) for s, address in shard_addresses.items()}
            for conn in shards.values():
                conn.send(index)
            coordinator.append(serving.accept())
            while (request := coordinator[0].recv()) is not None:
                *objects, metrics = self.run_round(*request)
                for s, conn in shards.items():
                    conn.send(objects[s])
                coordinator[0].send(metrics)

        return self._serve(key, serve)

    def run_group(self, boxed_model, round_index: int, start: int, stop: int, members: list | None):
        """The round of a group of actors whose leader this one is (the tree shape): (*one ref per shard, to the
        list of the refs of the group's objects for that shard in actor order, this actor's first; the group's
        metrics). boxed_model: (model,) or (the ref it was stored under,), passed on to the members as is (one copy
        in the object store). members: the handles of the group's other actors in actor order, or None: the same
        as in the previous call (the driver sends them once, not every round)."""
        if members is not None:
            self.members = members
        if self.members is None:
            raise RuntimeError("run_group: this leader was never given its members")
        (model,) = boxed_model
        returns = self.shards + 1
        calls = [m.run_round.options(num_returns=returns).remote(model, round_index, start, stop)
                 for m in self.members]
        *own, metrics = self.run_round(ray.get(model) if isinstance(model, ray.ObjectRef) else model, round_index,
                                       start, stop)     # while the members run theirs
        # The lists of refs are put here, not returned: refs inside a call's result cost the driver (their
        # borrower) ~0.1 ms each (measured), refs inside an object this actor put never reach it.
        refs = [ray.put([ray.put(batch)] + [call[s] for call in calls]) for s, batch in enumerate(own)]
        # A member's death fails this call (so the driver redoes the round); its objects never come here.
        for batch in ray.get([call[-1] for call in calls]):
            metrics.extend(batch)
        return (*refs, metrics)

    def stats(self) -> dict:
        return {"peak_rss": peak_rss_bytes(), "rss": current_rss_bytes(), "pid": os.getpid(),
                "cpu_s": time.process_time()}


class ShufflerActor:
    """A shuffler of the shuffle trust model: mixes its share of each round (ldpfed.shuffling) and forwards it to the
    shards in chunks that carry no population and no user index (`ShuffledChunk`). It keeps nothing between rounds,
    so a recreated one simply redoes the round."""

    def __init__(self, config=None, plan=None, shuffler: int = 0):
        if config is not None:
            self.configure(config, plan, shuffler)

    def configure(self, config, plan, shuffler: int) -> tuple[str, int]:
        limit_threads()
        self.config, self.plan, self.shuffler = config, plan, shuffler
        # the algorithm's randomizer groups and public fields: what the shuffler checks before it forwards a share
        self.algo = make_algorithm(make_env(config), config)
        self.messages, self.busy_s = 0, 0.0
        self.latency = LatencyHistogram()          # time to mix and cut one round's share
        return self.node(), os.getpid()

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def shuffle_round(self, round_index: int, *batches):
        """batches: one list of (population, messages) per population actor. Returns one list of ShuffledChunks per
        shard (a single list with one shard)."""
        began = time.perf_counter()
        pieces = sorted((item for batch in batches for item in batch), key=lambda item: item[0])
        users = self.plan.share_users(round_index, self.shuffler)
        share = join_pieces([piece for _, piece in pieces]) if pieces else {}
        got = len(next(iter(share.values()))) if share else 0
        if got != len(users):     # the engine's own populations: a wrong count is a bug, not an attack
            raise RuntimeError(f"shuffler {self.shuffler}: round {round_index} has {got} messages for "
                               f"{len(users)} users")
        check_groups(self.algo, round_index, users, share)
        per_shard = [[] for _ in range(self.plan.shards)]
        for c, chunk in enumerate(shuffle_share(self.config.seed, round_index, self.shuffler, share)):
            per_shard[shard_of_chunk(self.shuffler, c, self.plan.shards)].append(
                ShuffledChunk(self.config.algorithm, round_index, self.shuffler, c, chunk))
        self.messages += got
        took = time.perf_counter() - began
        self.busy_s += took
        self.latency.add(took)
        return tuple(per_shard) if self.plan.shards > 1 else per_shard[0]

    def stats(self) -> dict:
        return {"messages": self.messages, "busy_s": self.busy_s, "latency_counts": self.latency.counts,
                "peak_rss": peak_rss_bytes(), "pid": os.getpid(), "cpu_s": time.process_time()}


class ShardActor(ServesRounds):
    """A server shard: keeps the aggregates of its keys (see `ray_shard.ShardCore`)."""

    def __init__(self, config=None, plan=None, shard: int = 0, max_open_rounds: int = 1, first_round: int = 0,
                 check_domains: bool = True):
        self.lock = threading.Lock()   # the shard's state: its channel's thread folds, Ray calls rewind and read it
        if config is not None:
            self.configure(config, plan, shard, max_open_rounds, first_round, check_domains)

    def configure(self, config, plan, shard: int, max_open_rounds: int = 1, first_round: int = 0,
                  check_domains: bool = True) -> tuple[str, int]:
        """(node id, pid) of this shard once it is ready to fold from round `first_round` on. check_domains=False:
        only to measure what the domain checks cost (ShardCore)."""
        self.close_channel()
        limit_threads()
        algo = None
        if plan.segments[shard]:   # its `aggregate` (public per-user weights) and its message domains
            algo = make_algorithm(make_env(config), config)
        self.core = ShardCore(plan, shard, algo, max_open_rounds=max_open_rounds, first_round=first_round,
                              check_domains=check_domains)
        return self.node(), os.getpid()

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def fold(self, *batches, sent_at=None):
        return self._fold_each(batches, sent_at)

    def _fold_each(self, batches, sent_at=None) -> tuple[int, int]:
        """(accepted, rejected) of folding `batches`, any iterable (the direct transport's receives each batch when it
        is its turn, so the first is folded while the next is still on its way)."""
        accepted = rejected = 0
        for batch in batches:
            a, r = self.core.fold(batch, sent_at=sent_at)
            accepted += a
            rejected += r
        return accepted, rejected

    def collect(self, round_index: int) -> dict:
        return self.core.collect(round_index)

    def publish(self, round_index: int, model) -> None:
        self.core.publish(round_index, model)

    def fold_round(self, round_index: int, *batches, model=None, grouped: bool = False):
        """Fold one round's batches (one per population actor) and close it: (totals, accepted, rejected). model:
        what the server published for the round, when the message domains check public choices against it.
        grouped: each batch is a ref to a list of object refs (a group's, in actor order; `PopulationActor.run_group`),
        fetched here from the actors, so the batches are the same and in the same order as with one per actor."""
        if grouped:
            batches = ray.get([ref for refs in ray.get(list(batches)) for ref in refs])
        return self._fold_round(round_index, batches, model)

    def _fold_round(self, round_index: int, batches, model):
        """fold_round's work, on any iterable of batches (`_fold_each`)."""
        if model is not None:
            self.core.publish(round_index, model)
        accepted, rejected = self._fold_each(batches)
        return self.core.collect(round_index), accepted, rejected

    def rewind(self, round_index: int) -> None:
        # The round is redone: a serving thread still waiting for it (for a population actor on a frozen node, whose
        # socket stays open and which Ray cannot kill yet) is stopped first, so it neither holds the lock nor folds
        # late; the coordinator opens new channels for the redone round.
        self.close_channel()
        with self.lock:
            self.core.rewind(round_index)

    def peek(self, round_index: int) -> dict:
        with self.lock:
            return self.core.peek(round_index)

    def stats(self) -> dict:
        self.close_channel()      # asked at the end of a run (or before its channels open): its rounds are over
        with self.lock:
            return {**self.core.stats(), "pid": os.getpid(), "cpu_s": time.process_time()}

    def open_channel(self, key: bytes, actors: int):
        """Serve this run's rounds over channels (transport "direct", ldpfed.engine.channels): take the connections
        of the coordinator and of the `actors` population actors (each says who it is), then for each (round,
        published model) the coordinator sends, fold one batch from each population actor as they arrive (added in
        actor order all the same: `ShardCore.fold`), and send the coordinator what `fold_round` returns. Returns the
        address to connect to."""
        def serve(serving, coordinator):
            peers = {}
            while len(peers) < actors + 1:
                conn = serving.accept()
                peers[conn.recv()] = conn
            coordinator.append(peers.pop("coordinator"))
            populations = [peers[a] for a in range(actors)]
            while (request := coordinator[0].recv()) is not None:
                round_index, model = request
                with self.lock:
                    result = self._fold_round(round_index, as_ready(populations), model)
                coordinator[0].send(result)

        return self._serve(key, serve)


# How a round's messages travel (RayBackend's transport).
TRANSPORTS = ("ray", "direct")

RemotePopulation = ray.remote(PopulationActor)
RemoteShuffler = ray.remote(ShufflerActor)
RemoteShard = ray.remote(ShardActor)


def check_mode(config, mode: str) -> None:
    """ConfigError naming mode when the run's trust model cannot run in it (before Ray starts, and at open)."""
    shuffles = trust_model(config).shuffles
    if shuffles and mode != "per-user":
        raise ConfigError("mode", mode, "the shuffle trust model runs in per-user mode: its shuffler actors mix the "
                                        "users' messages, which a population's sum would bypass; use --mode per-user")


def check_transport(config, transport: str) -> None:
    """ConfigError naming transport when the run cannot use it (before Ray starts, and at open)."""
    if transport == "direct" and trust_model(config).shuffles:
        raise ConfigError("transport", transport, "the shuffle trust model's rounds go through its shuffler actors "
                                                  "over Ray; use transport 'ray'")


def _check_int(name, value, low=1):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ConfigError(name, value, f"must be an integer >= {low}")
    return int(value)


def _check_seconds(name, value, zero: bool = False) -> None:
    """ConfigError naming `name` unless value is None or a number of seconds > 0 (>= 0 with zero=True)."""
    if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                  and (value >= 0 if zero else value > 0)):
        raise ConfigError(name, value, f"must be a number of seconds {'>=' if zero else '>'} 0")


LOOPBACK_NODE_IP = "127.0.0.2"


def cluster_nodes() -> list[str]:
    """Alive nodes that have CPUs, head first then by id: where actors are placed, round robin."""
    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
    head = [n for n in nodes if "node:__internal_head__" in n.get("Resources", {})]
    rest = sorted((n for n in nodes if n not in head), key=lambda n: n["NodeID"])
    return [n["NodeID"] for n in head + rest]


class IdleActors:
    """Idle actor processes of this Ray session, by (kind, node), for the next run to reuse (not ray.util.ActorPool,
    which spreads calls over busy actors)."""

    def __init__(self):
        self.session, self.idle = None, {}

    def _check_session(self):
        session = ray.get_runtime_context().get_job_id()
        if session != self.session:
            self.session, self.idle = session, {}

    def take(self, cls, node: str):
        self._check_session()
        idle = self.idle.get((cls, node, _plugins()))
        if idle:
            return idle.pop()
        strategy = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
        options = {"num_cpus": 0, "scheduling_strategy": strategy}
        if _plugins():   # the actor finds the same plugin classes as this driver (ldpfed/plugins.py)
            options["runtime_env"] = {"env_vars": {PLUGINS_VAR: _plugins()}}
        return cls.options(**options).remote()

    def give_back(self, cls, node: str, handle) -> None:
        self._check_session()
        self.idle.setdefault((cls, node, _plugins()), []).append(handle)

    def clear(self) -> None:
        for handles in self.idle.values():
            for handle in handles:
                _kill(handle)
        self.idle = {}


IDLE_ACTORS = IdleActors()


def _node_for(index: int, nodes: list, avoid: set) -> str:
    """Node `index` mod the nodes not in `avoid` (all of them when every node is to be avoided)."""
    usable = [n for n in nodes if n not in avoid] or nodes
    return usable[index % len(usable)]


def moves_onto(joined: list, node_of: dict) -> dict:
    """{actor key: joined node} of the population actors to move onto the nodes `joined`, given every actor's node
    (`node_of`: (kind, index) -> node): one at a time, from the node with the most actors to the joined node with the
    fewest, while the first has at least two more (each move evens the load); of a node's population actors, the
    highest index moves first. Other kinds stay."""
    load = collections.Counter({node: 0 for node in joined})
    load.update(node_of.values())
    movable = sorted(key for key in node_of if key[0] == "population")
    moves = {}
    while joined and movable:
        crowded = max((node_of[key] for key in movable), key=lambda node: load[node])
        target = min(joined, key=lambda node: load[node])
        if load[crowded] < load[target] + 2:
            break
        key = max(key for key in movable if node_of[key] == crowded)
        movable.remove(key)
        moves[key] = target
        load[crowded] -= 1
        load[target] += 1
    return moves


def _plugins() -> str:
    """This driver's LDPFED_PLUGINS ("" when unset): every actor gets it, so it rebuilds the same classes by name."""
    return os.environ.get(PLUGINS_VAR, "")


def _kill(handle) -> None:
    try:
        ray.kill(handle, no_restart=True)
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
    sigterm = signal.getsignal(signal.SIGTERM)
    ray.init(address=address, **kwargs)
    # Ray's core installs a C-level SIGTERM handler in the driver that aborts (SIGABRT, no `finally`, no
    # checkpoint); a Python handler set before (ldpfed.signals.interruptible) is put back so SIGTERM stops cleanly.
    if callable(sigterm) and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, sigterm)
    return True


class RoundTimeout(Exception):
    """A round that did not complete within its timeout (a frozen actor, a partitioned node): handled as a death."""


class RunFault(RuntimeError):
    """A run the Ray engine could not recover (too many faults in a row, or an actor that cannot be recreated)."""


# Errors that mean "a worker or its objects are gone", not "the code is wrong": the round is redone.
FAULTS = (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError, ray.exceptions.WorkerCrashedError,
          ray.exceptions.GetTimeoutError, RoundTimeout, ChannelBroken)


class RayBackend(Backend):
    """The rounds of a run on population and shard actors, with recovery.

    Recovery: when a round fails with a dead actor, lost objects, or a timeout (round_timeout seconds, or by
    default `timeout_factor` x the slowest of the last 20 rounds, at least `min_round_timeout`; until a round
    has been measured, at the run's start and after each recovery, `first_round_timeout` at least: new actor
    processes import and compile in their first round, which a slow or loaded machine must not take for a frozen
    actor), every actor is probed (`probe_timeout` seconds,
    population actors first: a shard waits for their objects); a dead or unresponsive one is killed and
    recreated on its node (another alive node if its node is gone), the surviving shards forget the round
    (`ShardCore.rewind`), and the whole round is simulated again from its derived streams: the result is the
    undisturbed one, bit for bit. Each recovery is recorded (round, actor, cause, old pid and node, time from
    the round's start to the fault's detection, time to recover); after `max_recoveries` in one run, RunFault.
    spares: idle actor processes of each kind kept started, so that a recovery configures one instead of
    starting a Python process (seconds on a busy machine); each spare costs one idle process.

    rebalance_every: seconds between looks, at a round's start, for nodes that joined the cluster since the run
    last looked (a new machine, or a lost one back: a restarted node has a new id). Population actors move onto
    them, one at a time from the node with the most of this run's actors, while that evens the load (a population
    actor keeps nothing between rounds: the new one is configured and the old one killed, and the results stay the
    same bits); each move is in the summary's `rebalances`. Shards stay where they are (they hold the run's
    counters). 0: at every round; None: never.

    group_size: the shape of a round. 0 or 1: flat (the driver calls every population actor). g >= 2: a tree (the
    actors in contiguous groups of g, the last one smaller; the driver calls each group's first actor, which calls
    the others, `PopulationActor.run_group`): the driver's work per round grows with the groups, not the actors;
    the shards fold the same objects in the same order, so the results are the same bit for bit. None: chosen by
    the number of actors (`auto_group_size`). The shuffle trust model is always flat. A dead member fails its
    leader's call: the round is redone as for any dead actor.

    transport: how the rounds' messages travel. "ray": Ray calls and objects, as above. "direct": over
    authenticated sockets between the coordinator, the population actors and the shards (ldpfed.engine.channels),
    ~0.6 ms of CPU less per message on each side than a Ray call (docs/scaling.md); flat rounds only, not under the
    shuffle trust model; the actors, their placement and recovery stay Ray's. The results are the same bit for bit.
    None (default): "direct", except for a tree (group_size > 1) or the shuffle trust model ("ray"), and if the
    channels cannot be opened before the run's first round (e.g. a firewall between the nodes' processes), the run
    goes on with Ray calls, with a warning (`transport_fallback` in the summary says why).
    """

    name = "ray"

    def __init__(self, actors: int = 2, shards: int = 1, mode: str = "pre-aggregated",
                 max_in_flight: int | None = None, layout: str | None = None, round_timeout: float | None = None,
                 timeout_factor: float = 10.0, min_round_timeout: float = 5.0, first_round_timeout: float = 120.0,
                 probe_timeout: float = 2.0, max_recoveries: int = 10, spares: int = 0,
                 group_size: int | None = None, transport: str | None = None,
                 rebalance_every: float | None = 30.0):
        self.actors = _check_int("actors", actors)
        self.shards = _check_int("shards", shards)
        if mode not in MODES:
            raise ConfigError("mode", mode, f"choose from {list(MODES)}")
        if layout not in (None, "block", "population"):
            raise ConfigError("layout", layout, "choose from ['block', 'population']")
        self.mode, self.layout = mode, layout
        self.max_in_flight = None if max_in_flight is None else _check_int("max_in_flight", max_in_flight)
        # None: chosen by the number of actors (`auto_group_size`); 0 or 1: the flat shape
        self.group_size = None if group_size is None else max(1, _check_int("group_size", group_size, low=0))
        if transport not in (None, *TRANSPORTS):
            raise ConfigError("transport", transport, f"choose from {list(TRANSPORTS)}")
        tree = (self.group_size or 1) > 1
        if transport == "direct" and tree:
            raise ConfigError("group_size", group_size, "the direct transport runs flat rounds (group_size 1): "
                                                        "the coordinator's work per actor is one socket write")
        self.transport_asked = transport      # None: direct, unless the run needs Ray calls (see open)
        self.transport = transport or ("ray" if tree else "direct")
        self.transport_fallback = None        # why the default direct transport fell back to Ray calls, if it did
        self.direct_rounds = 0
        self.channels = None         # transport "direct": the coordinator's connections, opened for the first round
        for name, value in (("round_timeout", round_timeout), ("timeout_factor", timeout_factor),
                            ("min_round_timeout", min_round_timeout), ("first_round_timeout", first_round_timeout),
                            ("probe_timeout", probe_timeout)):
            _check_seconds(name, value)
        self.round_timeout, self.timeout_factor = round_timeout, float(timeout_factor)
        self.min_round_timeout, self.first_round_timeout = float(min_round_timeout), float(first_round_timeout)
        self.probe_timeout = float(probe_timeout)
        _check_seconds("rebalance_every", rebalance_every, zero=True)     # None: never
        self.rebalance_every = rebalance_every
        self.rebalances: list[dict] = []
        self.known_nodes: set = set()     # the nodes the run has seen (a node not in it has joined since)
        self.next_look = 0.0
        self.max_recoveries = _check_int("max_recoveries", max_recoveries, low=0)
        self.spares = _check_int("spares", spares, low=0)
        self.spare: dict = {kind: [] for kind in self.CLASSES}   # started, idle actor processes: a recovery takes one
        self.shufflers = 0           # S under the shuffle trust model (set by open)
        self.handles: dict = {}      # (kind, index) -> actor handle of this run
        self.where: dict = {}        # (kind, index) -> (node id, pid)
        self.recoveries: list[dict] = []
        self.round_times = collections.deque(maxlen=20)
        self.fold_calls = 0
        self.in_flight: list = []    # the current round's calls
        self.led: set = set()        # the leaders that have their group's handles (sent again after a recovery)

    # ---- actors ---------------------------------------------------------------------------------
    CLASSES = {"population": RemotePopulation, "shuffler": RemoteShuffler, "shard": RemoteShard}
    # the order a recovery probes them in: a shard's call waits for the shufflers', which wait for the populations'
    KINDS = tuple(CLASSES)

    def _start(self, kind: str, index: int, first_round: int, node: str | None = None, spare: bool = True):
        """A (reused or new) actor for (kind, index) on `node` (an alive node; default: round robin), or a spare
        (spare=True: a warm process, wherever it is); returns the ref of its `configure` call."""
        if node is None:
            nodes = cluster_nodes()
            node = nodes[index % len(nodes)]
        if spare and self.spare[kind]:        # a warm process: no interpreter and imports to wait for
            node, handle = self.spare[kind].pop()
        else:
            handle = IDLE_ACTORS.take(self.CLASSES[kind], node)
        self.handles[(kind, index)] = handle
        self.where[(kind, index)] = (node, None)
        if kind == "population":
            return handle.configure.remote(self.config, self.populations[index], self.plan)
        if kind == "shuffler":
            return handle.configure.remote(self.config, self.plan, index)
        return handle.configure.remote(self.config, self.plan, index, 1, first_round)

    def _configured(self, keys, refs) -> list:
        """Wait for the actors' `configure` calls; record where each one runs. Returns the keys whose actor died
        while being configured (its node is gone: Ray had not marked it dead yet), for the caller to place again;
        RunFault if some are not ready within first_round_timeout."""
        ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=self.first_round_timeout)
        if pending:
            late = [key for key, ref in zip(keys, refs) if ref in pending]
            raise RunFault(f"actors {late} were not ready within {self.first_round_timeout:.0f} s "
                           f"(first_round_timeout)")
        died = []
        for key, ref in zip(keys, refs):
            try:
                self.where[key] = tuple(ray.get(ref))
            except FAULTS:
                died.append(key)
        return died

    def _place(self, keys, first_round: int, node_of, spare: bool = True) -> None:
        """Start and configure the actors `keys`, `node_of(key, avoid)` choosing each one's node; an actor that dies
        while being configured is placed again, away from the nodes where that happened (up to max_recoveries
        times), so a node that died without Ray knowing yet is left behind."""
        avoid: set = set()
        for _ in range(self.max_recoveries + 1):
            refs = {key: self._start(key[0], key[1], first_round, node_of(key, avoid), spare) for key in keys}
            keys = self._configured(list(refs), list(refs.values()))
            if not keys:
                return
            avoid |= {self.where[key][0] for key in keys}
            for key in keys:
                _kill(self.handles[key])
        raise RunFault(f"actors {keys} died each time they were placed (nodes tried: {len(avoid)})")

    def counts(self) -> dict:
        """How many actors of each kind this run has."""
        return {"population": self.actors, "shuffler": self.shufflers, "shard": self.shards}

    def pids(self) -> dict:
        """The pids of this run's actors now: {"population": [...], "shuffler": [...], "shard": [...]} (for fault
        drills; no shufflers but under the shuffle trust model)."""
        return {kind: [self.where[(kind, i)][1] for i in range(n)] for kind, n in self.counts().items()}

    def open(self, config, algo, env, first_round):
        self.config = config
        check_mode(config, self.mode)
        shuffles = trust_model(config).shuffles
        if self.transport_asked is None and shuffles:
            self.transport = "ray"
        check_transport(config, self.transport)
        self.shufflers = config.shufflers if shuffles else 0
        if config.populations < self.actors:    # an actor hosts whole populations: the rest would have none
            warnings.warn(f"populations={config.populations} < actors={self.actors}: the run uses "
                          f"{config.populations} population actors (set populations to at least the actors)",
                          RuntimeWarning, stacklevel=2)
            self.actors = config.populations
        # The shuffle trust model keeps the flat shape, whatever group_size says: its population actors' objects
        # go to the shufflers, which take one batch per actor.
        size = 1 if self.shufflers or self.transport == "direct" else self.group_size or auto_group_size(self.actors)
        self.groups = [range(a, min(a + size, self.actors)) for a in range(0, self.actors, size)]
        self.led = set()
        self.max_in_flight = len(self.groups) if self.max_in_flight is None else self.max_in_flight
        self.plan = make_plan(algo, config, self.shards, self.mode, self.layout)
        # the shards get each round's model when a message domain checks a public choice against it
        self.shards_check_model = any(getattr(d, "published", None) for d in algo.cached_domains().values())
        self.populations = [[p for p in range(config.populations) if p % self.actors == a] for a in range(self.actors)]
        self.active = self.plan.active_shards()
        keys = [(kind, i) for kind, n in self.counts().items() for i in range(n)]
        nodes = cluster_nodes()   # population actor a on node a % N, shuffler s and shard s on node s % N
        self._place(keys, first_round, lambda key, avoid: _node_for(key[1], nodes, avoid))
        self._add_spares(wait=True)
        self.known_nodes = set(cluster_nodes())
        self.next_look = time.monotonic() + (self.rebalance_every or 0.0)
        # CPU seconds of each process so far (pooled processes served earlier runs): the run's share is the rise
        self.driver_cpu_at_open = time.process_time()
        self.cpu_at_open = {st["pid"]: st["cpu_s"] for st in ray.get([self.handles[key].stats.remote() for key in keys],
                                                                     timeout=self.first_round_timeout)}

    def _add_spares(self, wait: bool) -> None:
        """Top up `spares` idle actors of each kind (their process started, `node()` called once)."""
        warming = []
        for kind, cls in self.CLASSES.items():
            while len(self.spare[kind]) < (self.spares if self.counts()[kind] else 0):
                node = cluster_nodes()[len(self.spare[kind]) % len(cluster_nodes())]
                handle = IDLE_ACTORS.take(cls, node)
                self.spare[kind].append((node, handle))
                warming.append(handle.node.remote())
        if wait and warming:
            ray.get(warming, timeout=self.first_round_timeout)

    # ---- one round ------------------------------------------------------------------------------
    def timeout(self) -> float:
        if not self.round_times:        # new actors' first round: its own deadline (see the class doc)
            return max(self.first_round_timeout, self.round_timeout or 0.0)
        if self.round_timeout is not None:
            return float(self.round_timeout)
        return max(self.min_round_timeout, self.timeout_factor * max(self.round_times))

    def simulate(self, model, round_index, start, stop):
        if self.rebalance_every is not None and time.monotonic() >= self.next_look:
            self._rebalance(round_index)
            self.next_look = time.monotonic() + self.rebalance_every
        while True:
            began = time.perf_counter()
            try:
                result = self._round(model, round_index, start, stop, began + self.timeout())
            except FAULTS as error:
                if len(self.recoveries) >= self.max_recoveries:
                    raise RunFault(f"round {round_index}: {describe_error(error)}; {len(self.recoveries)} "
                                   f"recoveries already (max_recoveries)") from error
                self._recover(round_index, error, began)
                continue
            self.round_times.append(time.perf_counter() - began)
            return result

    def _round(self, model, r, start, stop, deadline):
        if self.transport == "direct":
            return self._direct_round(model, r, start, stop, deadline)
        shards, pops, shard_actors = self.shards, self.handles, self.handles
        model_ref = model if _model_bytes(model) <= INLINE_MODEL_BYTES else ray.put(model)
        metric_refs, shard_refs = [], [[] for _ in range(shards)]
        # the population actors' objects go to the shards, or under the shuffle model to the shufflers
        receivers = self.shufflers or shards
        sent_refs = shard_refs if not self.shufflers else [[] for _ in range(self.shufflers)]
        tree = len(self.groups) < self.actors
        for group in self.groups:       # groups of one actor: the flat shape
            if len(metric_refs) >= self.max_in_flight:      # bound the driver's population calls in flight
                _, running = ray.wait(metric_refs, num_returns=len(metric_refs), timeout=0)
                while len(running) >= self.max_in_flight:
                    done, running = ray.wait(running, num_returns=1, timeout=_left(deadline))
                    if not done:
                        raise RoundTimeout(f"round {r}: population calls still running at the timeout")
                    ray.get(done)      # raises at once if that actor died
            leader, call = pops[("population", group[0])], dict(num_returns=receivers + 1)
            if tree:   # the leader calls its members: the driver's work is per group, not per actor
                members = None if group[0] in self.led else [pops[("population", a)] for a in group[1:]]
                refs = leader.run_group.options(**call).remote((model_ref,), r, start, stop, members)
                self.led.add(group[0])
            else:
                refs = leader.run_round.options(**call).remote(model_ref, r, start, stop)
            metric_refs.append(refs[receivers])
            for s in range(receivers):
                sent_refs[s].append(refs[s])
        for s in range(self.shufflers):      # each shuffler's chunks, one object per shard
            refs = self.handles[("shuffler", s)].shuffle_round.options(num_returns=shards).remote(r, *sent_refs[s])
            for k, ref in enumerate(refs if shards > 1 else [refs]):
                shard_refs[k].append(ref)
        # Each shard gets the references (Ray moves the data from the actors to it when they are ready, without
        # the driver), folds them in population order and returns the round's totals for its keys.
        published = model_ref if self.shards_check_model else None
        round_refs = {s: shard_actors[("shard", s)].fold_round.remote(r, *shard_refs[s], model=published, grouped=tree)
                      for s in self.active}
        self.fold_calls += len(round_refs)
        self.in_flight = metric_refs + list(round_refs.values())
        values = _gather(self.in_flight, deadline, r)
        self.in_flight = []
        return self._assemble(r, dict(zip(round_refs, values[len(metric_refs):])), values[:len(metric_refs)])

    def _assemble(self, r: int, folded: dict, metric_batches: list):
        """The round's aggregate and metrics from {shard: what its fold_round returned} and the actors' metrics."""
        rejected = sum(result[2] for result in folded.values())
        if rejected:
            raise RuntimeError(f"round {r}: the shards rejected {rejected} of the engine's messages")
        totals = [folded[s][0] if s in folded else {} for s in range(self.shards)]
        return self.plan.assemble(totals), [m for batch in metric_batches for m in batch]

    # ---- the direct transport (ldpfed.engine.channels) ------------------------------------------
    def _direct_round(self, model, r, start, stop, deadline):
        if self.channels is None:
            try:
                self._open_channels(deadline)
            except ChannelBroken as error:
                if self.direct_rounds or self.transport_asked == "direct":
                    raise      # channels that worked in this run, or were asked for: a fault
                # The default transport could not connect: Ray calls, which need no other ports, for the whole run
                self._close_channels()
                self.transport, self.transport_fallback = "ray", describe_error(error)
                warnings.warn(f"the direct transport could not open its channels ({self.transport_fallback}); "
                              f"the run goes on with Ray calls (transport 'ray')", RuntimeWarning, stacklevel=2)
                return self._round(model, r, start, stop, deadline)
        populations, shards = self.channels
        conns = populations + list(shards.values())
        published = model if self.shards_check_model else None
        request = pickle.dumps((model, r, start, stop), protocol=pickle.HIGHEST_PROTOCOL)    # once for all actors
        # A send blocks only when its peer stopped reading (a frozen actor) and the request is larger than what the
        # sockets buffer (a few hundred KiB on Linux): a large one goes under a watchdog that ends it at the
        # round's deadline (a thread per round: not for the small requests of most rounds)
        guard = watchdog(conns, _left(deadline)) if len(request) > INLINE_MODEL_BYTES else contextlib.nullcontext()
        try:
            with guard:
                for conn in populations:
                    conn.send_bytes(request)
                for conn in shards.values():
                    conn.send((r, published))
        except OSError as error:
            raise ChannelBroken(f"round {r}: {describe_error(error)}") from error
        values = receive(conns, _left(deadline),
                         lambda n: RoundTimeout(f"round {r}: {n} channels silent at the timeout"))
        self.fold_calls += len(shards)
        self.direct_rounds += 1
        return self._assemble(r, dict(zip(shards, values[len(populations):])), values[:len(populations)])

    def _open_channels(self, deadline: float) -> None:
        """Every actor serves this run's rounds on a new channel (a new key); the coordinator connects to them."""
        self._close_channels()
        key, active = new_key(), list(self.active)
        try:
            shard_refs = [self.handles[("shard", s)].open_channel.remote(key, self.actors) for s in active]
            shard_addresses = dict(zip(active, ray.get(shard_refs, timeout=_left(deadline))))
            pop_refs = [self.handles[("population", a)].open_channel.remote(key, shard_addresses, a)
                        for a in range(self.actors)]
            opened = [], {}
            self.channels = opened     # what is connected so far is closed if the rest fails
            for address in ray.get(pop_refs, timeout=_left(deadline)):
                opened[0].append(connect(address, key))
            for s in active:
                opened[1][s] = connect(shard_addresses[s], key)
                opened[1][s].send("coordinator")
        except (OSError, EOFError) as error:      # incl. a failed handshake (multiprocessing's AuthenticationError)
            raise ChannelBroken(f"opening the round channels: {describe_error(error)}") from error

    def _close_channels(self) -> None:
        """Close the coordinator's channels: each actor's serving thread then ends (it reads the end of its
        channel, or fails to write to it)."""
        if self.channels is not None:
            populations, shards = self.channels
            close_all(populations + list(shards.values()))
            self.channels = None

    # ---- nodes that join -------------------------------------------------------------------------
    def _rebalance(self, r: int) -> None:
        """Move population actors onto the nodes that joined since the last look (see rebalance_every; which ones:
        `moves_onto`), before round r."""
        nodes = cluster_nodes()
        joined = [node for node in nodes if node not in self.known_nodes]
        self.known_nodes = set(nodes)
        moves = moves_onto(joined, {key: self.where[key][0] for key in self.handles})
        if not moves:
            return
        self._close_channels()       # the direct transport opens them again, to the new actors, for round r
        old = {key: (self.handles[key], self.where[key]) for key in moves}
        # a new process on the joined node (not a spare, which may be anywhere); if it dies there, elsewhere
        self._place(list(moves), r, lambda key, avoid: moves[key] if moves[key] not in avoid
                    else _node_for(key[1], cluster_nodes(), avoid), spare=False)
        for key, (handle, (node, pid)) in old.items():
            _kill(handle)
            self.rebalances.append({"round": r, "kind": key[0], "index": key[1], "old_node": node, "old_pid": pid,
                                    "new_node": self.where[key][0], "new_pid": self.where[key][1]})
        self.led = set()             # a tree's leaders get their members' handles again

    # ---- recovery -------------------------------------------------------------------------------
    def _settle(self) -> None:
        """Collect the failed round's calls that have ended (their errors are expected, not news), drop the rest."""
        ready, _ = ray.wait(self.in_flight, num_returns=len(self.in_flight), timeout=self.probe_timeout) \
            if self.in_flight else ([], [])
        for ref in ready:
            try:
                ray.get(ref)
            except Exception:
                pass
        self.in_flight = []

    def _probe(self, keys: list) -> dict:
        """{(kind, index): "died" | "unresponsive"} of the actors `keys` that fail a short call."""
        refs = {self.handles[k].node.remote(): k for k in keys}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=self.probe_timeout)
        bad = {k: "unresponsive" for ref, k in refs.items() if ref not in ready}
        for ref in ready:
            try:
                ray.get(ref)
            except Exception:
                bad[refs[ref]] = "died"
        return bad

    def _recover(self, r: int, error: BaseException, began: float) -> None:
        detected, detected_at = time.perf_counter(), time.time()
        self._close_channels()      # the direct transport: reopened, to the actors as they are now, by the next round
        self.led = set()    # some actors are new: every leader gets its group's handles again
        bad = {}
        # populations first: a shard call waits for their objects (via the shufflers); the tree's members before
        # their leaders: a leader waits for its members' calls, and answers once a frozen member is killed
        leaders = {("population", group[0]) for group in self.groups}
        stages = [[key for key in self.handles if key[0] == "population" and key not in leaders], sorted(leaders)]
        for keys in stages + [[key for key in self.handles if key[0] == kind] for kind in self.KINDS[1:]]:
            found = self._probe(keys)
            for key in found:
                _kill(self.handles[key])
            bad.update(found)
        events = [{"round": r, "kind": kind, "index": i, "cause": why, "old_node": self.where[(kind, i)][0],
                   "old_pid": self.where[(kind, i)][1]} for (kind, i), why in bad.items()]
        self._settle()
        # A node none of whose actors answered may be gone (Ray marks a dead node only after its health checks
        # fail): its actors are placed on the other nodes; a node where some actor answered keeps its actors.
        answered = {self.where[key][0] for key in self.handles if key not in bad}
        suspect = {self.where[key][0] for key in bad} - answered
        replace, survivors = list(bad), [("shard", s) for s in self.active if ("shard", s) not in bad]
        for _ in range(self.max_recoveries + 1):
            nodes = cluster_nodes()
            self._place(replace, r, lambda key, avoid: (
                self.where[key][0] if self.where[key][0] in nodes and self.where[key][0] not in suspect | avoid
                else _node_for(key[1], nodes, suspect | avoid)))
            # the surviving shards forget the round; one that fails to (it died meanwhile) is replaced as well
            replace = self._rewind(survivors, r)
            if not replace:
                break
            survivors = [key for key in survivors if key not in replace]
            events += [{"round": r, "kind": kind, "index": i, "cause": "died while recovering",
                        "old_node": self.where[(kind, i)][0], "old_pid": self.where[(kind, i)][1]}
                       for kind, i in replace]
            suspect |= {self.where[key][0] for key in replace}
            for key in replace:
                _kill(self.handles[key])
        else:
            raise RunFault(f"round {r}: shards {replace} kept failing while the run recovered")
        for event in events:
            event["new_node"] = self.where[(event["kind"], event["index"])][0]
        recovered = time.perf_counter()
        self._add_spares(wait=False)      # the next spares start while the run goes on
        self.recoveries.append({
            "round": r, "error": describe_error(error), "actors": events,
            "detected_at": detected_at, "detect_s": detected - began, "recover_s": recovered - detected})
        self.round_times.clear()    # measure the recreated actors afresh (they may be slower at first)

    def _rewind(self, keys, r: int) -> list:
        """Rewind the shards `keys` to round r; returns those that failed with a fault (dead or gone)."""
        refs = {key: self.handles[key].rewind.remote(r) for key in keys}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=self.first_round_timeout)
        failed = []
        for key, ref in refs.items():
            try:
                if ref not in ready:
                    raise RoundTimeout(f"shard {key} did not rewind within {self.first_round_timeout:.0f} s")
                ray.get(ref)
            except FAULTS:
                failed.append(key)
        return failed

    def close(self, ok):
        self._close_channels()
        extra = {
            "actors": self.actors, "shards": self.shards, "shufflers": self.shufflers, "mode": self.mode,
            "transport": self.transport, "transport_fallback": self.transport_fallback,
            "max_in_flight": self.max_in_flight, "groups": len(getattr(self, "groups", ())),
            "shard_layout": self.plan.layout if hasattr(self, "plan") else None, "fold_calls": self.fold_calls,
            "recoveries": len(self.recoveries), "recovery_s": sum(e["recover_s"] for e in self.recoveries),
            "recovery_events": self.recoveries, "rebalances": self.rebalances,
        }
        if not ok or not hasattr(self, "plan"):
            return extra
        try:
            counts = self.counts()
            stats = ray.get([self.handles[(kind, i)].stats.remote() for kind in self.KINDS
                             for i in range(counts[kind])], timeout=self.first_round_timeout)
            pop_stats, stats = stats[:self.actors], stats[self.actors:]
            shuffler_stats, shard_stats = stats[:self.shufflers], stats[self.shufflers:]
        except FAULTS as error:   # the rounds are done; only the figures below are lost
            return {**extra, "stats_error": describe_error(error)}
        def cpu(stats):   # a process recreated during the run counts whole
            return sum(st["cpu_s"] - self.cpu_at_open.get(st["pid"], 0.0) for st in stats)
        latency = LatencyHistogram()
        for st in shard_stats:
            latency.merge(st["latency_counts"])
        p50, p99 = latency.quantile(0.5), latency.quantile(0.99)
        shuffled = {}
        if shuffler_stats:    # messages a shuffler mixed per second of its own work; its time per round's share
            mixing = LatencyHistogram()
            for st in shuffler_stats:
                mixing.merge(st["latency_counts"])
            busy = sum(st["busy_s"] for st in shuffler_stats)
            shuffled = {"shuffler_messages": int(sum(st["messages"] for st in shuffler_stats)),
                        "shuffler_busy_s": busy, "shuffle_latency_p50_ms": mixing.quantile(0.5) * 1e3,
                        "shuffle_latency_p99_ms": mixing.quantile(0.99) * 1e3, "cpu_s_shufflers": cpu(shuffler_stats)}
        pop_nodes = [self.where[("population", a)][0] for a in range(self.actors)]
        shard_nodes = [self.where[("shard", s)][0] for s in range(self.shards)]
        return {
            **extra,
            "nodes": len(set(pop_nodes) | set(shard_nodes)),
            "population_nodes": {p: pop_nodes[p % self.actors] for p in range(self.config.populations)},
            "shard_nodes": shard_nodes, "actor_pids": self.pids(),
            "shard_messages": int(sum(st["accepted"] for st in shard_stats)),
            "rejected_messages": int(sum(st["rejected"] for st in shard_stats)),
            "fold_latency_p50_ms": None if p50 is None else p50 * 1e3,
            "fold_latency_p99_ms": None if p99 is None else p99 * 1e3,
            "peak_rss_driver": peak_rss_bytes(),
            "peak_rss_populations": max(st["peak_rss"] for st in pop_stats),
            "peak_rss_shards": max(st["peak_rss"] for st in shard_stats),
            # CPU seconds this run used in each kind of process (all its threads): where a round's time goes
            "cpu_s_driver": time.process_time() - self.driver_cpu_at_open,
            "cpu_s_populations": cpu(pop_stats), "cpu_s_shards": cpu(shard_stats),
            **shuffled,
        }

    def release(self, reuse: bool) -> None:
        """Give this run's actors (and spares) back to the pool (reuse) or kill them."""
        self._close_channels()
        for kind in self.spare:
            for node, handle in self.spare[kind]:
                if reuse:
                    IDLE_ACTORS.give_back(self.CLASSES[kind], node, handle)
                else:
                    _kill(handle)
            self.spare[kind] = []
        for (kind, _), handle in self.handles.items():
            if reuse:
                IDLE_ACTORS.give_back(self.CLASSES[kind], self.where[(kind, _)][0], handle)
            else:
                _kill(handle)
        self.handles = {}


# Models up to this size travel inside the calls (Ray inlines call arguments below 100 KiB): cheaper than a put.
INLINE_MODEL_BYTES = 64 * 2**10


def _model_bytes(model) -> float:
    """The size of a published model's arrays, strings and numbers (nested dicts, lists, tuples); anything else
    counts as unbounded (it is then stored with `ray.put`, as before)."""
    if isinstance(model, np.ndarray):
        return float("inf") if model.dtype.hasobject else model.nbytes
    if isinstance(model, dict):
        return sum(_model_bytes(key) + _model_bytes(value) for key, value in model.items())
    if isinstance(model, (list, tuple)):
        return sum(_model_bytes(value) for value in model)
    if isinstance(model, (str, bytes)):
        return len(model)
    if model is None or isinstance(model, (bool, int, float, np.generic)):
        return 8
    return float("inf")


# Below this many population actors a round is flat (the driver calls every actor); from it on, the actors are in
# groups of ~sqrt(actors) whose leaders the driver calls (PopulationActor.run_group). Measured (jobs/bench_driver.py
# --shape flat,tree, 1 shard, 2-core VM, idle; docs/scaling.md): the driver's CPU per round, flat / tree, was
# 5.2 / 6.2 ms at 8 actors, 8.8 / 8.2 at 16, 19.1 / 13.3 at 32, 44.9 / 17.7 at 64. A group's call costs the driver
# ~3 actors' calls, and the tree adds a hop (leader, then members) and doubles the actors' own CPU for Ray's calls:
# below 32 actors it saves too little.
TREE_FROM_ACTORS = 32


def tree_group_size(actors: int) -> int:
    """ceil(sqrt(actors)): about as many groups as actors per group, so the driver's calls and each leader's are
    balanced."""
    return math.isqrt(actors - 1) + 1


def auto_group_size(actors: int) -> int:
    """The default group size: 1 (flat) below TREE_FROM_ACTORS actors, else tree_group_size(actors)."""
    return 1 if actors < TREE_FROM_ACTORS else tree_group_size(actors)


def _left(deadline: float) -> float:
    return max(0.0, deadline - time.perf_counter())


def _gather(refs: list, deadline: float, r: int) -> list:
    """ray.get of `refs`, raising as soon as one fails, or RoundTimeout at the deadline."""
    values, pending = {}, list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=_left(deadline))
        if not ready:
            raise RoundTimeout(f"round {r}: {len(pending)} of {len(refs)} calls not done at the timeout")
        more, pending = ray.wait(pending, num_returns=len(pending), timeout=0) if pending else ([], [])
        for ref, value in zip(ready + more, ray.get(ready + more)):
            values[ref] = value
    return [values[ref] for ref in refs]


def run_ray(config, *, actors: int = 2, shards: int = 1, mode: str = "pre-aggregated", max_in_flight: int | None = None,
            progress=None, address: str | None = None, layout: str | None = None, checkpointer=None,
            group_size: int | None = None, transport: str | None = None, **recovery):
    """Run `config` on Ray; returns the same RunResult as `run_local(config)` plus Ray figures in the summary.

    actors: population actors (each hosts the populations p with p % actors == its index; at most
    config.populations are used). shards: server shard actors. mode: "pre-aggregated" (populations send their
    sums) or "per-user" (every privatized user message goes to the shards, which aggregate). max_in_flight:
    the driver's population calls in flight at once (one per actor, or per group; default: all). progress: a
    callable (users_done, regret), or True for the standard display. address: an existing cluster (default:
    RAY_ADDRESS, else a new local Ray). layout: per-user mode only, "population" (default) or "block" (see
    `ray_shard.make_plan`). checkpointer: see `checkpoint.Checkpointer`. group_size: population actors per group
    of the tree shape (RayBackend; 0 or 1: flat; default `auto_group_size`, which the direct transport makes flat).
    transport: "ray", "direct" (the rounds' messages over authenticated sockets, flat rounds only) or None (direct
    where it can run, else ray; see RayBackend). recovery: RayBackend's timeouts, max_recoveries, spares and
    rebalance_every.
    """
    backend = RayBackend(actors, shards, mode, max_in_flight, layout, group_size=group_size, transport=transport,
                         **recovery)
    check_mode(config, mode)
    check_transport(config, transport)
    if progress is True:
        from ldpfed.progress import Progress
        progress = Progress(config.users, label=f"{config.algorithm} (ray)")
    started = ensure_ray(address)
    ok = False
    try:
        result = drive(config, backend, progress=progress, checkpointer=checkpointer)
        ok = True
        return result
    finally:
        backend.release(reuse=ok and not started)
        if started:
            IDLE_ACTORS.idle = {}
            ray.shutdown()

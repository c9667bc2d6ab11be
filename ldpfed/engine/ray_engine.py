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
ldpfed.trust.shuffling), each shuffler permutes its share and returns one object per shard of chunks that carry no
population and no user index, and the shards fold those chunks.

The result equals `run_local`'s for the same config, whatever the number of actors, shards or nodes: the same
derived random streams are used per (population, round), regret and metrics are added in population order, and
every element of the aggregate is summed in population order (by the one shard that owns it, or, in per-user
mode's "population" layout, by the coordinator from the shards' per-population sums; see `ray_shard`); under the
shuffle model the chunks' sums are added in (shuffler, chunk) order (S, like the seed, is part of the run's
configuration: it changes the shares and the permutations, hence the rounding).
Memory does not grow with the number of users: at most one round's objects are alive at a time, and the shards
keep one round's totals.

The engine's modules: `ray_options` (RayOptions and the option checks), `ray_session` (ensure_ray), `ray_actors`
(the actor classes), `ray_placement` (nodes, the actor pool, a run's Crew, moves onto joined nodes), `ray_rounds`
(one round over Ray calls or over channels), `ray_recovery` (probe, recreate, rewind), `ray_faults` (what fails);
this module composes them into `RayBackend` and `run_ray`, and hands their names on to existing callers.
"""
from __future__ import annotations

import collections
import json
import math
import time
import warnings
from pathlib import Path

import ray

from ldpfed.trust import trust_model
from ldpfed.engine.driver import Backend, drive
from ldpfed.engine.ray_actors import (PopulationActor, RemotePopulation, RemoteShard, RemoteShuffler,  # noqa: F401
                                      ServesRounds, ShardActor, ShufflerActor)
from ldpfed.engine.ray_faults import FAULTS, RoundTimeout, RunFault  # noqa: F401
from ldpfed.engine.ray_options import TRANSPORTS, RayOptions, check_deadline, check_mode, check_transport  # noqa: F401
from ldpfed.engine.ray_placement import IDLE_ACTORS, Crew, IdleActors, cluster_nodes, moves_onto, node_for  # noqa: F401
from ldpfed.engine.ray_recovery import Recovery
from ldpfed.engine.ray_rounds import (INLINE_MODEL_BYTES, TREE_FROM_ACTORS, Channels, ChannelsUnavailable,  # noqa: F401
                                      DeadlineCalls,
                                      RayCalls, Shape, auto_group_size, tree_group_size)
from ldpfed.engine.ray_rounds import model_bytes as _model_bytes  # noqa: F401
from ldpfed.engine.ray_session import LOOPBACK_NODE_IP, ensure_ray  # noqa: F401
from ldpfed.engine.ray_shard import LatencyHistogram, make_plan, peak_rss_bytes
from ldpfed.util.errors import describe_error


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
    counters). A moved actor runs outside the run's placement group (which has no bundle on a node that joined
    after it was placed), asking for its CPUs on the joined node: only as many move onto a node as it has CPUs free,
    and the bundle it left goes to the spares. 0: at every round; None: never.

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

    CPUs and placement: each population actor asks Ray for `actor_cpus` CPUs, each shard and shuffler for
    `shard_cpus` (fractions allowed; None, the default: what fits, the largest equal share up to 1 CPU with which
    all the run's actors and spares fit in the CPUs the nodes have available when the run starts), and the run
    reserves them in a placement group of its own, one bundle per actor and spare (`placement`: "spread", the
    default, or "pack"), created at open: two runs never share a CPU one of them asked for,
    and an autoscaler sees what a run asks for. A run whose group cannot be placed waits (`placement_timeout`
    seconds, then RunFault; None, the default: as long as it takes, with a warning that says what it waits for). A
    recovered actor goes back into its bundle; on a lost node, outside the group (see `ray_placement.Crew`). When a
    run ends well, its group is held with its actors idle in their bundles, and the next run of the same shape (the
    actors, shards, spares and CPU options) in this process takes them whole: a sweep's runs pay for starting actor
    processes once (`ray_placement.IdleActors`). `placement` "none" reserves nothing: the actors ask for no CPUs
    and go round robin onto the nodes, and when a run ends well its processes wait, by kind and node, for any later
    run of this process, whatever its shape. For many short runs of varied shapes on a cluster the study has to
    itself (the test suite, a stress test); Ray's accounting and an autoscaler do not see such runs, and two of
    them at once share CPUs.

    Options: `RayOptions` (the arguments here, or options=RayOptions(...)), checked when the backend is made.
    """

    name = "ray"
    KINDS = Crew.KINDS

    def __init__(self, *args, options: RayOptions | None = None, **kwargs):
        self.options = options if options is not None else RayOptions(*args, **kwargs)
        opts = self.options
        self.actors, self.shards = opts.actors, opts.shards   # actors: at most the run's populations (open)
        self.mode = opts.mode
        self.transport = opts.transport or ("ray" if opts.tree else "direct")
        self.transport_fallback = None        # why the default direct transport fell back to Ray calls, if it did
        self.max_in_flight = opts.max_in_flight
        self.shufflers = 0           # S under the shuffle trust model (set by open)
        self.crew = Crew(opts)
        self.recovery = Recovery(opts, self.crew)
        self.recoveries = self.recovery.events
        self.rounds = None           # a ray_rounds.Rounds, made by open
        self.rebalances: list[dict] = []
        self.known_nodes: set = set()     # the nodes the run has seen (a node not in it has joined since)
        self.next_look = 0.0
        self.round_times = collections.deque(maxlen=20)
        self.late_messages = opts.deadline_s is not None

    def counts(self) -> dict:
        """How many actors of each kind this run has."""
        return {"population": self.actors, "shuffler": self.shufflers, "shard": self.shards}

    def pids(self) -> dict:
        """The pids of this run's actors now: {"population": [...], "shuffler": [...], "shard": [...]} (for fault
        drills; no shufflers but under the shuffle trust model)."""
        return self.crew.pids()

    def open(self, config, algo, env, first_round):
        opts = self.options
        self.config = config
        check_mode(config, self.mode)
        shuffles = trust_model(config).shuffles
        if opts.transport is None and shuffles:
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
        size = 1 if self.shufflers or self.transport == "direct" else opts.group_size or auto_group_size(self.actors)
        groups = [range(a, min(a + size, self.actors)) for a in range(0, self.actors, size)]
        self.max_in_flight = len(groups) if opts.max_in_flight is None else opts.max_in_flight
        self.plan = make_plan(algo, config, self.shards, self.mode, opts.layout)
        shape = Shape(self.actors, self.shards, self.shufflers, groups, self.max_in_flight, self.plan,
                      self.plan.active_shards(),
                      # the shards get each round's model when a message domain checks a public choice against it
                      any(getattr(d, "published", None) for d in algo.cached_domains().values()))
        if opts.deadline_s is not None or opts.stragglers:
            check_deadline(config, opts)
            self.transport = "ray"
            self.rounds = DeadlineCalls(self.crew.handles, shape, opts, config)
        else:
            self.rounds = (Channels(self.crew.handles, shape, asked=opts.transport == "direct")
                           if self.transport == "direct" else RayCalls(self.crew.handles, shape))
        populations = [[p for p in range(config.populations) if p % self.actors == a] for a in range(self.actors)]
        self.crew.open(config, self.plan, populations, self.shufflers)
        keys = self.crew.keys()
        self.crew.reserve()       # the run's placement group: one bundle per actor and spare
        self.crew.place(keys, first_round, self.crew.home)      # each actor in its bundle (or on its node)
        self.crew.add_spares(wait=True)
        self.known_nodes = set(cluster_nodes())
        self.next_look = time.monotonic() + (opts.rebalance_every or 0.0)
        # CPU seconds of each process so far (pooled processes served earlier runs): the run's share is the rise
        self.driver_cpu_at_open = time.process_time()
        self.cpu_at_open = {st["pid"]: st["cpu_s"] for st in ray.get(
            [self.crew.handles[key].stats.remote() for key in keys], timeout=opts.first_round_timeout)}

    # ---- one round ------------------------------------------------------------------------------
    def timeout(self) -> float:
        opts = self.options
        if not self.round_times:        # new actors' first round: its own deadline (see the class doc)
            return max(opts.first_round_timeout, opts.round_timeout or 0.0)
        if opts.round_timeout is not None:
            return float(opts.round_timeout)
        return max(opts.min_round_timeout, opts.timeout_factor * max(self.round_times))

    def simulate(self, model, round_index, start, stop):
        every = self.options.rebalance_every
        if every is not None and time.monotonic() >= self.next_look:
            self._rebalance(round_index)
            self.next_look = time.monotonic() + every
        while True:
            began = time.perf_counter()
            try:
                result = self._round(model, round_index, start, stop, began + self.timeout())
            except FAULTS as error:
                if len(self.recoveries) >= self.options.max_recoveries:
                    raise RunFault(f"round {round_index}: {describe_error(error)}; {len(self.recoveries)} "
                                   f"recoveries already (max_recoveries)") from error
                self.recovery.recover(round_index, error, began, self.rounds, self.rounds.shape.active)
                self.round_times.clear()    # measure the recreated actors afresh (they may be slower at first)
                continue
            self.round_times.append(time.perf_counter() - began)
            return result

    def _round(self, model, r, start, stop, deadline):
        try:
            return self.rounds.run(model, r, start, stop, deadline)
        except ChannelsUnavailable as error:
            # The default transport could not connect: Ray calls, which need no other ports, for the whole run
            self.rounds = RayCalls(self.crew.handles, self.rounds.shape)
            self.transport, self.transport_fallback = "ray", describe_error(error.cause)
            warnings.warn(f"the direct transport could not open its channels ({self.transport_fallback}); "
                          f"the run goes on with Ray calls (transport 'ray')", RuntimeWarning, stacklevel=2)
            return self.rounds.run(model, r, start, stop, deadline)

    def _deadline_record(self) -> dict:
        """Deadline mode: the record of the population rounds that missed their round (written to
        options.deadline_record as JSON when given), and its counts for the summary."""
        self.rounds.finish()
        record = sorted(self.rounds.record, key=lambda e: (e["round"], e["population"]))
        if self.options.deadline_record:
            path = Path(self.options.deadline_record)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"format": "ldpfed-deadline-record-1", "deadline_s": self.options.deadline_s,
                                        "late": self.options.late, "late_population_rounds": record}, indent=1))
        return {"deadline_s": self.options.deadline_s, "deadline_late": self.options.late,
                "deadline_late_population_rounds": sum(e["arrival"] is not None for e in record),
                "deadline_lost_population_rounds": sum(e["arrival"] is None for e in record),
                "late_messages_undelivered": sum(len(self.plan.users_of(e["round"], e["population"])) for e in record
                                                 if e["arrival"] == self.config.rounds),
                "deadline_record": record}

    # ---- nodes that join -------------------------------------------------------------------------
    def _rebalance(self, r: int) -> None:
        """Move population actors onto the nodes that joined since the last look (see rebalance_every; which ones:
        `moves_onto`), before round r."""
        nodes = cluster_nodes()
        joined = [node for node in nodes if node not in self.known_nodes]
        self.known_nodes = set(nodes)
        moves = moves_onto(joined, {key: self.crew.where[key][0] for key in self.crew.handles})
        # a moved actor asks for its CPUs on the joined node: only as many as that node has free move there
        free = ray._private.state.available_resources_per_node()     # a developer API: Ray's per-node view
        asks = self.crew.cpus["population"]
        room = {node: math.floor(free.get(node, {}).get("CPU", 0.0) / asks + 1e-9) if asks else len(moves)
                for node in joined}
        kept = {}
        for key, node in moves.items():
            if room[node] > 0:
                room[node] -= 1
                kept[key] = node
        moves = kept
        if not moves:
            return
        self.rounds.reset()          # the direct transport opens its channels again, to the new actors, for round r
        self.rebalances += self.crew.move(moves, r)
        self.rounds.reset()          # a tree's leaders get their members' handles again

    def close(self, ok):
        if self.rounds is not None:
            self.rounds.close()
        deadline = self._deadline_record() if self.late_messages else {}
        extra = {**deadline,
            "actors": self.actors, "shards": self.shards, "shufflers": self.shufflers, "mode": self.mode,
            "transport": self.transport, "transport_fallback": self.transport_fallback,
            "max_in_flight": self.max_in_flight, "groups": len(self.rounds.shape.groups) if self.rounds else 0,
            "shard_layout": self.plan.layout if hasattr(self, "plan") else None,
            "fold_calls": self.rounds.fold_calls if self.rounds else 0,
            "recoveries": len(self.recoveries), "recovery_s": sum(e["recover_s"] for e in self.recoveries),
            "recovery_events": self.recoveries, "rebalances": self.rebalances,
            "placement": self.options.placement, "actor_cpus": self.crew.cpus.get("population"),
            "shard_cpus": self.crew.cpus.get("shard"),
            "placement_group": self.crew.group.id.hex() if self.crew.group is not None else None,
        }
        if not ok or not hasattr(self, "plan"):
            return extra
        handles, where = self.crew.handles, self.crew.where
        try:
            counts = self.counts()
            stats = ray.get([handles[(kind, i)].stats.remote() for kind in self.KINDS
                             for i in range(counts[kind])], timeout=self.options.first_round_timeout)
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
        everyone = pop_stats + shuffler_stats + shard_stats
        pop_nodes = [where[("population", a)][0] for a in range(self.actors)]
        shard_nodes = [where[("shard", s)][0] for s in range(self.shards)]
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
            # what Ray gave the actors: how many run in the run's placement group, and the CPUs they hold
            "actors_in_group": sum(st["placement_group"] == extra["placement_group"] for st in everyone
                                   if extra["placement_group"] is not None),
            "cpus_held": round(sum(st["cpus"] for st in everyone), 4),
            **shuffled,
        }

    def release(self, reuse: bool) -> None:
        """Hand the run's placement group with its actors to the pool for the next run (reuse), or end them."""
        if self.rounds is not None:
            self.rounds.close()
        self.crew.release(reuse)


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
    where it can run, else ray; see RayBackend). recovery: RayBackend's timeouts, max_recoveries, spares,
    rebalance_every, and its CPU and placement options (actor_cpus, shard_cpus, placement, placement_timeout).
    """
    backend = RayBackend(options=RayOptions(actors, shards, mode, max_in_flight, layout, group_size=group_size,
                                            transport=transport, **recovery))
    check_mode(config, mode)
    check_transport(config, transport)
    if progress is True:
        from ldpfed.util.progress import Progress
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
            IDLE_ACTORS.reset()     # its processes end with the Ray instance this run started
            ray.shutdown()

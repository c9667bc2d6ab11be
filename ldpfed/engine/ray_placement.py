"""Where a Ray run's actors live: the cluster's nodes (`cluster_nodes`), the CPUs each actor asks for
(`cpus_per_actor`), the run's placement group, actors and spares (`Crew`: reserve, start, configure, place, move,
release), which population actors move onto nodes that joined (`moves_onto`), and a pool of idle processes for
tools that start actors of their own (`IdleActors`)."""
from __future__ import annotations

import collections
import dataclasses
import math
import os
import threading
import time
import warnings

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from ldpfed.engine.ray_actors import RemotePopulation, RemoteShard, RemoteShuffler
from ldpfed.engine.ray_faults import FAULTS, RunFault
from ldpfed.engine.ray_options import CPU_STEP, PLACEMENTS
from ldpfed.plugins import PLUGINS_VAR


def cluster_nodes() -> list[str]:
    """Alive nodes that have CPUs, head first then by id: where actors are placed, round robin."""
    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
    head = [n for n in nodes if "node:__internal_head__" in n.get("Resources", {})]
    rest = sorted((n for n in nodes if n not in head), key=lambda n: n["NodeID"])
    return [n["NodeID"] for n in head + rest]


def node_for(index: int, nodes: list, avoid: set) -> str:
    """Node `index` mod the nodes not in `avoid` (all of them when every node is to be avoided)."""
    usable = [n for n in nodes if n not in avoid] or nodes
    return usable[index % len(usable)]


def plugins() -> str:
    """This driver's LDPFED_PLUGINS ("" when unset): every actor gets it, so it rebuilds the same classes by name."""
    return os.environ.get(PLUGINS_VAR, "")


def kill(handle) -> None:
    try:
        ray.kill(handle, no_restart=True)
    except Exception:
        pass


class IdleActors:
    """What this Ray session keeps between runs: idle actor processes by (kind, node), for tools that start actors
    of their own (ldpfed.stress; not ray.util.ActorPool, which spreads calls over busy actors), and the placement
    groups of finished runs with their actors still in their bundles (`Reservation`), for the next run of the same
    shape to take whole: its actors are warm processes (imports done, compiled code loaded), which is most of what a
    short run costs. A held group keeps its CPUs reserved for this driver until the next run takes it, HOLD_S
    seconds pass, something of this driver needs CPUs (a run of another shape, a sweep's Ray tasks: they call
    `clear_groups` first), `clear` is called, or the driver's Ray job ends (Ray removes its groups)."""

    def __init__(self):
        self.session, self.idle, self.groups = None, {}, {}
        self.lock = threading.Lock()      # the expiry timer ends a held group from its own thread
        self.timer = None

    def _check_session(self):
        session = ray.get_runtime_context().get_job_id()
        if session != self.session:
            self.reset()
            self.session = session

    def take(self, cls, node: str):
        self._check_session()
        idle = self.idle.get((cls, node, plugins()))
        if idle:
            return idle.pop()
        strategy = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
        options = {"num_cpus": 0, "scheduling_strategy": strategy}
        if plugins():   # the actor finds the same plugin classes as this driver (ldpfed/plugins.py)
            options["runtime_env"] = {"env_vars": {PLUGINS_VAR: plugins()}}
        return cls.options(**options).remote()

    def give_back(self, cls, node: str, handle) -> None:
        self._check_session()
        self.idle.setdefault((cls, node, plugins()), []).append(handle)

    def take_group(self, shape) -> "Reservation | None":
        """A held reservation of this shape (see `Crew.shape`), or None."""
        self._check_session()
        with self.lock:
            return self.groups.pop((shape, plugins()), None)

    def give_back_group(self, shape, reservation: "Reservation") -> None:
        """Hold `reservation` for the next run of its shape, for HOLD_S seconds at most: a group nobody takes then
        gives its CPUs back (to other drivers' runs and tasks, which would otherwise wait for this one to end)."""
        self._check_session()
        self.clear_groups()          # one held group at a time: the CPUs of the last shape run, no more
        with self.lock:
            self.groups[(shape, plugins())] = reservation
            self.timer = threading.Timer(HOLD_S, self._expire, args=(reservation,))
            self.timer.daemon = True
            self.timer.start()

    def _expire(self, reservation: "Reservation") -> None:
        with self.lock:
            held = [key for key, value in self.groups.items() if value is reservation]
            for key in held:
                del self.groups[key]
        if held:
            reservation.end()

    def clear_groups(self) -> None:
        """End the held reservations' actors and remove their groups, and wait (a few seconds at most) until Ray
        counts their CPUs as available again: it frees a removed group's asynchronously, and a run that measures
        what fits right after would find less. Anything of this driver that needs CPUs (a run of another shape, a
        sweep's Ray tasks) calls it first."""
        with self.lock:
            groups, self.groups = list(self.groups.values()), {}
            if self.timer is not None:
                self.timer.cancel()
        if not groups:
            return
        freed = sum(sum(r.cpus[kind] for kind in r.kinds) for r in groups)
        before = ray.available_resources().get("CPU", 0.0)
        for reservation in groups:
            reservation.end()
        deadline = time.monotonic() + FREE_WAIT_S
        while ray.available_resources().get("CPU", 0.0) < before + freed - 1e-6 and time.monotonic() < deadline:
            time.sleep(0.05)

    def clear(self) -> None:
        """Kill the idle processes and end the held reservations."""
        for handles in self.idle.values():
            for handle in handles:
                kill(handle)
        self.clear_groups()
        self.reset()

    def reset(self) -> None:
        """Forget the idle processes and reservations (their Ray session has ended: they are gone with it)."""
        with self.lock:
            self.idle, self.groups = {}, {}
            if self.timer is not None:
                self.timer.cancel()


@dataclasses.dataclass
class Reservation:
    """A finished run's placement group, the CPUs each kind's bundle holds, and the actor in each bundle."""
    group: object
    cpus: dict                   # kind -> CPUs of each of its bundles
    kinds: list                  # the kind of each bundle, in order
    actors: dict                 # bundle index -> idle actor handle in that bundle

    def end(self) -> None:
        # The idle actors leave first, the way an actor ends itself (no SIGTERM traceback in the driver's output),
        # then the group goes, with anything still in it.
        leaving = []
        for handle in self.actors.values():
            try:
                leaving.append(handle.__ray_terminate__.remote())
            except Exception:       # Ray is gone, or the actor is
                pass
        if leaving:
            try:
                ray.wait(leaving, num_returns=len(leaving), timeout=LEAVE_S)
            except Exception:
                pass
        self.actors = {}
        try:
            remove_placement_group(self.group)
        except Exception:          # Ray is gone: so is the group
            pass


# How long a finished run's placement group is held for the next run of its shape (a sweep's runs follow each other
# within a second or two)
HOLD_S = 30.0
# How long ending a held reservation waits for its idle actors to end themselves before removing the group
LEAVE_S = 5.0
# How long ending held reservations waits for Ray to count their CPUs as available again
FREE_WAIT_S = 5.0

# This process's: the idle processes and held reservations of its Ray session (a run started with its own Ray
# resets it when it stops Ray).
IDLE_ACTORS = IdleActors()

# A run whose placement group is not placed after this many seconds says what it waits for
WAIT_WARNING_S = 10.0


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


def fitting_share(free: list, n: int) -> float:
    """The largest number of CPUs s (at most 1, in Ray's steps) such that n bundles of s CPUs fit on nodes that
    have `free` CPUs each (0: they do not)."""
    best = 0.0
    for room in free:
        for k in range(1, n + 1):
            share = min(1.0, math.floor(room / k / CPU_STEP + 1e-9) * CPU_STEP)
            if share > best and sum(math.floor(c / share + 1e-9) for c in free) >= n:
                best = share
    return round(best, 4)


def _first_fit(free: list, sizes: list) -> list:
    """`free` less the bundles of `sizes`, each on the first node it fits on (largest first)."""
    free = sorted(free, reverse=True)
    for size in sorted(sizes, reverse=True):
        for i, room in enumerate(free):
            if room + 1e-9 >= size:
                free[i] = room - size
                break
    return free


def cpus_per_actor(asked: dict, counts: dict) -> dict:
    """{kind: CPUs each of its `counts[kind]` actors asks for}: asked[kind], or, where that is None, what fits: the
    largest equal share, at most 1 CPU, with which all of them fit in the CPUs the nodes have available now (after
    the bundles of the kinds asked for). When they do not fit there (other runs hold the CPUs), the share is of the
    nodes' CPUs: the run waits for them. At least one step of Ray's (1/10,000 CPU)."""
    unset = sum(n for kind, n in counts.items() if asked[kind] is None)
    shares = dict(asked)
    if unset:
        nodes = {n["NodeID"]: n["Resources"].get("CPU", 0.0) for n in ray.nodes() if n.get("Alive")}
        # Ray's per-node view of what is available (a developer API: ray.available_resources() has no per-node form)
        available = ray._private.state.available_resources_per_node()
        fixed = [asked[kind] for kind, n in counts.items() if asked[kind] is not None for _ in range(n)]
        share = fitting_share(_first_fit([available.get(node, {}).get("CPU", 0.0) for node in nodes], fixed), unset)
        if share < CPU_STEP:
            share = max(CPU_STEP, fitting_share(_first_fit(list(nodes.values()), fixed), unset))
        shares.update({kind: share for kind in counts if asked[kind] is None})
    return shares


class Crew:
    """A run's actors: the handle of each (kind, index) and where it runs ((node id, pid)), the spares (started,
    idle processes of each kind: a recovery configures one instead of starting a Python process), and how they are
    started, configured and placed. `open` says what they are configured with.

    CPUs and placement: `reserve` creates the run's placement group, one bundle per actor and per spare, each of
    the CPUs its kind asks for (`cpus_per_actor`), laid out by `options.placement`; an actor runs in its bundle. A
    replacement goes into the bundle of the actor it replaces (a spare brings its own, and the freed one goes to the
    next spare). An actor placed on a given node instead (a move onto a joined node, which the group has no bundle
    on, or a replacement when its bundle's node is gone) runs outside the group: a moved actor asks for its CPUs on
    that node; a replacement for a lost node's actor asks for none (the surviving nodes' CPUs are the group's: the
    run goes on, on fewer CPUs than it asked for, until it ends). `release` hands the group, with its actors idle
    in their bundles, to the pool for the next run of the same shape (`IdleActors`), or ends the actors and removes
    the group. With `placement` "none" there is no group: every actor is placed on a node (round robin) asking for
    no CPUs, taken from the pool's idle processes of its kind on that node, and given back to them at the end."""

    CLASSES = {"population": RemotePopulation, "shuffler": RemoteShuffler, "shard": RemoteShard}
    # the order a recovery probes them in: a shard's call waits for the shufflers', which wait for the populations'
    KINDS = tuple(CLASSES)

    def __init__(self, options, pool: IdleActors = IDLE_ACTORS):
        self.options, self.pool = options, pool
        self.handles: dict = {}      # (kind, index) -> actor handle of this run
        self.where: dict = {}        # (kind, index) -> (node id, pid)
        self.spare: dict = {kind: [] for kind in self.CLASSES}   # (node or None, handle, bundle or None)
        self.counts = {kind: 0 for kind in self.CLASSES}
        self.group = None            # the run's placement group
        self.cpus: dict = {}         # kind -> CPUs each actor of that kind asks for
        self.bundle: dict = {}       # (kind, index) -> its bundle in the group
        self.free: dict = {kind: [] for kind in self.CLASSES}    # bundles no actor holds, by kind
        self.outside: set = set()    # actors placed outside the group (see the class doc)
        self.suspect: set = set()    # nodes a recovery takes for lost: their bundles go to no spare
        self.warm: dict = {}         # bundle -> an idle actor already in it (a held reservation's), while opening
        self.kinds: list = []        # the kind of each bundle of the group
        self.nodes: list = []        # without a group: the nodes the actors go to, round robin (`home`)

    def open(self, config, plan, populations: list, shufflers: int) -> None:
        """What the actors are configured with: the run's config and shard plan, population actor a's populations
        (populations[a]), and the number of shufflers."""
        self.config, self.plan, self.populations = config, plan, populations
        self.counts = {"population": len(populations), "shuffler": shufflers, "shard": plan.shards}

    def keys(self) -> list:
        return [(kind, i) for kind, n in self.counts.items() for i in range(n)]

    def pids(self) -> dict:
        return {kind: [self.where[(kind, i)][1] for i in range(n)] for kind, n in self.counts.items()}

    # ---- the placement group ----------------------------------------------------------------------
    @property
    def reserving(self) -> bool:
        return self.options.placement != "none"

    def home(self, key, avoid: set) -> str | None:
        """Where the actor `key` starts: its bundle (None), or without a group a node of those `reserve` saw,
        round robin by index."""
        return node_for(key[1], self.nodes, avoid) if not self.reserving else None

    def reserve(self) -> None:
        """Create the run's placement group and wait until Ray has placed it (`placement_timeout`; None: as long
        as it takes, with a warning after WAIT_WARNING_S saying what it waits for). Without one ("none"), nothing."""
        opts = self.options
        if not self.reserving:
            self.cpus = {kind: 0.0 for kind in self.KINDS}
            self.nodes = cluster_nodes()     # once for the run's actors, not once for each
            return
        spares = {kind: opts.spares if n else 0 for kind, n in self.counts.items()}
        wanted = {kind: n + spares[kind] for kind, n in self.counts.items()}
        at = 0
        for kind in self.KINDS:
            self.bundle.update({(kind, i): at + i for i in range(self.counts[kind])})
            self.free[kind] = list(range(at + self.counts[kind], at + wanted[kind]))[::-1]   # the spares'
            at += wanted[kind]
        self.kinds = [kind for kind in self.KINDS for _ in range(wanted[kind])]
        held = self.pool.take_group(self.shape())
        if held is not None:        # the last run of this shape's group, its actors idle in their bundles
            self.group, self.cpus, self.warm = held.group, held.cpus, held.actors
            return
        self.pool.clear_groups()    # a held group of another shape frees its CPUs for this one
        self.cpus = cpus_per_actor({"population": opts.actor_cpus, "shuffler": opts.shard_cpus,
                                    "shard": opts.shard_cpus}, wanted)
        kinds = self.kinds
        self.group = placement_group([{"CPU": self.cpus[kind]} for kind in kinds],
                                     strategy=PLACEMENTS[opts.placement])
        asked = sum(self.cpus[kind] for kind in kinds)
        total = ray.cluster_resources().get("CPU", 0.0)
        def waiting():
            return (f"the run's placement group ({len(kinds)} bundles, {asked:g} CPUs, {opts.placement}) is not "
                    f"placed: the cluster has {ray.available_resources().get('CPU', 0.0):g} of its {total:g} CPUs "
                    f"available")
        if asked > total:
            warnings.warn(f"{waiting()}; the run waits for more nodes (an autoscaler) or fewer CPUs asked for "
                          f"(actor_cpus, shard_cpus)", RuntimeWarning, stacklevel=3)
        first = WAIT_WARNING_S if opts.placement_timeout is None else min(WAIT_WARNING_S, opts.placement_timeout)
        ready = self.group.wait(first)
        if not ready and opts.placement_timeout is None:
            warnings.warn(f"{waiting()}; waiting for other runs to end (placement_timeout: none)",
                          RuntimeWarning, stacklevel=3)
            while not ready:
                ready = self.group.wait(60)
        elif not ready and opts.placement_timeout > first:
            ready = self.group.wait(opts.placement_timeout - first)
        if not ready:
            message = f"{waiting()} within placement_timeout {opts.placement_timeout:g} s"
            self.unreserve()
            raise RunFault(message)

    def shape(self) -> tuple:
        """What a held reservation must match for this run to take it: the actors of each kind, the spares and
        what the options ask of Ray."""
        opts = self.options
        return (tuple(self.counts.items()), opts.spares, opts.actor_cpus, opts.shard_cpus, opts.placement)

    def unreserve(self) -> None:
        if self.group is not None:
            try:
                remove_placement_group(self.group)
            except Exception:       # Ray is gone: so is the group
                pass
            self.group = None

    def bundle_node(self, key) -> str | None:
        """The node the actor `key` runs on when it is in the group."""
        return None if key in self.outside else self.where.get(key, (None,))[0]

    def _new(self, kind: str, bundle: int | None = None, node: str | None = None, cpus: float = 0.0):
        if bundle is not None and bundle in self.warm:
            return self.warm.pop(bundle)
        if bundle is not None:
            strategy = PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=bundle)
            cpus = self.cpus[kind]
        elif cpus == 0:           # asks for nothing: any idle process of its kind on that node will do
            return self.pool.take(self.CLASSES[kind], node)
        else:
            strategy = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
        options = {"num_cpus": cpus, "scheduling_strategy": strategy}
        if plugins():   # the actor finds the same plugin classes as this driver (ldpfed/plugins.py)
            options["runtime_env"] = {"env_vars": {PLUGINS_VAR: plugins()}}
        return self.CLASSES[kind].options(**options).remote()

    # ---- actors ----------------------------------------------------------------------------------
    def start(self, kind: str, index: int, first_round: int, node: str | None = None, spare: bool = True,
              cpus: float = 0.0):
        """A new actor (or a spare: spare=True) for (kind, index): in its bundle (node None), or on `node` outside
        the group, asking for `cpus`; returns the ref of its `configure` call."""
        key = (kind, index)
        if spare and self.spare[kind]:        # a warm process: no interpreter and imports to wait for
            node, handle, bundle = self.spare[kind].pop()
            self._leave(key, free=key not in self.outside)
            self._hold(key, bundle)
        elif node is None:
            bundle = self.bundle.get(key)
            if bundle is None:
                bundle = self.free[kind].pop()
            self._hold(key, bundle)
            handle = self._new(kind, bundle=bundle)
        else:
            self._leave(key, free=cpus > 0)   # a move: its bundle's node is alive, the bundle goes to a spare
            self.outside.add(key)
            handle = self._new(kind, node=node, cpus=cpus)
        self.handles[key] = handle
        self.where[key] = (node, None)
        if kind == "population":
            return handle.configure.remote(self.config, self.populations[index], self.plan)
        if kind == "shuffler":
            return handle.configure.remote(self.config, self.plan, index)
        return handle.configure.remote(self.config, self.plan, index, 1, first_round)

    def _hold(self, key, bundle) -> None:
        if bundle is None:
            self.outside.add(key)
        else:
            self.outside.discard(key)
            self.bundle[key] = bundle

    def _leave(self, key, free: bool) -> None:
        """The actor `key` leaves its bundle (if it has one); free: the bundle's node is alive, a spare may use it."""
        bundle = self.bundle.pop(key, None)
        if bundle is not None and free and self.where.get(key, (None,))[0] not in self.suspect:
            self.free[key[0]].append(bundle)

    def configured(self, keys, refs) -> list:
        """Wait for the actors' `configure` calls; record where each one runs. Returns the keys whose actor died
        while being configured (its node is gone: Ray had not marked it dead yet), for the caller to place again;
        RunFault if some are not ready within first_round_timeout."""
        timeout = self.options.first_round_timeout
        ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
        if pending:
            late = [key for key, ref in zip(keys, refs) if ref in pending]
            raise RunFault(f"actors {late} were not ready within {timeout:.0f} s (first_round_timeout)")
        died = []
        for key, ref in zip(keys, refs):
            try:
                self.where[key] = tuple(ray.get(ref))
            except FAULTS:
                died.append(key)
        return died

    def place(self, keys, first_round: int, node_of, spare: bool = True, cpus=None) -> None:
        """Start and configure the actors `keys`, `node_of(key, avoid)` choosing each one's node (None: its
        bundle); an actor that dies while being configured is placed again, away from the nodes where that happened
        (up to max_recoveries times), so a node that died without Ray knowing yet is left behind. cpus(key): what
        an actor placed on a node asks for there (default none)."""
        avoid: set = set()
        for _ in range(self.options.max_recoveries + 1):
            refs = {}
            for key in keys:
                node = node_of(key, avoid)
                refs[key] = self.start(key[0], key[1], first_round, node, spare,
                                       cpus(key) if cpus and node is not None else 0.0)
            keys = self.configured(list(refs), list(refs.values()))
            if not keys:
                return
            avoid |= {self.where[key][0] for key in keys} - {None}
            for key in keys:
                kill(self.handles[key])
        raise RunFault(f"actors {keys} died each time they were placed (nodes tried: {len(avoid)})")

    def add_spares(self, wait: bool) -> None:
        """Top up `spares` idle actors of each kind (their process started, `node()` called once), each in a free
        bundle of its kind (or, when a lost node took that bundle, outside the group, asking for no CPUs)."""
        warming = []
        for kind in self.CLASSES:
            while len(self.spare[kind]) < (self.options.spares if self.counts[kind] else 0):
                if self.free[kind]:
                    bundle, node = self.free[kind].pop(), None
                    handle = self._new(kind, bundle=bundle)
                else:
                    bundle, node = None, node_for(len(self.spare[kind]), cluster_nodes(), set())
                    handle = self._new(kind, node=node)
                self.spare[kind].append((node, handle, bundle))
                warming.append(handle.node.remote())
        for handle in self.warm.values():       # none are left unless the layout changed; end any that are
            kill(handle)
        self.warm = {}
        if wait and warming:
            ray.get(warming, timeout=self.options.first_round_timeout)

    def move(self, moves: dict, r: int) -> list[dict]:
        """Move the actors `moves` ({key: node}, `moves_onto`) before round r: a new process on the node (not a
        spare, which may be anywhere; if it dies there, elsewhere), asking for its kind's CPUs there, then the old
        one killed. Returns the moves made (round, kind, index, old and new node and pid)."""
        old = {key: (self.handles[key], self.where[key]) for key in moves}
        self.place(list(moves), r, lambda key, avoid: moves[key] if moves[key] not in avoid
                   else node_for(key[1], cluster_nodes(), avoid), spare=False, cpus=lambda key: self.cpus[key[0]])
        made = []
        for key, (handle, (node, pid)) in old.items():
            kill(handle)
            made.append({"round": r, "kind": key[0], "index": key[1], "old_node": node, "old_pid": pid,
                         "new_node": self.where[key][0], "new_pid": self.where[key][1]})
        return made

    def release(self, reuse: bool = True) -> None:
        """End this run's actors and spares and remove its placement group; or, with reuse, when every actor and
        spare is in its bundle (no recovery or move put one outside the group), hand the group with its actors to
        the pool for the next run of the same shape."""
        in_bundles = {self.bundle[key]: handle for key, handle in self.handles.items() if key in self.bundle}
        in_bundles.update({bundle: handle for kind in self.spare for _, handle, bundle in self.spare[kind]
                           if bundle is not None})
        whole = (self.group is not None and not self.outside and not self.suspect
                 and len(in_bundles) == len(self.handles) + sum(map(len, self.spare.values())))
        if reuse and whole:
            self.pool.give_back_group(self.shape(), Reservation(self.group, self.cpus, self.kinds, in_bundles))
            self.group = None
        elif reuse and not self.reserving:     # no group: the processes wait by kind and node for any run
            for kind in self.spare:
                for node, handle, _ in self.spare[kind]:
                    self.pool.give_back(self.CLASSES[kind], node, handle)
            for key, handle in self.handles.items():
                self.pool.give_back(self.CLASSES[key[0]], self.where[key][0], handle)
        else:
            for kind in self.spare:
                for _, handle, _ in self.spare[kind]:
                    kill(handle)
            for handle in self.handles.values():
                kill(handle)
            self.unreserve()
        self.spare = {kind: [] for kind in self.CLASSES}
        self.handles.clear()

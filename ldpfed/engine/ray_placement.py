"""Where a Ray run's actors live: the cluster's nodes (`cluster_nodes`), the session's idle processes (`IdleActors`),
the run's actors and spares (`Crew`: start, configure, place, release) and which population actors move onto nodes
that joined (`moves_onto`)."""
from __future__ import annotations

import collections
import os

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ldpfed.engine.ray_actors import RemotePopulation, RemoteShard, RemoteShuffler
from ldpfed.engine.ray_faults import FAULTS, RunFault
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

    def clear(self) -> None:
        """Kill the idle processes."""
        for handles in self.idle.values():
            for handle in handles:
                kill(handle)
        self.reset()

    def reset(self) -> None:
        """Forget the idle processes (their Ray session has ended: they are gone with it)."""
        self.idle = {}


# The idle processes of this process's Ray session (a run started with its own Ray resets it when it stops Ray).
IDLE_ACTORS = IdleActors()


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


class Crew:
    """A run's actors: the handle of each (kind, index) and where it runs ((node id, pid)), the spares (started,
    idle processes of each kind: a recovery configures one instead of starting a Python process), and how they are
    started, configured and placed. `open` says what they are configured with."""

    CLASSES = {"population": RemotePopulation, "shuffler": RemoteShuffler, "shard": RemoteShard}
    # the order a recovery probes them in: a shard's call waits for the shufflers', which wait for the populations'
    KINDS = tuple(CLASSES)

    def __init__(self, options, pool: IdleActors = IDLE_ACTORS):
        self.options, self.pool = options, pool
        self.handles: dict = {}      # (kind, index) -> actor handle of this run
        self.where: dict = {}        # (kind, index) -> (node id, pid)
        self.spare: dict = {kind: [] for kind in self.CLASSES}
        self.counts = {kind: 0 for kind in self.CLASSES}

    def open(self, config, plan, populations: list, shufflers: int) -> None:
        """What the actors are configured with: the run's config and shard plan, population actor a's populations
        (populations[a]), and the number of shufflers."""
        self.config, self.plan, self.populations = config, plan, populations
        self.counts = {"population": len(populations), "shuffler": shufflers, "shard": plan.shards}

    def keys(self) -> list:
        return [(kind, i) for kind, n in self.counts.items() for i in range(n)]

    def pids(self) -> dict:
        return {kind: [self.where[(kind, i)][1] for i in range(n)] for kind, n in self.counts.items()}

    def start(self, kind: str, index: int, first_round: int, node: str | None = None, spare: bool = True):
        """A (reused or new) actor for (kind, index) on `node` (an alive node; default: round robin), or a spare
        (spare=True: a warm process, wherever it is); returns the ref of its `configure` call."""
        if node is None:
            nodes = cluster_nodes()
            node = nodes[index % len(nodes)]
        if spare and self.spare[kind]:        # a warm process: no interpreter and imports to wait for
            node, handle = self.spare[kind].pop()
        else:
            handle = self.pool.take(self.CLASSES[kind], node)
        self.handles[(kind, index)] = handle
        self.where[(kind, index)] = (node, None)
        if kind == "population":
            return handle.configure.remote(self.config, self.populations[index], self.plan)
        if kind == "shuffler":
            return handle.configure.remote(self.config, self.plan, index)
        return handle.configure.remote(self.config, self.plan, index, 1, first_round)

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

    def place(self, keys, first_round: int, node_of, spare: bool = True) -> None:
        """Start and configure the actors `keys`, `node_of(key, avoid)` choosing each one's node; an actor that dies
        while being configured is placed again, away from the nodes where that happened (up to max_recoveries
        times), so a node that died without Ray knowing yet is left behind."""
        avoid: set = set()
        for _ in range(self.options.max_recoveries + 1):
            refs = {key: self.start(key[0], key[1], first_round, node_of(key, avoid), spare) for key in keys}
            keys = self.configured(list(refs), list(refs.values()))
            if not keys:
                return
            avoid |= {self.where[key][0] for key in keys}
            for key in keys:
                kill(self.handles[key])
        raise RunFault(f"actors {keys} died each time they were placed (nodes tried: {len(avoid)})")

    def add_spares(self, wait: bool) -> None:
        """Top up `spares` idle actors of each kind (their process started, `node()` called once)."""
        warming = []
        for kind, cls in self.CLASSES.items():
            while len(self.spare[kind]) < (self.options.spares if self.counts[kind] else 0):
                node = cluster_nodes()[len(self.spare[kind]) % len(cluster_nodes())]
                handle = self.pool.take(cls, node)
                self.spare[kind].append((node, handle))
                warming.append(handle.node.remote())
        if wait and warming:
            ray.get(warming, timeout=self.options.first_round_timeout)

    def move(self, moves: dict, r: int) -> list[dict]:
        """Move the actors `moves` ({key: node}, `moves_onto`) before round r: a new process on the node (not a
        spare, which may be anywhere; if it dies there, elsewhere), then the old one killed. Returns the moves made
        (round, kind, index, old and new node and pid)."""
        old = {key: (self.handles[key], self.where[key]) for key in moves}
        self.place(list(moves), r, lambda key, avoid: moves[key] if moves[key] not in avoid
                   else node_for(key[1], cluster_nodes(), avoid), spare=False)
        made = []
        for key, (handle, (node, pid)) in old.items():
            kill(handle)
            made.append({"round": r, "kind": key[0], "index": key[1], "old_node": node, "old_pid": pid,
                         "new_node": self.where[key][0], "new_pid": self.where[key][1]})
        return made

    def release(self, reuse: bool) -> None:
        """Give this run's actors (and spares) back to the pool (reuse) or kill them."""
        for kind in self.spare:
            for node, handle in self.spare[kind]:
                if reuse:
                    self.pool.give_back(self.CLASSES[kind], node, handle)
                else:
                    kill(handle)
            self.spare[kind] = []
        for (kind, index), handle in self.handles.items():
            if reuse:
                self.pool.give_back(self.CLASSES[kind], self.where[(kind, index)][0], handle)
            else:
                kill(handle)
        self.handles = {}

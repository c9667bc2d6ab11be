"""Recovery of a Ray run from a failed round: probe every actor, kill and recreate the dead or unresponsive ones
(in their bundle of the run's placement group, or on another node when theirs is gone), rewind the surviving shards to the round; the backend then simulates
the round again from its derived streams, so the result is the undisturbed one, bit for bit."""
from __future__ import annotations

import time

import ray

from ldpfed.engine.ray_faults import FAULTS, RoundTimeout, RunFault
from ldpfed.engine.ray_placement import cluster_nodes, kill, node_for
from ldpfed.util.errors import describe_error


class Recovery:
    """Recovers `crew`'s actors (a `ray_placement.Crew`); `events` lists the recoveries (round, error, actors, time
    to detect and to recover)."""

    def __init__(self, options, crew):
        self.options, self.crew = options, crew
        self.events: list[dict] = []

    def probe(self, keys: list) -> dict:
        """{(kind, index): "died" | "unresponsive"} of the actors `keys` that fail a short call."""
        handles = self.crew.handles
        refs = {handles[k].node.remote(): k for k in keys}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=self.options.probe_timeout)
        bad = {k: "unresponsive" for ref, k in refs.items() if ref not in ready}
        for ref in ready:
            try:
                ray.get(ref)
            except Exception:
                bad[refs[ref]] = "died"
        return bad

    def recover(self, r: int, error: BaseException, began: float, rounds, active: list) -> None:
        """After round r failed with `error` (the round began at perf_counter `began`): replace the bad actors and
        rewind the shards `active`; `rounds` (a `ray_rounds.Rounds`) is reset and its failed calls settled."""
        crew, options = self.crew, self.options
        detected, detected_at = time.perf_counter(), time.time()
        rounds.reset()      # some actors will be new: nothing sent to the old ones is used again
        bad = {}
        # populations first: a shard call waits for their objects (via the shufflers); the tree's members before
        # their leaders: a leader waits for its members' calls, and answers once a frozen member is killed
        leaders = rounds.shape.leaders
        stages = [[key for key in crew.handles if key[0] == "population" and key not in leaders], sorted(leaders)]
        for keys in stages + [[key for key in crew.handles if key[0] == kind] for kind in crew.KINDS[1:]]:
            found = self.probe(keys)
            for key in found:
                kill(crew.handles[key])
            bad.update(found)
        events = [{"round": r, "kind": kind, "index": i, "cause": why, "old_node": crew.where[(kind, i)][0],
                   "old_pid": crew.where[(kind, i)][1]} for (kind, i), why in bad.items()]
        rounds.settle(options.probe_timeout)
        # A node none of whose actors answered may be gone (Ray marks a dead node only after its health checks
        # fail): its actors are placed on the other nodes; a node where some actor answered keeps its actors.
        answered = {crew.where[key][0] for key in crew.handles if key not in bad}
        suspect = {crew.where[key][0] for key in bad} - answered
        replace, survivors = list(bad), [("shard", s) for s in active if ("shard", s) not in bad]
        crew.suspect = suspect
        for _ in range(options.max_recoveries + 1):
            nodes = cluster_nodes()

            def node_of(key, avoid):
                """Its own bundle, or its own node outside the group, while that node is alive and trusted; else
                another node (outside the group: Ray moves a lost node's bundles only once it marks it dead)."""
                node = crew.where[key][0]
                if node in nodes and node not in suspect | avoid:
                    return None if key in crew.bundle else node
                return node_for(key[1], nodes, suspect | avoid)

            # an actor that ran outside the group on a node that is still there asks for its CPUs there again
            crew.place(replace, r, node_of, cpus=lambda key: crew.cpus[key[0]] if key in crew.outside
                       and crew.where[key][0] in nodes and crew.where[key][0] not in suspect else 0.0)
            # the surviving shards forget the round; one that fails to (it died meanwhile) is replaced as well
            replace = self.rewind(survivors, r)
            if not replace:
                break
            survivors = [key for key in survivors if key not in replace]
            events += [{"round": r, "kind": kind, "index": i, "cause": "died while recovering",
                        "old_node": crew.where[(kind, i)][0], "old_pid": crew.where[(kind, i)][1]}
                       for kind, i in replace]
            suspect |= {crew.where[key][0] for key in replace}
            crew.suspect = suspect
            for key in replace:
                kill(crew.handles[key])
        else:
            raise RunFault(f"round {r}: shards {replace} kept failing while the run recovered")
        for event in events:
            event["new_node"] = crew.where[(event["kind"], event["index"])][0]
        recovered = time.perf_counter()
        crew.add_spares(wait=False)      # the next spares start while the run goes on
        self.events.append({
            "round": r, "error": describe_error(error), "actors": events,
            "detected_at": detected_at, "detect_s": detected - began, "recover_s": recovered - detected})

    def rewind(self, keys, r: int) -> list:
        """Rewind the shards `keys` to round r; returns those that failed with a fault (dead or gone)."""
        timeout = self.options.first_round_timeout
        refs = {key: self.crew.handles[key].rewind.remote(r) for key in keys}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout)
        failed = []
        for key, ref in refs.items():
            try:
                if ref not in ready:
                    raise RoundTimeout(f"shard {key} did not rewind within {timeout:.0f} s")
                ray.get(ref)
            except FAULTS:
                failed.append(key)
        return failed

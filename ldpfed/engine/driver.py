"""The round loop, written once: both engines (and anything else that simulates rounds) run through `drive`.

A backend answers one question: "simulate the users of round r under this model; return the round's aggregate
and one `PopulationRow` per population (regret, metrics, users sending)". The driver does everything else, in
the one order that keeps the engines bit-identical: publish, simulate (the users the run's federation model lets
take part: `core.round_users`), add the rows in population order
(`combine_populations`), `algo.update` with the round's derived server stream, record, report progress, and
checkpoint (every N rounds or S seconds, and on an interrupt: see `checkpoint`). Recovery from dead or frozen
workers is the backend's (it re-simulates the round from its derived streams); resuming from a checkpoint is the
driver's.
"""
from __future__ import annotations

import time

from ldpfed.algorithms import make_algorithm
import numpy as np

from ldpfed.engine.core import RoundRecorder, add_sums, combine_populations, empty_aggregate, round_bounds
from ldpfed.envs import make_env
from ldpfed.federation import federation_model
from ldpfed.util.rng import derive
from ldpfed.util.threads import limited


class Backend:
    """Where a round's populations are simulated. `open` once (from round `first_round`), `simulate` per round,
    `close` once (ok: the run completed) returning the summary fields it adds."""

    name = "?"
    late_messages = False     # the backend itself can bring messages in a later round (the Ray engine's deadline)

    def open(self, config, algo, env, first_round: int) -> None:
        pass

    def simulate(self, model, round_index: int, start: int, stop: int) -> tuple[dict, list]:
        raise NotImplementedError

    def close(self, ok: bool) -> dict:
        return {}


class InFlight:
    """The server's side of late messages: each LateSum a round's rows bring is held until its arrival round, then
    checked against the sum bounds of its users (as a shard checks a pre-aggregated population sum: the server
    trusts no client) and folded after the round's own messages, in the order of their rounds and populations,
    the one order both engines fold them in. Kept in checkpoints, so a resumed run folds the same sums."""

    KEEP_MODELS = 1024          # published models kept for late sums that name their round (deadline mode)

    def __init__(self, algo):
        self.algo = algo
        self.due: dict = {}     # arrival round -> [(round sent, population, users, sums, model published then)]
        self.published: dict = {}

    def send(self, round_index: int, model, rows) -> None:
        self.published[round_index] = model
        self.published.pop(round_index - self.KEEP_MODELS, None)
        for row in sorted(rows, key=lambda row: row.population):
            for late in row.late:
                sent = round_index if late.sent is None else late.sent
                self.due.setdefault(late.arrival, []).append((sent, row.population, late.users, late.sums,
                                                              self.published.get(sent)))

    def fold(self, round_index: int, sums: dict | None) -> tuple[dict | None, int, int]:
        """(the round's sums with the late ones due now, users folded, users rejected)."""
        folded = rejected = 0
        for _, _, users, late, model in sorted(self.due.pop(round_index, []), key=lambda item: item[:2]):
            if self._reason(late, users, model) is None:
                sums = add_sums(sums, late)
                folded += len(users)
            else:
                rejected += len(users)
        return sums, folded, rejected

    def _reason(self, late: dict, users, model) -> str | None:
        bounds = self.algo.sum_bounds(users)
        for field, value in late.items():
            if field not in bounds:
                return f"unknown field {field}"
            flat = np.asarray(value, dtype=float).ravel()
            if not np.isfinite(flat).all():
                return f"{field}: not finite"
            why = bounds[field].reason(flat, model=model)
            if why is not None:
                return f"{field}: {why}"
        return None

    def waiting(self) -> int:
        """Users whose messages are still due (after the last round: never folded)."""
        return sum(len(item[2]) for items in self.due.values() for item in items)

    def snapshot(self) -> dict | None:
        return {str(arrival): items for arrival, items in self.due.items()} or None

    def restore(self, snapshot) -> None:
        self.due = {int(arrival): [tuple(item) for item in items] for arrival, items in (snapshot or {}).items()}


def drive(config, backend: Backend, progress=None, checkpointer=None):
    """Run `config` through `backend` to a RunResult. checkpointer: a `checkpoint.Checkpointer` (None: none);
    when its file exists the run continues from it (the result equals the uninterrupted run's, bit for bit).
    The rounds run with the BLAS pools of ldpfed.util.threads (one thread by default)."""
    with limited():
        return _drive(config, backend, progress, checkpointer)


def _drive(config, backend, progress, checkpointer):
    env = make_env(config)
    algo = make_algorithm(env, config)
    state = algo.initial_state(derive(config.seed, "init"))
    recorder = RoundRecorder(config, algo, env)
    # a federation model whose rounds can lose users: its rounds' users served are counted (a metric), and a round
    # in which no one took part folds an empty aggregate (the ideal one never has either: today's tables, bit for bit)
    federation = federation_model(config)
    late_messages = federation.late or backend.late_messages     # the federation's delays, or a deadline's
    partial = not federation.ideal or backend.late_messages
    in_flight = InFlight(algo)      # late messages, by the round they reach the server in
    first = 0
    if checkpointer is not None:
        checkpointer.check_writable()
        saved = checkpointer.load(config)
        if saved is not None:
            first, state = saved["next_round"], saved["state"]
            recorder.restore(saved["recorder"])
            in_flight.restore(saved.get("in_flight"))
    if progress is not None:   # the clock of the run's rate starts now, as the recorder's (after a resume: there)
        progress(round_bounds(first - 1, config.round_size, config.users)[1] if first else 0, recorder.cumulative)
    done = first          # rounds whose state and record are complete (the state is consistent between rounds)
    ok = False
    backend.open(config, algo, env, first)
    try:
        for r in range(first, config.rounds):
            start, stop = round_bounds(r, config.round_size, config.users)
            model = algo.publish(state)
            sums, rows = backend.simulate(model, r, start, stop)
            regret, metrics, sending = combine_populations(rows)
            if partial:
                metrics["users_served"] = sum(row.served for row in rows)
                if late_messages:
                    in_flight.send(r, model, rows)
                    sums, metrics["late_folded"], metrics["late_rejected"] = in_flight.fold(r, sums)
                if not sums:
                    sums = empty_aggregate(algo)
            done = None   # update may change the state in place: not consistent until the round is recorded
            state = algo.update(state, sums or {}, start, stop, derive(config.seed, "server", r))
            recorder.record(r, stop, regret, metrics, state, sending)
            done = r + 1
            if checkpointer is not None and done < config.rounds and checkpointer.due(done):
                checkpointer.save(config, done, state, recorder, in_flight.snapshot())
            if progress is not None:
                progress(stop, recorder.cumulative)
        ok = True
    except BaseException:
        # Interrupted (Ctrl-C, SIGTERM turned into an exception) or failed: keep what is complete, so a resume
        # loses nothing. Never a half-updated state: then the previous checkpoint stays.
        if checkpointer is not None and done is not None and done > (checkpointer.last_round or 0):
            try:
                checkpointer.save(config, done, state, recorder, in_flight.snapshot())
            except Exception:
                pass   # the error being raised matters more; the previous checkpoint is still there
        raise
    finally:
        extra = backend.close(ok)
    elapsed = time.perf_counter() - recorder.started
    extra = {"messages": recorder.messages,
             "messages_per_s": recorder.messages / elapsed if elapsed > 0 else float("inf"), **extra}
    if partial:       # the summary names the model and its options (an ideal run's summary is today's)
        extra.update(federation.summary())
        # the users whose messages are in some round's aggregate: each once, in its own round or on arrival
        extra["users_in_aggregates"] = recorder.messages + int(sum(row.get("late_folded", 0)
                                                                         for row in recorder.metric_rows))
        if late_messages:
            # due after the last round: held by the coordinator, or still on their way (a deadline run's)
            extra["late_messages_never_folded"] = in_flight.waiting() + extra.pop("late_messages_undelivered", 0)
    if first:
        extra["resumed_from_round"] = first
    if checkpointer is not None:
        extra["checkpoints_written"] = checkpointer.written
        extra["checkpoint_write_s"] = checkpointer.write_s
    return recorder.result(state, engine=backend.name, extra=extra)

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
from ldpfed.engine.core import RoundRecorder, combine_populations, empty_aggregate, round_bounds
from ldpfed.envs import make_env
from ldpfed.federation import federation_model
from ldpfed.util.rng import derive
from ldpfed.util.threads import limited


class Backend:
    """Where a round's populations are simulated. `open` once (from round `first_round`), `simulate` per round,
    `close` once (ok: the run completed) returning the summary fields it adds."""

    name = "?"

    def open(self, config, algo, env, first_round: int) -> None:
        pass

    def simulate(self, model, round_index: int, start: int, stop: int) -> tuple[dict, list]:
        raise NotImplementedError

    def close(self, ok: bool) -> dict:
        return {}


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
    partial = not federation.ideal
    first = 0
    if checkpointer is not None:
        checkpointer.check_writable()
        saved = checkpointer.load(config)
        if saved is not None:
            first, state = saved["next_round"], saved["state"]
            recorder.restore(saved["recorder"])
    if progress is not None:   # the clock of the run's rate starts now, as the recorder's (after a resume: there)
        progress(round_bounds(first - 1, config.round_size, config.users)[1] if first else 0, recorder.cumulative)
    done = first          # rounds whose state and record are complete (the state is consistent between rounds)
    ok = False
    backend.open(config, algo, env, first)
    try:
        for r in range(first, config.rounds):
            start, stop = round_bounds(r, config.round_size, config.users)
            sums, rows = backend.simulate(algo.publish(state), r, start, stop)
            regret, metrics, sending = combine_populations(rows)
            if partial:
                metrics["users_served"] = sum(row.served for row in rows)
                if not rows:
                    sums = empty_aggregate(algo)
            done = None   # update may change the state in place: not consistent until the round is recorded
            state = algo.update(state, sums or {}, start, stop, derive(config.seed, "server", r))
            recorder.record(r, stop, regret, metrics, state, sending)
            done = r + 1
            if checkpointer is not None and done < config.rounds and checkpointer.due(done):
                checkpointer.save(config, done, state, recorder)
            if progress is not None:
                progress(stop, recorder.cumulative)
        ok = True
    except BaseException:
        # Interrupted (Ctrl-C, SIGTERM turned into an exception) or failed: keep what is complete, so a resume
        # loses nothing. Never a half-updated state: then the previous checkpoint stays.
        if checkpointer is not None and done is not None and done > (checkpointer.last_round or 0):
            try:
                checkpointer.save(config, done, state, recorder)
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
    if first:
        extra["resumed_from_round"] = first
    if checkpointer is not None:
        extra["checkpoints_written"] = checkpointer.written
        extra["checkpoint_write_s"] = checkpointer.write_s
    return recorder.result(state, engine=backend.name, extra=extra)

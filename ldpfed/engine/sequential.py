"""The sequential engine: round size 1, one population, users one at a time in one compiled loop.

The papers' algorithms are sequential (B = 1). Every algorithm written once (ldpfed.algorithms.compiled) runs here,
built-in or plugin, with no per-algorithm code: `run_users` calls the algorithm's own compiled act, prepare,
finish, weigh / fold and update, the fields' mechanisms (ldpfed.mechanisms.rows) and the env's compiled step
(ldpfed.envs.base.EnvSteps), the same functions the round engines run. What differs is only where the random
numbers come from:

* streams="block" (the default): the randomness that does not depend on the model is drawn in chunks of CHUNK
  users, each kind from its own Generator: the world's (contexts, then the env's noise) from "sequential-world",
  the users' (act's draws, then the fields' mechanisms') from "sequential-client", the server's (draw_server) from
  "sequential-server". A round engine derives Generators per (population, round) instead (~20 us each), so a run
  here is a draw from the same distribution of results as run_local at B = 1, not the same bits
  (tests/test_sequential.py: a two-sample test over seeds).
* streams="generic" draws user t's numbers from the round engine's own Generators (slow, for tests): the run then
  reproduces run_local at round size 1 bit for bit.
Determinism: the same config gives the same result, bit for bit (CHUNK is a constant, not a tuning knob).

`engine.run(config)` uses this engine when `sequential_unsupported(config)` is None (round size 1, one population,
an algorithm written once, an env with a compiled step) unless `fast=False`; otherwise run_local.
"""
from __future__ import annotations

import time

import numpy as np
import pandas as pd

from numba import njit

from ldpfed.algorithms import make_algorithm
from ldpfed.algorithms.compiled import CompiledAlgorithm
from ldpfed.federation import FEDERATIONS
from ldpfed.engine.core import RunResult, checkpoint_rounds, make_result, privacy_summary
from ldpfed.envs import make_env
from ldpfed.util.errors import ConfigError
from ldpfed.util.jit import compile_seconds, loops
from ldpfed.util.memory import keep_freed_memory
from ldpfed.util.rng import derive
from ldpfed.util.threads import limited

CHUNK = 4096   # users per block of pre-drawn randomness (part of the stream definition: changing it changes results)
SUB_BYTES = 1 << 20   # a sub-block's contexts and message rows (not part of the stream definition: results do not move)
ENGINE_NAME = "sequential"

def user_loop(steps, env_step, layout):
    """The loop over users for these steps, this env step and this message layout (its fields' mechanisms compiled
    for it: FieldLayout.row_privatizer), all inlined (ldpfed.util.jit), compiled once per machine (ldpfed.util.jit's
    disk cache)."""
    def build(use):
        act, prepare, finish = use(steps.act), use(steps.prepare), use(steps.finish)
        weigh, fold, update, env = use(steps.weigh), use(steps.fold), use(steps.update), use(env_step)
        privatize_row = layout.row_privatizer()

        @njit
        def run_users(truth, state, model, consts, params, t0, contexts, noise, act_draws, enc_draws, server,
                      actions, inputs, rows, folded, regret, counts, estimate, snap_at, snaps):
            """Users t0, t0 + 1, ... of a block one at a time, each on the model its predecessor left: act, the
            env's step, prepare, the fields' mechanisms, finish, the weight (or fold), the server's update; after
            user i, when snap_at[i] >= 0, a copy of `estimate` (the state array that is the algorithm's estimate)
            into snaps[snap_at[i]]."""
            for i in range(actions.shape[0]):
                user = t0 + i
                act(model, consts, contexts, i, user, act_draws, actions)
                reward, regret[i] = env(truth, contexts, i, user, actions, noise)
                prepare(model, consts, contexts, actions, reward, user, i, inputs, counts)
                privatize_row(params, inputs[i], enc_draws[i], rows[i])
                finish(consts, user, rows[i])
                if fold is None:
                    weigh(consts, user, rows[i])
                    update(state, consts, rows[i], user, user + 1, server[i:i + 1])
                else:                   # the row folded into a zeroed aggregate row (Steps.fold)
                    folded[:] = 0.0
                    fold(consts, user, rows[i], folded)
                    update(state, consts, folded, user, user + 1, server[i:i + 1])
                if snap_at[i] >= 0:
                    snaps[snap_at[i], :] = estimate.ravel()

        return run_users

    return loops(("users", env_step, layout.key) + tuple(steps), build)


class StepsRunner:
    """Any compiled algorithm (ldpfed.algorithms.compiled) on any env with a compiled step: no per-algorithm code.
    Its draws: the world's (contexts, then the env's noise), the users' (act's, then the fields' mechanisms'), and
    the server's (draw_server), each block from its own Generator."""

    def __init__(self, algo, env, state):
        self.algo, self.env, self.state_dict = algo, env, state
        self.steps, self.env_steps = algo.compiled_steps(), env.compiled()
        self.layout, self.consts = algo.layout(), algo.compiled_consts()
        self.model = algo.model_tuple(algo.publish(state))      # views of the state: updates show through

    def _estimate_array(self):
        """The state array that `estimate` returns as it is (the compiled loop copies it at the checkpoints), or
        None (the loop then stops at each checkpoint and asks `estimate` in Python)."""
        value = self.algo.estimate(self.state_dict)
        found = [key for key in self.algo.state_keys if self.state_dict[key] is value]
        return self.state_dict[found[0]] if found else None

    def metric_names(self):
        return tuple(self.algo.metric_names)

    def estimate_shape(self):
        value = self.algo.estimate(self.state_dict)
        return None if value is None else np.shape(value)

    def state(self):
        return {key: np.array(value, copy=True) for key, value in self.state_dict.items()}

    def draw_world(self, users, rng):
        """(contexts, noise): contexts(lo, hi) gives the context rows of users[lo:hi] (Env.context_stream)."""
        contexts = self.env.context_stream(users, rng)
        return contexts, self.env.draw_noise(len(users), rng)

    def draw_client_users(self, users, rng):
        n = len(users)
        return self.algo.draw_act(n, rng), self.layout.draw(rng, n)

    def draw_server(self, users, rng):
        return self.algo.draw_server(len(users), rng)

    def _buffers(self, n: int, m: int):
        """(actions for a block of n users, inputs and rows for a sub-block of m), reused from block to block."""
        if getattr(self, "_cached", (None, None))[:2] != (n, m):
            width = self.layout.width
            self._cached = (n, m, self.algo.new_actions(n), np.zeros((m, width)), np.empty((m, width)))
        return self._cached[2:]

    def run_block(self, t0, world, client, server, snap_at, snaps, regret, counts, between_rng):
        algo, layout = self.algo, self.layout
        run_users = user_loop(self.steps, self.env_steps.step, layout)
        contexts, noise = world
        n = len(regret)
        # the loop runs sub-blocks of m users whose contexts and message rows fit in SUB_BYTES, so they stay in
        # cache from where they are written to where they are read (a block of ldp-ols-multi's rows is 41 MB, of
        # sparse-linear's contexts 330 MB): the same users in the same order, only fewer bytes through memory
        per_user = 8 * (2 * layout.width + int(np.prod(contexts(0, 0).shape[1:])))
        m = max(1, min(n, SUB_BYTES // max(per_user, 1)))
        actions, inputs, rows = self._buffers(n, m)
        folded = np.zeros(algo.sum_layout().width)
        state = algo.state_tuple(self.state_dict)
        estimate = self._estimate_array()
        flat_snaps = snaps.reshape(len(snaps), -1)
        # stop after each of the algorithm's breaks (its `between` step) and, when the estimate is not a state
        # array, after each checkpoint user (its estimate in Python: a few thousand in a run)
        breaks = {int(u) for u in algo.breaks(t0, t0 + n)}
        checkpoints = set() if estimate is not None else {int(i) + 1 for i in np.flatnonzero(snap_at >= 0)}
        stops = sorted(checkpoints | {u - t0 for u in breaks} | {n})
        in_loop = snap_at if estimate is not None else np.full(n, -1, dtype=np.int64)
        lo = 0
        for hi in stops:
            # (no users: one call on none, which compiles the loop, or loads it from the disk cache, before the first
            # user: _load)
            for a in range(lo, hi, m) if n else (0,):
                b = min(hi, a + m)
                s = slice(a, b)
                inputs[:b - a].fill(0.0)        # every user's row of inputs starts at zero
                run_users(self.env_steps.truth, state, self.model, self.consts, layout.params, t0 + a, contexts(a, b),
                          noise[s], client[0][s], client[1][s], server[s], actions[s], inputs[:b - a], rows[:b - a],
                          folded, regret[s], counts[s], np.zeros(0) if estimate is None else estimate, in_loop[s],
                          flat_snaps)
            if t0 + hi in breaks:
                algo.between(self.state_dict, t0 + hi, between_rng(t0 + hi - 1))
                state = algo.state_tuple(self.state_dict)
                self.model = algo.model_tuple(algo.publish(self.state_dict))
            if estimate is None and 0 < hi <= n and snap_at[hi - 1] >= 0:
                snaps[snap_at[hi - 1]] = np.reshape(algo.estimate(self.state_dict), snaps.shape[1:])
            lo = hi


def _plan(config):
    """(runner class, env, algo) or a reason string."""
    if config.round_size != 1:
        return f"round size {config.round_size} (the sequential engine runs round size 1)"
    if config.populations != 1:
        return f"{config.populations} populations (the sequential engine runs one)"
    if not FEDERATIONS[config.federation].ideal:
        return f"the {config.federation} federation model (the round engines decide who of a round takes part)"
    env = make_env(config)
    algo = make_algorithm(env, config)
    if not (isinstance(algo, CompiledAlgorithm) and algo.compiled_steps() is not None):
        return f"{config.algorithm} is not written as compiled steps (ldpfed.algorithms.compiled)"
    if env.compiled() is None:
        return f"env {env.name} has no compiled step"
    if algo.trust is not None and algo.trust.noise_at != "user":
        return (f"the {algo.trust.name} trust model (its noise is added at the {algo.trust.noise_at}, around a round's "
                f"aggregate)")
    return StepsRunner, env, algo


def sequential_unsupported(config) -> str | None:
    """None when the sequential engine can run `config`, else why not (engine.run then uses run_local)."""
    plan = _plan(config)
    return plan if isinstance(plan, str) else None


def _draws(runner, config, start, stop, streams):
    """(world, client, server draws, between_rng) of users [start, stop)."""
    users = np.arange(start, stop)
    if streams == "block":
        chunk = start // CHUNK
        world = runner.draw_world(users, derive(config.seed, "sequential-world", chunk))
        client = runner.draw_client_users(users, derive(config.seed, "sequential-client", chunk))
        server = runner.draw_server(users, derive(config.seed, "sequential-server", chunk))
        return world, client, server, lambda t: derive(config.seed, "sequential-between", int(t))
    # the generic engine's own Generators: population 0, round t (slow; tests); a `between` step after user t
    # continues the Generator that drew user t's server numbers, as the batched update does
    parts_w, parts_c, parts_s, server_rngs = [], [], [], {}
    for t in users:
        contexts, noise = runner.draw_world(np.array([t]), derive(config.seed, "context", 0, int(t)))
        parts_w.append((contexts(0, 1), noise))
        parts_c.append(runner.draw_client_users(np.array([t]), derive(config.seed, "privatize", 0, int(t))))
        server_rngs[int(t)] = derive(config.seed, "server", int(t))
        parts_s.append(runner.draw_server(np.array([t]), server_rngs[int(t)]))
    join = lambda parts: tuple(None if p[0] is None else np.concatenate(p) for p in zip(*parts))  # noqa: E731
    server = None if not parts_s or parts_s[0] is None else np.concatenate(parts_s)
    if server is None:
        server = np.zeros((0, 0))       # no users
    contexts, noise = join(parts_w)
    return ((lambda lo, hi: contexts[lo:hi]), noise), join(parts_c), server, server_rngs.__getitem__


def _load(runner, config, snaps):
    """Run the loop on zero users, so it is compiled (or loaded from the disk cache: ldpfed.util.jit) before the first
    user: the time it takes is the summary's compile_s, which users_per_s leaves out."""
    world, client, server, between_rng = _draws(runner, config, 0, 0, "block")
    empty = np.zeros(0, dtype=np.int64)
    runner.run_block(0, world, client, server, empty, snaps, np.zeros(0),
                     np.zeros((0, len(runner.metric_names())), np.int64), between_rng)


def run_sequential(config, progress=None, streams: str = "block") -> RunResult:
    """Run `config` (round size 1, one population) on its algorithm's compiled steps; see the module doc. Runs with
    the BLAS pools of ldpfed.util.threads (as `drive` does for the round engines)."""
    with limited():
        return _run_sequential(config, progress, streams)


def _run_sequential(config, progress, streams) -> RunResult:
    if streams not in ("block", "generic"):
        raise ConfigError("streams", streams, "must be 'block' or 'generic'")
    plan = _plan(config)
    if isinstance(plan, str):
        raise ConfigError("engine", ENGINE_NAME, f"cannot run this config: {plan}")
    cls, env, algo = plan
    keep_freed_memory()     # a block's draws (ldp-ols-multi's 22 MB of normals) reuse freed memory: no page faults
    privacy = privacy_summary(config, algo)      # refuses an overspending run (as RoundRecorder does)
    runner = cls(algo, env, algo.initial_state(derive(config.seed, "init")))
    T = config.users
    regret = np.empty(T)
    metric_names = runner.metric_names()
    counts = np.zeros((T, len(metric_names)), dtype=np.int64)
    checkpoints = np.array(sorted(checkpoint_rounds(T)), dtype=np.int64)
    snap_at = np.full(T, -1, dtype=np.int64)
    snap_at[checkpoints] = np.arange(len(checkpoints))
    shape = runner.estimate_shape()
    snaps = np.zeros((len(checkpoints), *(shape or (1,))))
    started, compiled_before = time.perf_counter(), compile_seconds()
    _load(runner, config, snaps)    # numba's compile (or load from the cache): compile_s, left out of the rates
    if progress is not None:
        progress(0, 0.0)            # a progress bar's rate counts from here too, as the summary's
    cumulative = 0.0
    for start in range(0, T, CHUNK):
        stop = min(T, start + CHUNK)
        world, client, server, between_rng = _draws(runner, config, start, stop, streams)
        runner.run_block(start, world, client, server, snap_at[start:stop], snaps, regret[start:stop],
                         counts[start:stop], between_rng)
        cumulative += float(np.sum(regret[start:stop]))
        if progress is not None:
            progress(stop, cumulative)
    state = runner.state()
    errors = np.full(T, np.nan)
    if shape is not None:
        for slot, r in enumerate(checkpoints):
            value = env.estimation_error(snaps[slot].reshape(shape))
            errors[r] = np.nan if value is None else value
    return _result(config, algo, env, metric_names, regret, counts, errors, state, started, privacy,
                   compile_seconds() - compiled_before)


def _result(config, algo, env, metric_names, regret, counts, errors, state, started, privacy,
            compile_s) -> RunResult:
    """The RunResult run_local would build (same table columns and summary keys: core.RoundRecorder.result and
    driver.drive's extras; tests/test_sequential.py compares them)."""
    elapsed = time.perf_counter() - started
    T = config.users
    rounds = np.arange(T, dtype=np.int64)
    table = pd.DataFrame({"round": rounds, "users": rounds + 1, "regret": regret,
                          "cumulative_regret": np.cumsum(regret), "estimation_error": errors})
    for j, name in enumerate(metric_names):
        table[name] = counts[:, j]
    # engine/driver.py's extras: every user sends one message (make_result takes the compile time out of the rate)
    extra = {"messages": T, "messages_per_s": T / elapsed if elapsed > 0 else float("inf")}
    return make_result(config, algo, env, table, state, engine=ENGINE_NAME, elapsed=elapsed,
                       final_regret=table["cumulative_regret"].iloc[-1], privacy=privacy, messages=T, extra=extra,
                       compile_s=compile_s)

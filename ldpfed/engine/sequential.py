"""The sequential engine: round size 1, one population, users one at a time in a compiled loop (kernels.py).

The papers' algorithms are sequential (B = 1); the generic engine runs them with a round per user (publish,
derive two Generators, act, encode, aggregate, update: ~0.2 ms of Python per user). This engine runs the same
algorithm with the same maths, the same mechanisms and calibrations (read from the algorithm instance), the same
clipping and the same ledger, but:

* the randomness that does not depend on the model is drawn in chunks of CHUNK users: contexts and reward noise
  from one "sequential-world" Generator per chunk (the env's own `contexts` draws them), the mechanisms' standard
  normals and uniforms from one "sequential-client" Generator per chunk, in the order the mechanisms draw them;
* the model-dependent part (act, reward, clip, privatize, update) is one compiled loop per algorithm.

Streams: the generic engine draws user t's randomness from Generators derived per (population, round); those
cost ~20 us each to build, so this engine uses per-chunk Generators instead. Each user's draws have the same
distribution as in the generic engine and are independent across users in both, so a run is a draw from the same
distribution of results, not the same bits (tests/test_sequential.py: a two-sample test over seeds). With
`streams="generic"` it draws user t's randomness from the generic engine's own Generators (slow, for tests):
the run then reproduces run_local at round size 1 up to floating-point rounding (also tested).
Determinism: the same config gives the same result, bit for bit (CHUNK is a constant, not a tuning knob).

`engine.run(config)` uses this engine when `sequential_unsupported(config)` is None (round size 1, one population,
an algorithm with a kernel, its env and options all supported) unless `fast=False`; otherwise run_local.
Anything a kernel does not know (an unknown algorithm option or env parameter, another link) falls back.
"""
from __future__ import annotations

import math
import time

import numpy as np
import pandas as pd

from numba import njit

from ldpfed.algorithms import make_algorithm
from ldpfed.algorithms.compiled import CompiledAlgorithm
from ldpfed.engine import kernels as kn
from ldpfed.engine.core import RunResult, checkpoint_rounds, make_result, privacy_summary
from ldpfed.envs import make_env
from ldpfed.errors import ConfigError
from ldpfed.mechanisms import sym_gather_index
from ldpfed.mechanisms.rows import privatize_row_fields
from ldpfed.normals import normal_array
from ldpfed.rng import derive

CHUNK = 4096   # users per block of pre-drawn randomness (part of the stream definition: changing it changes results)
ENGINE_NAME = "sequential"

GLM_SINGLE_ENVS = ("linear", "logistic")
GLM_ENV_KEYS = frozenset({"d", "K", "noise_std", "contexts"})  # contexts: drawn by env.contexts
LINK_CODES = {"identity": kn.IDENTITY, "logistic": kn.LOGISTIC}


class Kernel:
    """One algorithm on the sequential engine: checks support, holds the state as arrays, draws, runs."""

    algorithms: tuple = ()           # algorithm names
    envs: tuple = ()                 # env names
    env_keys: frozenset = frozenset()
    options: frozenset = frozenset()  # algorithm option keys the kernel knows (any value: constants are read)
    metrics: tuple = ()              # the algorithm's metric counters, in the order its encode returns them
    authors_code: bool = True        # also mirrors the algorithm under profile "authors-code"

    @classmethod
    def unsupported(cls, algo, env) -> str | None:
        if algo.profile != "paper" and not cls.authors_code:
            return f"profile {algo.profile} (this kernel mirrors the paper profile only)"
        if env.name not in cls.envs:
            return f"env {env.name} (kernel supports {list(cls.envs)})"
        extra = set(env.params) - cls.env_keys
        if extra:
            return f"env parameter(s) {sorted(extra)} unknown to the sequential kernel"
        extra = set(algo.params) - cls.options
        if extra:
            return f"algorithm option(s) {sorted(extra)} unknown to the sequential kernel"
        return cls.more_unsupported(algo, env)

    @classmethod
    def more_unsupported(cls, algo, env) -> str | None:
        return None

    def __init__(self, algo, env, state):
        self.algo, self.env = algo, env
        self.load(state)

    # world randomness, drawn from the run's world Generator exactly as the env draws it in `contexts` and `step`
    def draw_world(self, users, rng):
        contexts = self.env.contexts(users, rng)
        noise = rng.standard_normal(len(users)) if self.env.link == "identity" else rng.random(len(users))
        return contexts, noise

    def metric_names(self) -> tuple:
        """The metric counters' names, in the order the kernel writes them (the algorithm's encode order)."""
        return self.metrics

    def draw_client_users(self, users, rng):
        """The client randomness of `users` (a kernel whose draws depend on the arrival index overrides this)."""
        return self.draw_client(len(users), rng)

    def estimate_shape(self):
        return None if self.algo.estimate(self.state()) is None else np.shape(self.algo.estimate(self.state()))

    def draw_server(self, users, rng):
        return None

    def run_block(self, t0, world, client, server, snap_at, snaps, regret, counts, between_rng):
        self.run(t0, world, client, snap_at, snaps, regret, counts)


class _GLMSingle(Kernel):
    envs = GLM_SINGLE_ENVS
    env_keys = GLM_ENV_KEYS

    @classmethod
    def more_unsupported(cls, algo, env):
        if env.link not in LINK_CODES:
            return f"link {env.link}"
        return None

    def env_args(self):
        env = self.env
        return env.theta, LINK_CODES[env.link], float(env.noise_std)


class _GLMMulti(_GLMSingle):
    envs = ("linear-multi", "logistic-multi")
    # the counters of _GLMBase._clip when the inputs are not clipped (the authors' multi-parameter code)
    UNCLIPPED = ("unclipped_context_over_bound", "unclipped_reward_over_bound")

    def metric_names(self):
        return self.metrics if self.algo.clip_inputs else self.UNCLIPPED + self.metrics[2:]

    def load(self, state):
        self.theta = np.array(state["theta"], dtype=float)
        self.frozen = np.array([state["theta_warm"] is not None])
        self.theta_warm = np.array(state["theta"] if state["theta_warm"] is None else state["theta_warm"], float)
        self.n_msgs = np.array(state["n"], dtype=float)
        self.upper = sym_gather_index(self.algo.d).reshape(self.algo.d, self.algo.d).astype(np.int64)
        self.load_more(state)

    def load_more(self, state):
        pass

    def common_state(self):
        return {"theta": self.theta.copy(), "theta_warm": self.theta_warm.copy() if self.frozen[0] else None}

    def schedule(self, t0, n):
        """The public slot mask of users [t0, t0 + n) (the algorithm's slots: the warm-up arm is users % K, public)
        and every slot's message count after each of them."""
        users = np.arange(t0, t0 + n)
        sent, _ = self.algo.slots(users, users % self.algo.K)
        return sent, self.n_msgs + np.cumsum(sent, axis=0)


class LdpSgdMultiKernel(_GLMMulti):
    """Both profiles: the paper's (an l2-ball message per arm slot) and the authors' code's (OLS warm-up, then one
    l2-ball message of the whole K d gradient; kernels.ldp_sgd_multi_authors)."""

    algorithms = ("ldp-sgd-multi",)
    options = frozenset({"s0", "h", "step", "step_offset", "context_bound", "project"})
    metrics = ("clipped_context", "clipped_reward", "clipped")

    @classmethod
    def more_unsupported(cls, algo, env):
        if algo.authors and not math.isinf(algo.project):
            return "projection under profile authors-code"
        return super().more_unsupported(algo, env)

    def load_more(self, state):
        if self.algo.authors:
            self.V = np.array(state["V"], dtype=float)
            self.U = np.array(state["U"], dtype=float)

    def state(self):
        if self.algo.authors:
            return {**self.common_state(), "V": self.V.copy(), "U": self.U.copy(), "n": self.n_msgs.copy()}
        return {**self.common_state(), "n": self.n_msgs.copy()}

    def draw_client(self, n, rng):
        K, d = self.algo.K, self.algo.d
        return normal_array(rng, (n * K, d)), rng.random(n * K)   # L2BallMechanism on the n K slots

    def draw_client_users(self, users, rng):
        if not self.algo.authors:
            return self.draw_client(len(users), rng)
        # _encode_authors: the warm-up users' M then u noise (every slot), then the later users' K d-dimensional
        # l2-ball normals and uniforms
        a = self.algo
        K, d, n_warm = a.K, a.d, int(np.count_nonzero(np.asarray(users) < a.warm))
        n_post = len(users) - n_warm
        return (normal_array(rng, (n_warm, K, d * (d + 1) // 2)), normal_array(rng, (n_warm, K, d)),
                normal_array(rng, (n_post, K * d)), rng.random(n_post))

    def run(self, t0, world, client, snap_at, snaps, regret, counts):
        a, mech = self.algo, self.algo.mech
        n = len(regret)
        users = np.arange(t0, t0 + n)
        if a.authors:
            warm_shifts = np.array([a.warm_shift(t + 1) if t < a.warm else 0.0 for t in users], dtype=float)
            kn.ldp_sgd_multi_authors(self.theta, self.theta_warm, self.V, self.U, self.n_msgs, self.frozen, t0,
                                     world[0], world[1], *self.env_args(), LINK_CODES[self.env.link], a.C_B, a.c_r,
                                     bool(a.clip_inputs), a.mech_M.sigma, a.mech_u.sigma, self.upper, warm_shifts,
                                     a.R, mech.B, mech.tanh_half, a.predict_clip, a.authors_eta(users), a.b_scale,
                                     a.decay, a.warm, a.h, _clip_rtol(), *client, snap_at, snaps, regret, counts)
            return
        sent, _ = self.schedule(t0, n)
        eta = a.step / (a.message_counts(users) + a.step_offset)   # LdpSgdMulti.aggregate
        kn.ldp_sgd_multi(self.theta, self.theta_warm, self.n_msgs, self.frozen, t0, world[0], world[1],
                         *self.env_args(), LINK_CODES[self.env.link], a.C_B, a.c_r, a.R, mech.B, mech.tanh_half,
                         a.warm, a.h, _clip_rtol(), sent, eta, a.project, client[0], client[1], snap_at, snaps,
                         regret, counts)


class LdpOlsMultiKernel(_GLMMulti):
    algorithms = ("ldp-ols-multi", "ols-multi")
    options = frozenset({"s0", "h", "alpha", "calibration", "context_bound", "ridge"})
    metrics = ("clipped_context", "clipped_reward")

    def load_more(self, state):
        self.V = np.array(state["V"], dtype=float)
        self.U = np.array(state["U"], dtype=float)

    def state(self):
        return {"V": self.V.copy(), "U": self.U.copy(), "n": self.n_msgs.copy(), **self.common_state()}

    def draw_client(self, n, rng):
        K, d = self.algo.K, self.algo.d
        if not self.algo.private:
            return np.zeros((n, 1, 1)), np.zeros((n, 1, 1))
        return normal_array(rng, (n, K, d * (d + 1) // 2)), normal_array(rng, (n, K, d))

    def run(self, t0, world, client, snap_at, snaps, regret, counts):
        a = self.algo
        n = len(regret)
        sent, n_after = self.schedule(t0, n)
        private = bool(a.private)
        sigma_M, sigma_u = (a.mech_M.sigma, a.mech_u.sigma) if private else (0.0, 0.0)
        # LdpOlsMulti.update's shifts after each user (stop = t + 1)
        shifts = np.array([a.shifts(n_after[i], t0 + i + 1) for i in range(n)], dtype=float).reshape(n, a.K)
        kn.ldp_ols_multi(self.V, self.U, self.theta, self.theta_warm, self.n_msgs, self.frozen, t0, world[0],
                         world[1], *self.env_args(), a.C_B, a.c_r, bool(a.clip_inputs), sigma_M, sigma_u, self.upper,
                         a.warm, a.h, _clip_rtol(), sent, shifts, private, client[0], client[1], snap_at, snaps,
                         regret, counts)


def _clip_rtol():
    from ldpfed.clip import CLIP_RTOL

    return CLIP_RTOL


@njit      # not cached: functions as arguments (see ldpfed.algorithms.compiled)
def run_users(act, prepare, finish, weigh, fold, update, env_step, truth, state, model, consts, layout, params, t0,
              contexts, noise, act_draws, enc_draws, server, actions, inputs, rows, folded, regret, counts):
    """Users t0, t0 + 1, ... of a block one at a time, each on the model its predecessor left: act, the env's step,
    prepare, the fields' mechanisms, the weight, the server's update (ldpfed.algorithms.compiled: the functions the
    batched engine runs too)."""
    for i in range(actions.shape[0]):
        user = t0 + i
        act(model, consts, contexts, i, user, act_draws, actions)
        reward, regret[i] = env_step(truth, contexts, i, user, actions, noise)
        prepare(model, consts, contexts, actions, reward, user, i, inputs, counts)
        privatize_row_fields(layout, params, inputs[i], enc_draws[i], rows[i])
        finish(consts, user, rows[i])
        if fold is None:
            weigh(consts, user, rows[i])
            update(state, consts, rows[i], user, user + 1, server[i:i + 1])
        else:                   # the row folded into a zeroed aggregate row (Steps.fold)
            folded[:] = 0.0
            fold(consts, user, rows[i], folded)
            update(state, consts, folded, user, user + 1, server[i:i + 1])


class StepsRunner:
    """Any compiled algorithm (ldpfed.algorithms.compiled) on any env with a compiled step: no per-algorithm code.
    Its draws: the world's (contexts, then the env's noise), the users' (act's, then the fields' mechanisms'), and
    the server's (draw_server), each block from its own Generator."""

    def __init__(self, algo, env, state):
        self.algo, self.env, self.state_dict = algo, env, state
        self.steps, self.env_steps = algo.compiled_steps(), env.compiled()
        self.layout, self.consts = algo.layout(), algo.compiled_consts()
        self.model = algo.model_tuple(algo.publish(state))      # views of the state: updates show through

    def metric_names(self):
        return tuple(self.algo.metric_names)

    def estimate_shape(self):
        value = self.algo.estimate(self.state_dict)
        return None if value is None else np.shape(value)

    def state(self):
        return {key: np.array(value, copy=True) for key, value in self.state_dict.items()}

    def draw_world(self, users, rng):
        contexts = self.env.contexts(users, rng)
        return self.env.context_rows(contexts, len(users)), self.env.draw_noise(len(users), rng)

    def draw_client_users(self, users, rng):
        n = len(users)
        return self.algo.draw_act(n, rng), self.layout.draw(rng, n)

    def draw_server(self, users, rng):
        return self.algo.draw_server(len(users), rng)

    def run_block(self, t0, world, client, server, snap_at, snaps, regret, counts, between_rng):
        algo, steps, layout = self.algo, self.steps, self.layout
        contexts, noise = world
        n = len(regret)
        actions, inputs = algo.new_actions(n), np.zeros((n, layout.width))
        rows = np.empty((n, layout.width))
        folded = np.zeros(algo.sum_layout().width)
        state = algo.state_tuple(self.state_dict)
        # stop after each checkpoint user (its estimate, in Python: a few thousand in a run) and each of the
        # algorithm's breaks (its `between` step)
        breaks = {int(u) for u in algo.breaks(t0, t0 + n)}
        stops = sorted({int(i) + 1 for i in np.flatnonzero(snap_at >= 0)} | {u - t0 for u in breaks} | {n})
        lo = 0
        for hi in stops:
            if hi > lo or n == 0:       # (no users: compiles, or loads from numba's cache, before the clock starts)
                s = slice(lo, hi)
                run_users(steps.act, steps.prepare, steps.finish, steps.weigh, steps.fold, steps.update,
                          self.env_steps.step, self.env_steps.truth, state, self.model, self.consts, layout.layout,
                          layout.params, t0 + lo, contexts[s], noise[s], client[0][s], client[1][s], server[s],
                          actions[s], inputs[s], rows[s], folded, regret[s], counts[s])
            if t0 + hi in breaks:
                algo.between(self.state_dict, t0 + hi, between_rng(t0 + hi - 1))
                state = algo.state_tuple(self.state_dict)
                self.model = algo.model_tuple(algo.publish(self.state_dict))
            if 0 < hi <= n and snap_at[hi - 1] >= 0:
                snaps[snap_at[hi - 1]] = np.reshape(algo.estimate(self.state_dict), snaps.shape[1:])
            lo = hi


KERNELS = {name: cls for cls in (LdpSgdMultiKernel, LdpOlsMultiKernel) for name in cls.algorithms}


# ---------------------------------------------------------------------------------------------------------------
def _plan(config):
    """(runner class, env, algo) or a reason string."""
    if config.round_size != 1:
        return f"round size {config.round_size} (the sequential engine runs round size 1)"
    if config.populations != 1:
        return f"{config.populations} populations (the sequential engine runs one)"
    env = make_env(config)
    algo = make_algorithm(env, config)
    if isinstance(algo, CompiledAlgorithm) and algo.compiled_steps() is not None:
        if env.compiled() is None:
            return f"env {env.name} has no compiled step"
        return StepsRunner, env, algo
    cls = KERNELS.get(config.algorithm)
    if cls is None:
        return f"no sequential kernel for {config.algorithm}"
    reason = cls.unsupported(algo, env)
    return reason if reason else (cls, env, algo)


def sequential_unsupported(config) -> str | None:
    """None when the sequential engine can run `config`, else why not (engine.run then uses run_local)."""
    plan = _plan(config)
    return plan if isinstance(plan, str) else None


def _draws(kernel, config, start, stop, streams):
    """(world, client, server draws, between_rng) of users [start, stop)."""
    users = np.arange(start, stop)
    if streams == "block":
        chunk = start // CHUNK
        world = kernel.draw_world(users, derive(config.seed, "sequential-world", chunk))
        client = kernel.draw_client_users(users, derive(config.seed, "sequential-client", chunk))
        server = kernel.draw_server(users, derive(config.seed, "sequential-server", chunk))
        return world, client, server, lambda t: derive(config.seed, "sequential-between", int(t))
    # the generic engine's own Generators: population 0, round t (slow; tests); a `between` step after user t
    # continues the Generator that drew user t's server numbers, as the batched update does
    parts_w, parts_c, parts_s, server_rngs = [], [], [], {}
    for t in users:
        parts_w.append(kernel.draw_world(np.array([t]), derive(config.seed, "context", 0, int(t))))
        parts_c.append(kernel.draw_client_users(np.array([t]), derive(config.seed, "privatize", 0, int(t))))
        server_rngs[int(t)] = derive(config.seed, "server", int(t))
        parts_s.append(kernel.draw_server(np.array([t]), server_rngs[int(t)]))
    join = lambda parts: tuple(None if p[0] is None else np.concatenate(p) for p in zip(*parts))  # noqa: E731
    server = None if not parts_s or parts_s[0] is None else np.concatenate(parts_s)
    if server is None and isinstance(kernel, StepsRunner):
        server = np.zeros((0, 0))       # no users
    return join(parts_w), join(parts_c), server, server_rngs.__getitem__


def _load(kernel, config, snaps):
    """Run the kernel on zero users, so it is loaded from numba's disk cache (or compiled) before the clock starts."""
    world, client, server, between_rng = _draws(kernel, config, 0, 0, "block")
    empty = np.zeros(0, dtype=np.int64)
    kernel.run_block(0, world, client, server, empty, snaps, np.zeros(0),
                     np.zeros((0, len(kernel.metric_names())), np.int64), between_rng)


def run_sequential(config, progress=None, streams: str = "block") -> RunResult:
    """Run `config` (round size 1, one population) on its algorithm's compiled kernel; see the module doc."""
    if streams not in ("block", "generic"):
        raise ConfigError("streams", streams, "must be 'block' or 'generic'")
    plan = _plan(config)
    if isinstance(plan, str):
        raise ConfigError("engine", ENGINE_NAME, f"cannot run this config: {plan}")
    cls, env, algo = plan
    privacy = privacy_summary(config, algo)      # refuses an overspending run (as RoundRecorder does)
    kernel = cls(algo, env, algo.initial_state(derive(config.seed, "init")))
    T = config.users
    regret = np.empty(T)
    metric_names = kernel.metric_names()
    counts = np.zeros((T, len(metric_names)), dtype=np.int64)
    checkpoints = np.array(sorted(checkpoint_rounds(T)), dtype=np.int64)
    snap_at = np.full(T, -1, dtype=np.int64)
    snap_at[checkpoints] = np.arange(len(checkpoints))
    shape = kernel.estimate_shape()
    snaps = np.zeros((len(checkpoints), *(shape or (1,))))
    _load(kernel, config, snaps)
    started = time.perf_counter()   # after the one-off kernel load (or compile): run_local has none
    if progress is not None:
        progress(0, 0.0)            # a progress bar's rate counts from here too, as the summary's
    cumulative = 0.0
    for start in range(0, T, CHUNK):
        stop = min(T, start + CHUNK)
        world, client, server, between_rng = _draws(kernel, config, start, stop, streams)
        kernel.run_block(start, world, client, server, snap_at[start:stop], snaps, regret[start:stop],
                         counts[start:stop], between_rng)
        cumulative += float(np.sum(regret[start:stop]))
        if progress is not None:
            progress(stop, cumulative)
    state = kernel.state()
    errors = np.full(T, np.nan)
    if shape is not None:
        for slot, r in enumerate(checkpoints):
            value = env.estimation_error(snaps[slot].reshape(shape))
            errors[r] = np.nan if value is None else value
    return _result(config, algo, env, metric_names, regret, counts, errors, state, started, privacy)


def _result(config, algo, env, metric_names, regret, counts, errors, state, started, privacy) -> RunResult:
    """The RunResult run_local would build (same table columns and summary keys: core.RoundRecorder.result and
    driver.drive's extras; tests/test_sequential.py compares them)."""
    elapsed = time.perf_counter() - started
    T = config.users
    rounds = np.arange(T, dtype=np.int64)
    table = pd.DataFrame({"round": rounds, "users": rounds + 1, "regret": regret,
                          "cumulative_regret": np.cumsum(regret), "estimation_error": errors})
    for j, name in enumerate(metric_names):
        table[name] = counts[:, j]
    # engine/driver.py's extras: every user sends one message
    extra = {"messages": T, "messages_per_s": T / elapsed if elapsed > 0 else float("inf")}
    return make_result(config, algo, env, table, state, engine=ENGINE_NAME, elapsed=elapsed,
                       final_regret=table["cumulative_regret"].iloc[-1], privacy=privacy, messages=T, extra=extra)

"""The single-process engine: the reference every other engine must reproduce, and the fast path for tests."""
from __future__ import annotations

from ldpfed.algorithms import make_algorithm
from ldpfed.engine.core import RoundRecorder, add_sums, combine_populations, population_users, simulate_population
from ldpfed.envs import make_env
from ldpfed.rng import derive


def run_local(config, progress=None):
    """Run `config` (a RunConfig) for its T users in rounds of B; `progress(users_done, regret)` is optional."""
    env = make_env(config)
    algo = make_algorithm(env, config)
    state = algo.initial_state(derive(config.seed, "init"))
    recorder = RoundRecorder(config, algo, env)
    B, P = config.round_size, config.populations
    for r in range(config.rounds):
        start, stop = r * B, min(config.users, (r + 1) * B)
        model = algo.publish(state)
        sums, rows = None, []
        for p in range(P):
            users = population_users(start, stop, p, P)
            if len(users) == 0:
                continue
            payload, pop_regret, pop_metrics = simulate_population(algo, env, model, config.seed, r, p, users)
            sums = add_sums(sums, payload)
            rows.append((p, pop_regret, pop_metrics, len(users) if payload else 0))
        regret, metrics, sending = combine_populations(rows)
        state = algo.update(state, sums or {}, start, stop, derive(config.seed, "server", r))
        recorder.record(r, stop, regret, metrics, state, sending)
        if progress is not None:
            progress(stop, recorder.cumulative)
    return recorder.result(state, engine="single-process")

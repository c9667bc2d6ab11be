"""The sequential engine (round size 1, the algorithms' own compiled steps): same results as the round engine.

* Fed the round engine's own random draws (streams="generic"), every algorithm written once reproduces run_local at
  round size 1 bit for bit: the same functions on the same numbers.
* With its own chunked streams, a run is a draw from the same distribution: paired two-sample tests over seeds.
* engine.run picks it only where it applies, and falls back to run_local for anything it does not support.
The loops compile on first use in each process (numba), so sizes here are small.
"""
import numpy as np
import pandas as pd
import pytest
from scipy import stats

from ldpfed.algorithms import REGISTRY
from ldpfed.config import RunConfig
from ldpfed.engine import run, run_local
from ldpfed.algorithms.compiled import CompiledAlgorithm
from ldpfed.engine.sequential import run_sequential, sequential_unsupported

# (algorithm, env, env_params): every kernel on each env kind it supports
CASES = [
    ("uniform", "linear", {}), ("uniform", "bernoulli", {}),
    ("ldp-sgd", "linear", {}), ("ldp-sgd", "logistic", {"d": 3, "K": 4}), ("ldp-sgd", "poisson", {}),
    ("ldp-ols", "linear", {}), ("ldp-ols", "logistic", {"d": 3, "K": 4}), ("ols", "linear", {}),
    ("ldp-ols", "linear", {"contexts": "gaussian", "noise_std": 0.0}),   # unnormalised contexts: clipping matters
    ("ldp-ucb", "linear", {}), ("ldp-ucb", "logistic", {"d": 3, "K": 4}),
    ("ldp-gloc", "logistic", {}), ("ldp-gloc", "linear", {"d": 3, "K": 4, "contexts": "gaussian"}),
    ("ldp-mab-ucb", "bernoulli", {}), ("ldp-mab-ucb", "piecewise-bernoulli", {"breakpoints": 3}),
    ("ucb", "bernoulli", {"K": 3}),
    ("ldp-mab-adversarial", "bernoulli", {}), ("tsallis-inf", "piecewise-bernoulli", {"breakpoints": 2}),
    ("ldp-bco-one-point", "convex", {}), ("bco-one-point", "convex", {"d": 3, "spread": 0.0}),
    ("ldp-bco-two-point", "convex", {}), ("bco-two-point", "convex", {"d": 4}),
    ("ldp-sgd-multi", "linear-multi", {"d": 4}), ("ldp-sgd-multi", "logistic-multi", {"d": 3, "K": 2}),
    ("ldp-ols-multi", "linear-multi", {"d": 4}), ("ldp-ols-multi", "logistic-multi", {"d": 3, "K": 2}),
    ("ols-multi", "linear-multi", {"d": 3, "contexts": "gaussian"}),
    ("ldp-sgd-multi", "poisson-multi", {"d": 3}), ("ldp-ols-multi", "poisson-multi", {"d": 3, "K": 4}),
    ("ldp-sgd-multi", "classification", {"d": 8}), ("ldp-ols-multi", "classification", {"d": 6}),
    ("ols-multi", "classification", {}), ("uniform", "classification", {}),
    ("sw-klucb-cf", "piecewise-bernoulli", {"breakpoints": 2}), ("sw-klucb-cf", "bernoulli", {"K": 3}),
    ("klucb-cf", "piecewise-bernoulli", {}), ("sw-klucb", "piecewise-bernoulli", {}), ("klucb", "bernoulli", {}),
    ("klucb-cf", "bernoulli", {"K": 4}), ("sw-klucb", "bernoulli", {}), ("klucb", "piecewise-bernoulli", {}),
    ("sw-klucb-cf", "piecewise-bernoulli", {"K": 2, "breakpoints": 1, "means": [[0.9, 0.1], [0.2, 0.8]]}),
    ("linucb", "arm-pool", {}), ("linucb", "linear", {"d": 3, "K": 4}),
    ("private-linucb", "arm-pool", {}), ("private-linucb", "linear", {}),
    ("linucb-dgs", "arm-pool", {}), ("linucb-dgs", "linear", {"d": 3}),
    ("private-lasso", "sparse-linear", {}), ("lasso-bandit", "sparse-linear", {"d": 50, "s0": 3}),
]


def assert_same_run(a, b, rtol=1e-9):
    """Same table (columns, dtypes, values up to rounding; counters exactly), summary keys, ledger, state."""
    assert list(a.table.columns) == list(b.table.columns)
    assert list(a.table.dtypes) == list(b.table.dtypes)
    for column in a.table.columns:
        x, y = a.table[column].to_numpy(), b.table[column].to_numpy()
        if np.issubdtype(x.dtype, np.integer):
            assert np.array_equal(x, y), column
        else:
            np.testing.assert_allclose(x, y, rtol=rtol, atol=1e-12, equal_nan=True, err_msg=column)
    assert list(a.summary) == list(b.summary)
    assert a.summary["final_regret"] == pytest.approx(b.summary["final_regret"], rel=rtol)
    assert a.ledger == b.ledger
    assert a.env == b.env
    for key, value in a.state.items():
        if value is None or np.isscalar(value):
            assert value == b.state[key], key
        else:
            np.testing.assert_allclose(value, b.state[key], rtol=rtol, atol=1e-12, err_msg=key)


# Every kernel runs in the default suite on at least one env; these further env kinds of the multi-parameter kernels
# (each compiles its own kernel: 9-14 s apiece on 2 cores) run with the slow tests (jobs/slow_tests.py), so the
# default suite stays under 15 minutes.
SLOW_CASES = [("ldp-ols-multi", "logistic-multi"), ("ldp-ols-multi", "poisson-multi"),
              ("ldp-ols-multi", "classification"), ("ldp-sgd-multi", "logistic-multi"),
              ("ldp-sgd-multi", "poisson-multi"), ("ldp-sgd-multi", "classification"), ("ols-multi", "classification")]


@pytest.mark.parametrize("algorithm,env,env_params", [
    pytest.param(*case, marks=pytest.mark.slow) if case[:2] in SLOW_CASES else case for case in CASES])
def test_the_sequential_loop_reproduces_the_round_engine_on_its_draws(algorithm, env, env_params):
    config = RunConfig(algorithm, env=env, users=160, seed=5, env_params=env_params)
    if env_params.get("contexts") == "gaussian":
        assert run_local(config).table.filter(like="clipped").to_numpy().sum() > 0
    generic = run_local(config)
    sequential = run_sequential(config, streams="generic")
    assert sequential.summary["engine"] == "sequential" and generic.summary["engine"] == "single-process"
    # written once (ldpfed.algorithms.compiled): the same functions on the same draws, so the same bits
    assert_same_run(generic, sequential, rtol=0)
    assert generic.table["regret"].sum() > 0   # a run that learns something, not an all-zero table


def written_once(name):
    return issubclass(REGISTRY[name], CompiledAlgorithm) and all(
        getattr(REGISTRY[name], m) is getattr(CompiledAlgorithm, m) for m in CompiledAlgorithm.BATCHED)


def test_every_builtin_is_written_once_and_tested_here():
    builtins = {name for name in REGISTRY if REGISTRY.source(name) == "ldpfed"}
    assert {name for name in builtins if not written_once(name)} == set()
    assert {case[0] for case in CASES} == builtins


def test_same_seed_same_bits_and_seeds_differ():
    config = RunConfig("ldp-sgd", users=5000, seed=2)
    a, b = run_sequential(config), run_sequential(config)
    pd.testing.assert_frame_equal(a.table, b.table, check_exact=True)
    c = run_sequential(config.replace(seed=3))
    assert not np.array_equal(a.table["regret"], c.table["regret"])


# The authors' multi-parameter code (profile authors-code: unclipped N(0, I_d) contexts, OLS warm-up then one
# l2-ball message of the K d gradient for SGD): d = 4, K = 3, warm-up 3 x 50 users of the 600.
AUTHORS_MULTI = {"env_params": {"d": 4}, "params": {"s0": 50}, "delta": 0.1, "profile": "authors-code"}


@pytest.mark.parametrize("algorithm,setting", [("ldp-sgd", {}), ("ldp-ols", {}),
                                               ("ldp-sgd-multi", AUTHORS_MULTI), ("ldp-ols-multi", AUTHORS_MULTI)])
def test_chunked_streams_give_the_same_distribution(algorithm, setting):
    """Paired over seeds (the seed fixes the env; then the generic draws and the chunked draws are i.i.d. from the
    same law if the streams are equivalent, so each paired difference is symmetric about 0): Wilcoxon signed-rank
    test of final regret and final estimation error, at level 0.001 each (2 tests per case: false alarm <= 0.2%
    per case). streams="generic" stands for run_local (equal up to rounding, test above) at a fraction of its cost.
    Power check: the same test must reject a run at a different eps (final regret at eps 1 vs 4)."""
    seeds, users = range(80), 600

    def finals(streams, eps=1.0):
        out = [run_sequential(RunConfig(algorithm, users=users, seed=s, eps=eps, **setting), streams=streams).summary
               for s in seeds]
        return (np.array([s["final_regret"] for s in out]), np.array([s["final_estimation_error"] for s in out]))

    generic, chunked, other = finals("generic"), finals("block"), finals("block", eps=4.0)
    for g, c in zip(generic, chunked):
        assert stats.wilcoxon(g, c).pvalue > 1e-3
    assert stats.wilcoxon(generic[0], other[0]).pvalue < 1e-3


def test_engine_run_picks_the_sequential_engine_only_where_it_applies(monkeypatch):
    base = RunConfig("ldp-sgd", users=50, seed=1)
    assert sequential_unsupported(base) is None
    assert run(base).summary["engine"] == "sequential"
    assert run(base, fast=False).summary["engine"] == "single-process"
    for config in (base.replace(round_size=2), base.replace(round_size=2, populations=2)):
        assert sequential_unsupported(config) is not None
        assert run(config).summary["engine"] == "single-process"
    # an env without a compiled step, and an algorithm whose batched methods are written by hand
    from ldpfed.envs import ENVS

    monkeypatch.setattr(ENVS["linear"], "compiled", lambda self: None)     # (its batched step needs it: not run)
    assert "no compiled step" in sequential_unsupported(base)
    monkeypatch.undo()
    cls = REGISTRY["ldp-sgd"]
    monkeypatch.setattr(cls, "act", lambda self, *args: CompiledAlgorithm.act(self, *args))
    assert "not written as compiled steps" in sequential_unsupported(base)
    assert run(base).summary["engine"] == "single-process"


@pytest.mark.parametrize("algorithm,env,env_params", [
    ("ldp-sgd", "linear", {}), ("ldp-ols-multi", "linear-multi", {"d": 4}), ("private-linucb", "arm-pool", {}),
    ("lasso-bandit", "sparse-linear", {"d": 50, "s0": 3}), ("sw-klucb-cf", "piecewise-bernoulli", {})])
def test_sub_blocks_do_not_move_results(algorithm, env, env_params, monkeypatch):
    """The loop runs a block in sub-blocks of SUB_BYTES (contexts drawn as they are asked for: sparse-linear's
    context_stream): one user per sub-block gives the same bits as the default."""
    from ldpfed.engine import sequential

    config = RunConfig(algorithm, env=env, users=300, seed=4, env_params=env_params)
    default = run_sequential(config)
    monkeypatch.setattr(sequential, "SUB_BYTES", 1)
    assert_same_run(default, run_sequential(config), rtol=0)


def test_sparse_linear_context_stream_is_its_contexts():
    """Drawn in blocks as asked for, the contexts are those of `contexts`, and the Generator is left where it
    leaves it (the noise drawn next is the same); asked for out of order, it refuses."""
    from ldpfed.envs.sparse import SparseLinear

    env = SparseLinear(np.random.default_rng(0), 100, d=37, K=3)
    for n in (0, 1, 9):
        users = np.arange(n)
        eager, lazy = np.random.default_rng(7), np.random.default_rng(7)
        contexts, noise = env.contexts(users, eager), env.draw_noise(n, eager)
        stream = env.context_stream(users, lazy)
        assert np.array_equal(noise, env.draw_noise(n, lazy))
        parts = [stream(0, 0).copy()] + [stream(lo, min(n, lo + 4)).copy() for lo in range(0, n, 4)]
        assert np.concatenate(parts).tobytes() == contexts.tobytes()
        assert np.array_equal(contexts, np.random.default_rng(7).uniform(-1.0, 1.0, (n, 3, 37)))
        assert eager.bit_generator.state == lazy.bit_generator.state
    with pytest.raises(ValueError, match="in order"):
        env.context_stream(np.arange(5), np.random.default_rng(1))(2, 3)

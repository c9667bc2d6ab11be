"""The example plugin ldp-egreedy: found through its entry point, runs on both engines, learns, passes the kit.

Run from the repository's top folder (`.venv/bin/python -m pytest examples/ldp-egreedy/tests`) or from
examples/ldp-egreedy (`python -m pytest`); the package must be installed (`pip install -e examples/ldp-egreedy`).
"""
import math
from dataclasses import replace

import numpy as np
import pytest

from ldp_egreedy import LdpEpsGreedy
from ldpfed.algorithms import REGISTRY, make_algorithm
from ldpfed.config import RunConfig
from ldpfed.engine import run, run_local
from ldpfed.envs import make_env
from ldpfed.testing import CHECKS, check_algorithm
from ldpfed.util.errors import ConfigError

Z = 4.0      # one-sided normal tail 3.2e-5: how far from its mean a sum of independent gaps may fall by chance


@pytest.fixture(scope="module")
def ray_session():
    """A local Ray for this module, started as the engine starts one (ldpfed.engine.ray_engine.ensure_ray:
    loopback node, private token, no metrics exporter); an instance already running (the repository's own test
    session, RAY_ADDRESS) is used and left running. Skips if Ray cannot start."""
    ray = pytest.importorskip("ray")
    from ldpfed.engine.ray_engine import IDLE_ACTORS, ensure_ray

    try:
        started = ensure_ray(None, num_cpus=2, log_to_driver=False, logging_level="ERROR",
                             object_store_memory=512 * 1024**2)
    except Exception as error:     # no Ray on this machine (ports, shared memory): nothing to test here
        pytest.skip(f"Ray cannot start here: {type(error).__name__}: {error}")
    yield ray
    if started:
        IDLE_ACTORS.clear()
        ray.shutdown()


def test_found_through_its_entry_point():
    assert REGISTRY["ldp-egreedy"] is LdpEpsGreedy
    assert REGISTRY.source("ldp-egreedy") == "ldpfed-egreedy"      # the distribution that declares it


@pytest.mark.parametrize("round_size", [1, 50])
def test_runs_and_its_ledger_is_one_randomized_response(round_size):
    result = run(RunConfig("ldp-egreedy", users=2000, round_size=round_size))
    assert result.summary["messages"] == 2000 and np.isfinite(result.summary["final_regret"])
    [row] = result.ledger
    assert (row["message"], row["mechanism"], row["eps"], row["delta"]) == ("feedback", "randomized-response", 1.0, 0.0)
    assert result.summary["privacy_eps_composed"] == 1.0


def test_beats_uniform_play_by_a_derived_margin():
    """T = 20,000 users at eps = 1, the default world of seed 0 (10 Bernoulli arms), against uniform play on the
    same world. With Delta_a = max mu - mu_a, a uniform arm's gap has mean m1, second moment m2, variance v.

    Margin (above): if ldp-egreedy's arms were no better than uniform draws, the difference of the two regrets
    would have mean 0 and standard deviation sqrt(2 T v); it must be below uniform play's by Z of those.
    Floor (below): the explorers' arms ARE uniform draws; there are sum_t e_t = X of them in expectation, so their
    regret alone is at least X m1 - Z sqrt(X m2) (its variance is at most X m2): the algorithm explores as said."""
    T, seed = 20_000, 0
    config = RunConfig("ldp-egreedy", users=T, eps=1.0, seed=seed)
    egreedy = run(config).summary["final_regret"]
    uniform = run(replace(config, algorithm="uniform")).summary["final_regret"]
    means = make_env(config).segment_means[0]
    gaps = means.max() - means
    m1, m2, v = gaps.mean(), (gaps ** 2).mean(), gaps.var()
    c, K = LdpEpsGreedy.defaults["c"], len(means)
    X = np.minimum(1.0, c * K / np.arange(1, T + 1)).sum()
    margin = Z * math.sqrt(2 * T * v)
    assert egreedy < uniform - margin, (egreedy, uniform, margin)
    assert egreedy >= X * m1 - Z * math.sqrt(X * m2), (egreedy, X, m1)


def test_options_are_checked():
    with pytest.raises(ConfigError, match="params.c"):
        run(RunConfig("ldp-egreedy", users=100, params={"c": 0}))
    with pytest.raises(ConfigError, match="unknown option"):
        run(RunConfig("ldp-egreedy", users=100, params={"gamma": 1}))


def test_the_server_rejects_what_no_honest_client_sends():
    config = RunConfig("ldp-egreedy", users=100)
    domains = make_algorithm(make_env(config), config).cached_domains()
    users = np.arange(2)
    assert domains["pulls"].reason(np.eye(10)[[3, 7]], users) is None
    assert domains["pulls"].reason(np.array([np.eye(10)[3] + np.eye(10)[7]] * 2), users) is not None  # two arms
    assert domains["feedback"].reason(np.full((2, 10), 0.5), users) is not None                       # not bits


def test_conformance_kit_without_ray():
    """Every check of ldpfed's conformance kit passes; without Ray, "engines" compares two local runs only."""
    report = check_algorithm("ldp-egreedy", ray=False)
    assert list(report) == list(CHECKS)
    assert report.pop("engines").startswith("skipped: ray=False")
    assert set(report.values()) == {"passed"}, report


def test_conformance_kit_with_ray(ray_session):
    assert check_algorithm("ldp-egreedy", ray=True) == {check: "passed" for check in CHECKS}


def test_ray_engine_equals_the_single_process_engine(ray_session):
    """Both modes, bit for bit; in per-user mode the server shards check every user's message against
    message_domains()."""
    config = RunConfig("ldp-egreedy", users=1200, round_size=100, populations=4, seed=3)
    local = run_local(config)
    for mode in ("pre-aggregated", "per-user"):
        remote = run(config, engine="ray", actors=2, shards=2, mode=mode)
        assert remote.table.equals(local.table), mode


def test_the_sequential_engine_runs_it_and_reproduces_the_round_engine():
    """Written once: at B = 1 `run` takes the compiled sequential engine; fed the round engine's own random draws
    (streams="generic") it gives the same table, bit for bit."""
    from ldpfed.engine.sequential import run_sequential

    config = RunConfig("ldp-egreedy", users=1500, seed=4)
    assert run(config).summary["engine"] == "sequential"
    generic, sequential = run_local(config), run_sequential(config, streams="generic")
    assert generic.table.equals(sequential.table)
    assert generic.table["regret"].sum() > 0

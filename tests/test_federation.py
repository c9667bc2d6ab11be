"""The federation-model door (docs/federation.md): models found by name with their own options, validated before any
work and recorded; the ideal model is today's run bit for bit and draws nothing; availability lets each user of a
round answer with probability p, the same users on every engine and after a resume, and the users who are away
neither act nor send."""
import json
import math

import numpy as np
import pandas as pd
import pytest

from ldpfed.cli import main
from ldpfed.config import RunConfig
from ldpfed.engine import run_local
from ldpfed.engine.checkpoint import Checkpointer
from ldpfed.engine.core import population_users, round_bounds, round_users, simulate_population
from ldpfed.engine.local import LocalBackend
from ldpfed.algorithms import make_algorithm
from ldpfed.envs import make_env
from ldpfed.federation import FEDERATIONS, Federation, federation_model
from ldpfed.plugins import PluginError
from ldpfed.tracking.records import run_params
from ldpfed.util import rng as rng_module
from ldpfed.util.errors import ConfigError
from ldpfed.util.rng import derive


def small(algorithm="ldp-sgd", **changes):
    base = dict(users=600, round_size=20, populations=3, seed=5)
    return RunConfig(algorithm, **{**base, **changes})


def assert_same(expected, got):
    pd.testing.assert_frame_equal(expected.table, got.table, check_exact=True)
    assert expected.summary["final_regret"] == got.summary["final_regret"]


# ---- the door ---------------------------------------------------------------------------------------------------
def test_built_in_models_and_their_options():
    assert {"ideal", "availability"} <= set(FEDERATIONS)
    assert FEDERATIONS.source("ideal") == FEDERATIONS.source("availability") == "ldpfed"
    assert RunConfig("ldp-sgd").federation == "ideal" and RunConfig("ldp-sgd").federation_options == {}
    config = RunConfig("ldp-sgd", federation="availability")
    assert config.federation_options == {"p": 0.9, "p_by_population": None, "cycle": 0.0, "period": 24,
                                         "phase_by_population": None, "trace": None, "trace_sha256": None,
                                         "drop": "before"}  # recorded
    for bad, field, says in (({"q": 0.5}, "federation_options.q", r"known: \['cycle', 'drop', 'p', 'p_by_population'"),
                             ({"pp": 0.5}, "federation_options.pp", "did you mean 'p'"),
                             ({"p": 0.0}, "federation_options.p", r"must be a finite number in \(0, 1\]"),
                             ({"p": "half"}, "federation_options.p", "must be"),
                             ({"p_by_population": [0.5, 2.0]}, "federation_options.p_by_population", r"in \(0, 1\]")):
        with pytest.raises(ConfigError, match=says) as caught:
            RunConfig("ldp-sgd", federation="availability", federation_options=bad)
        assert caught.value.field == field
    with pytest.raises(ConfigError, match="3 populations") as caught:
        small(federation="availability", federation_options={"p_by_population": [0.5, 0.9]})
    assert caught.value.field == "federation_options.p_by_population"
    with pytest.raises(ConfigError, match="only the availability and realistic federation models take it") as caught:
        RunConfig("ldp-sgd", federation_options={"p": 0.5})
    assert caught.value.field == "federation_options.p"
    with pytest.raises(ConfigError, match="did you mean 'availability'") as caught:
        RunConfig("ldp-sgd", federation="availabilty")
    assert caught.value.field == "federation"
    # another federation model starts from its own options
    assert config.replace(federation="ideal").federation_options == {}


def test_trust_models_that_count_on_whole_rounds_plan_on_the_senders():
    # shuffle plans on every user by default: a round with fewer senders is refused, naming the option to lower
    with pytest.raises(ConfigError, match="below the 200 the batch is planned on") as caught:
        RunConfig("ldp-sgd", users=2000, round_size=200, trust="shuffle", federation="availability") and run_local(
            RunConfig("ldp-sgd", users=2000, round_size=200, trust="shuffle", federation="availability"))
    assert caught.value.field == "trust_options.min_participants"
    # local and central: the per-user guarantee does not depend on who else is in a round
    for trust in ("local", "central"):
        assert run_local(small(trust=trust, federation="availability")).summary["total_users_served"] < 600


class EvenUsers(Federation):
    """Only the users of even index answer (a plugin model, written as the docs say)."""

    name = "test-even"
    about = "the users of even index answer"

    def present(self, round_index, population, users):
        return users[users % 2 == 0]


def test_a_plugin_model_through_the_door():
    FEDERATIONS.register(EvenUsers)
    try:
        result = run_local(small(federation="test-even"))
        assert result.table["users_served"].tolist() == [10] * 30
        assert result.summary["federation"] == "test-even" and result.summary["messages"] == 300
    finally:
        FEDERATIONS.unregister("test-even")

    class Liar(Federation):
        name = "test-liar"
        ideal = True

        def present(self, round_index, population, users):
            return users[:1]

    with pytest.raises(PluginError, match="an ideal federation model changes nothing"):
        FEDERATIONS.register(Liar)


# ---- ideal: today's runs ----------------------------------------------------------------------------------------
def test_ideal_is_todays_run_and_draws_nothing(monkeypatch):
    config = small()
    default = run_local(config)
    # no federation stream may be drawn: without its purpose code, any draw would fail
    monkeypatch.setattr(rng_module, "PURPOSES", {k: v for k, v in rng_module.PURPOSES.items() if k != "federation"})
    ideal = run_local(config.replace(federation="ideal"))
    assert_same(default, ideal)
    assert "users_served" not in ideal.table and "federation" not in ideal.summary
    with pytest.raises(KeyError, match="federation"):       # the check can fail: availability draws that stream
        run_local(config.replace(federation="availability"))


# ---- availability -----------------------------------------------------------------------------------------------
def test_availability_matches_p_within_a_binomial_bound():
    # per population p: each population's share of a round, over every round (independent Bernoulli(p) draws)
    config = RunConfig("ldp-sgd", users=40_000, round_size=400, populations=2, seed=11, federation="availability",
                       federation_options={"p_by_population": [0.9, 0.3]})
    federation = federation_model(config)
    for p, prob in enumerate((0.9, 0.3)):
        offered = served = 0
        for r in range(config.rounds):
            start, stop = round_bounds(r, config.round_size, config.users)
            users = population_users(start, stop, p, config.populations)
            present = round_users(federation, r, start, stop, p, config.populations)
            assert np.isin(present, users).all() and np.all(np.diff(present) > 0)    # a subset, in order
            offered, served = offered + len(users), served + len(present)
        # 5 standard deviations: a false alarm has probability < 1e-6
        assert abs(served - offered * prob) < 5 * math.sqrt(offered * prob * (1 - prob)), (p, served, offered)


def test_users_away_neither_act_nor_send():
    config = small(federation="availability", federation_options={"p": 0.5})
    env = make_env(config)
    algo = make_algorithm(env, config)
    model = algo.publish(algo.initial_state(derive(config.seed, "init")))
    backend = LocalBackend()
    backend.open(config, algo, env, 0)
    federation = federation_model(config)
    for r in range(3):
        start, stop = round_bounds(r, config.round_size, config.users)
        sums, rows = backend.simulate(model, r, start, stop)
        expected, regret, served = None, 0.0, 0
        for p in range(config.populations):
            users = round_users(federation, r, start, stop, p, config.populations)
            if len(users):
                payload, pop_regret, _ = simulate_population(algo, env, model, config.seed, r, p, users)
                expected = payload if expected is None else {k: expected[k] + payload[k] for k in payload}
                regret += pop_regret
                served += len(users)
        # the aggregate is the present users' messages and nothing else; regret is theirs alone
        assert served < stop - start
        assert set(sums) == set(expected)
        for key in sums:
            np.testing.assert_array_equal(sums[key], expected[key])
        assert sum(row.regret for row in rows) == pytest.approx(regret)
        assert sum(row.served for row in rows) == served
    result = run_local(config)
    assert result.summary["messages"] == result.summary["total_users_served"] == result.table["users_served"].sum()
    assert all(row["users_sending"] == result.summary["messages"] for row in result.ledger)


def test_rounds_with_no_one_fold_an_empty_aggregate():
    config = small(round_size=2, populations=2, users=200, federation="availability", federation_options={"p": 0.2})
    result = run_local(config)
    served = result.table["users_served"]
    assert (served == 0).sum() > 10 and served.sum() > 0      # ~64% of the rounds are empty at p = 0.2
    assert np.isfinite(result.table["cumulative_regret"]).all()
    assert (result.table.loc[served == 0, "regret"] == 0).all()


def test_resume_after_a_checkpoint_gives_the_same_bits(tmp_path):
    class Interrupt(BaseException):
        pass

    def stop_at(users_done):
        def progress(done, regret):
            if done == users_done:
                raise Interrupt
        return progress

    config = small(federation="availability", federation_options={"p": 0.6})
    whole = run_local(config)
    with pytest.raises(Interrupt):
        run_local(config, progress=stop_at(300), checkpointer=Checkpointer(tmp_path, every_s=None))
    resumed = run_local(config, checkpointer=Checkpointer(tmp_path, every_s=None))
    assert resumed.summary["resumed_from_round"] == 15
    assert_same(whole, resumed)
    # the checkpoint is of this federation: another one's run refuses it
    with pytest.raises(Exception, match="written for another run"):
        run_local(config.replace(federation_options={"p": 0.7}), checkpointer=Checkpointer(tmp_path, every_s=None))


def test_ray_engine_gives_the_same_bits(ray_session):
    from ldpfed.engine.ray_engine import run_ray

    # 2 users per population and round at p = 0.5: a quarter of the populations have no one in a round
    config = small("ldp-ols", users=100, round_size=10, populations=5, federation="availability",
                   federation_options={"p": 0.5})
    local = run_local(config)
    assert (local.table["users_served"] < 10).all()
    for mode in ("pre-aggregated", "per-user"):
        remote = run_ray(config, actors=2, shards=2, mode=mode, placement="none")
        assert_same(local, remote)
        assert remote.summary["messages"] == local.summary["messages"]


# ---- where the options are given and recorded -------------------------------------------------------------------
def test_command_line_sweep_file_and_mlflow_params(tmp_path, capsys):
    assert main(["run", "ldp-sgd", "--users", "1000", "--round-size", "50", "--federation", "availability",
                 "--federation-option", "p=0.5", "--out", str(tmp_path / "run"), "--quiet"]) == 0
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["federation"] == "availability" and saved["federation_p"] == 0.5
    assert 400 < saved["total_users_served"] < 600
    with pytest.raises(SystemExit) as caught:
        main(["run", "ldp-sgd", "--federation", "availability", "--federation-option", "p=2", "--quiet"])
    assert caught.value.code == 2 and "--federation-option p" in capsys.readouterr().err
    assert main(["describe", "availability"]) == 0
    assert "p_by_population" in capsys.readouterr().out

    from ldpfed.sweep_spec import build, configs, read, to_toml

    path = tmp_path / "s.toml"
    path.write_text('name = "fed"\nalgorithms = ["ldp-sgd"]\nusers = 1000\nround_size = 50\npopulations = 2\n'
                    'federation = "availability"\n\n[federation_options]\np_by_population = [0.9, 0.4]\n')
    sweep = build(read(path))
    (run,) = configs(sweep)
    assert run.federation == "availability" and run.federation_options["p_by_population"] == [0.9, 0.4]
    again = tmp_path / "again.toml"
    again.write_text(to_toml(sweep))
    assert build(read(again)) == sweep
    path.write_text(path.read_text().replace("p_by_population", "per_pop"))
    with pytest.raises(ConfigError, match="federation_options.per_pop"):
        build(read(path))

    params = run_params(run_local(small(federation="availability", federation_options={"p": 0.8})))
    assert params["federation"] == "availability" and params["federation_options.p"] == "0.8"
    assert run_params(run_local(small()))["federation"] == "ideal"


def test_round_size_one_runs_on_the_round_engine():
    from ldpfed.engine import run

    config = RunConfig("ldp-sgd", users=200, federation="availability", federation_options={"p": 0.5})
    result = run(config)       # the compiled sequential loop is the ideal federation's: the round engine runs it
    assert result.summary["engine"] == "single-process"
    assert set(result.table["users_served"]) == {0, 1}
    with pytest.raises(SystemExit) as caught:
        main(["run", "ldp-sgd", "--users", "200", "--federation", "availability", "--path", "sequential", "--quiet"])
    assert caught.value.code == 2

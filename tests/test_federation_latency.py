"""Late messages and delayed feedback (the latency federation model, docs/federation.md): delays drawn with their
mean, a late message folded whole into the round it arrives in and checked there, lost past the deadline, the same
bits on both engines and after a resume with messages still in flight."""
import numpy as np
import pandas as pd
import pytest

from ldpfed.config import RunConfig
from ldpfed.engine import run_local
from ldpfed.engine.core import LateSum, PopulationRow, population_round, round_users, simulate_population
from ldpfed.engine.driver import InFlight
from ldpfed.algorithms import make_algorithm
from ldpfed.envs import make_env
from ldpfed.federation import federation_model
from ldpfed.federation.latency import draw_delays
from ldpfed.util.errors import ConfigError
from ldpfed.util.rng import derive


def small(algorithm="ldp-sgd", **changes):
    base = dict(users=600, round_size=20, populations=3, seed=5, federation="latency")
    return RunConfig(algorithm, **{**base, **changes})


def assert_same(expected, got):
    pd.testing.assert_frame_equal(expected.table, got.table, check_exact=True)
    assert expected.summary["final_regret"] == got.summary["final_regret"]


@pytest.mark.parametrize("law", ["geometric", "poisson"])
def test_delays_have_their_mean(law):
    n, mean = 200_000, 3.0
    drawn = draw_delays(np.random.default_rng(1), law, mean, n)
    variance = mean * (1 + mean) if law == "geometric" else mean
    assert drawn.min() >= 0 and abs(drawn.mean() - mean) < 5 * np.sqrt(variance / n)
    assert (draw_delays(np.random.default_rng(1), "fixed", 2.4, 5) == 2).all()


def test_a_late_message_is_folded_whole_in_its_arrival_round():
    config = small(federation_options={"latency": 2.0, "law": "fixed"})
    env = make_env(config)
    algo = make_algorithm(env, config)
    model = algo.publish(algo.initial_state(derive(config.seed, "init")))
    federation = federation_model(config)
    users = round_users(federation, 4, 80, 100, 1, 3)
    payload, regret, metrics, late, on_time = population_round(federation, algo, env, model, config.seed, 4, 1, users)
    expected, expected_regret, _ = simulate_population(algo, env, model, config.seed, 4, 1, users)
    assert payload == {} and len(on_time) == 0 and regret == expected_regret
    assert metrics["users_late"] == len(users) and metrics["users_lost"] == 0
    (arrival, late_users, sums, sent), = late
    assert sent is None                 # brought by the row of the round it was made in
    assert arrival == 6 and (late_users == users).all()
    for key in expected:
        assert np.array_equal(sums[key], expected[key])
    # the server holds it until round 6, then folds it after that round's own sums
    in_flight = InFlight(algo)

    in_flight.send(4, model, [PopulationRow(1, regret, metrics, 0, len(users), late)])
    assert in_flight.fold(5, None) == (None, 0, 0)
    folded, count, rejected = in_flight.fold(6, None)
    assert count == len(users) and rejected == 0 and in_flight.waiting() == 0
    assert all(np.array_equal(folded[key], expected[key]) for key in expected)


def test_the_server_rejects_a_late_sum_no_honest_users_could_send():
    config = small(federation_options={"latency": 1.0, "law": "fixed"})
    algo = make_algorithm(make_env(config), config)
    model = algo.publish(algo.initial_state(derive(config.seed, "init")))
    users = np.arange(3)
    honest, _, _ = simulate_population(algo, make_env(config), model, config.seed, 0, 0, users)
    forged = {key: np.full(np.shape(value), 1e9) for key, value in honest.items()}
    in_flight = InFlight(algo)

    in_flight.send(0, model, [PopulationRow(0, 0.0, {}, 0, 3, (LateSum(1, users, forged),))])
    assert in_flight.fold(1, None) == (None, 0, 3)


def test_conservation_and_the_deadline():
    config = small(federation_options={"latency": 1.5, "reward_delay": 1.0, "deadline": 3})
    table = run_local(config).table
    result = run_local(config)
    sent_on_time = table["users"].diff().fillna(table["users"].iloc[0])   # users per round
    late, lost, folded = table["users_late"].sum(), table["users_lost"].sum(), table["late_folded"].sum()
    assert lost > 0 and late > 0 and table["late_rejected"].sum() == 0
    # every late message (lost ones are counted apart) is folded, or still due after the last round
    assert folded + result.summary["late_messages_never_folded"] == late
    assert (table["users_served"] == sent_on_time).all()
    # deadline 0: every late message is lost, none folded
    strict = run_local(config.replace(federation_options={"latency": 1.5, "deadline": 0})).table
    assert strict["users_late"].sum() == 0 and strict["users_lost"].sum() > 0 and strict["late_folded"].sum() == 0


def test_resume_with_messages_in_flight_gives_the_same_bits(interrupted_and_resumed):
    whole, resumed = interrupted_and_resumed(small(federation_options={"latency": 3.0}), 300)
    assert resumed.summary["resumed_from_round"] == 15
    assert_same(whole, resumed)


def test_ray_engine_gives_the_same_bits(ray_session):
    from ldpfed.engine.ray_engine import run_ray

    config = small("ldp-ols", users=200, round_size=20, populations=5,
                   federation_options={"latency": 1.0, "reward_delay": 0.5, "deadline": 4})
    local = run_local(config)
    assert local.table["late_folded"].sum() > 0
    for mode in ("pre-aggregated", "per-user"):
        assert_same(local, run_ray(config, actors=2, shards=2, mode=mode, placement="none"))
    # Ray calls in the tree shape: the late sums come back through the group's leader
    assert_same(local, run_ray(config, actors=4, shards=1, transport="ray", group_size=2, placement="none"))


def test_an_algorithm_that_reads_sums_through_the_rounds_model_is_refused():
    with pytest.raises(ConfigError, match="importance weights"):
        small("ldp-mab-adversarial")
    small("ldp-mab-adversarial", federation="availability")      # absent users are no problem for it

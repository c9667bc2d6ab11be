"""Properties every registered algorithm must have, whatever its paper: it runs, it is reproducible, its
messages match its declared spec, and under local DP nothing raw leaves the client half."""
import numpy as np
import pytest

from ldpfed.algorithms import REGISTRY, make_algorithm
from ldpfed.config import RunConfig
from ldpfed.engine import run_local
from ldpfed.envs import make_env
from ldpfed.util.rng import derive

SMALL = {"users": 300, "round_size": 5, "populations": 2, "eps": 1.0, "delta": 0.05}


def small_config(name, **changes):
    return RunConfig(name, **{**SMALL, **changes})


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_runs_and_is_reproducible(name):
    first, second = run_local(small_config(name, seed=3)), run_local(small_config(name, seed=3))
    assert len(first.table) == 300 // 5
    assert first.table["users"].iloc[-1] == 300
    np.testing.assert_array_equal(first.table["cumulative_regret"], second.table["cumulative_regret"])
    assert np.isfinite(first.summary["final_regret"]) and first.summary["final_regret"] >= 0
    other = run_local(small_config(name, seed=4))
    assert not np.array_equal(first.table["regret"], other.table["regret"]), "the seed must matter"


def _one_round_of_messages(name, client_seed):
    config = small_config(name, seed=1)
    env = make_env(config)
    algo = make_algorithm(env, config)
    state = algo.initial_state(derive(config.seed, "init"))
    users = np.arange(40, 60)
    world = derive(0, "context", 0, 0)
    contexts = env.contexts(users, world)
    model = algo.publish(state)
    actions = algo.act(model, contexts, users, derive(0, "act", 0))
    rewards, _ = env.step(contexts, actions, users, world)
    messages, _ = algo.encode(model, contexts, actions, rewards, users, derive(client_seed, "privatize", 0, 0))
    return algo, messages


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_messages_match_spec(name):
    algo, messages = _one_round_of_messages(name, client_seed=0)
    spec = algo.message_spec()
    assert set(messages) == set(spec), "every user sends every declared field"
    for field, shape in spec.items():
        assert messages[field].shape == (20, *shape), field
        assert np.all(np.isfinite(messages[field])), field


LDP = sorted(name for name, cls in REGISTRY.items() if cls.privacy_model == "ldp")


@pytest.mark.parametrize("name", LDP)
def test_ldp_messages_are_randomized(name):
    """Same users, same data, different local randomness: every private field must vary for every user (a field
    that is a function of the raw data alone would repeat). A one-bit randomized-response report repeats with
    probability up to expit(eps) = 0.73 per draw, so we look across 40 client seeds: a randomized user repeats in
    all of them with probability <= 0.73^39 ~ 5e-6."""
    draws = [_one_round_of_messages(name, client_seed=seed) for seed in range(40)]
    algo = draws[0][0]
    private = set(draws[0][1]) - set(algo.public_fields)
    assert private, f"{name} is LDP but declares no private field"
    for field in private:
        values = np.stack([messages[field].reshape(20, -1) for _, messages in draws])  # (seeds, users, values)
        varies = np.any(values != values[:1], axis=(0, 2))
        assert np.all(varies), f"{name}.{field} is not randomized for users {np.flatnonzero(~varies)}"


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_ledger_names_its_model(name):
    config = small_config(name)
    algo = make_algorithm(make_env(config), config)
    ledger = algo.ledger()
    if algo.privacy_model == "none":
        assert ledger == []
    else:
        assert ledger, f"{name} is private but its ledger is empty"
        for row in ledger:
            assert row["model"] == algo.privacy_model
            assert 0 < row["eps"] and 0 <= row["delta"] < 1

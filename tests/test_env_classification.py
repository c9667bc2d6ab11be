"""The real-data world: scikit-learn's digits as a 10-armed multi-parameter contextual bandit."""
import socket

import numpy as np
import pytest

from ldpfed.config import RunConfig
from ldpfed.engine import run_local
from ldpfed.envs import ENVS, make_env
from ldpfed.envs.classification import digits_features
from ldpfed.util.errors import ConfigError
from ldpfed.util.rng import derive


def make(users=1000, **env_params):
    return make_env(RunConfig("uniform", env="classification", users=users, env_params=env_params))


def test_loads_offline(monkeypatch):
    """The data ship with scikit-learn: loading must not touch the network."""
    def no_network(*args, **kwargs):
        raise AssertionError("the classification env tried to open a network connection")

    monkeypatch.setattr(socket, "socket", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    digits_features.cache_clear()
    x, labels = digits_features(16)
    assert x.shape == (1797, 16) and labels.shape == (1797,)
    assert np.array_equal(np.bincount(labels), [178, 182, 177, 183, 181, 182, 181, 179, 174, 180])


def test_shapes_norms_and_determinism():
    env = make()
    assert ENVS["classification"] is type(env)
    assert (env.K, env.d, env.multi, env.reward_bound) == (10, 16, True, 1.0)
    users = np.arange(500, 800)
    ctx = env.contexts(users, derive(3, "context", 0, 1))
    assert ctx.shape == (300, 16)
    env.step(ctx, np.zeros(300, dtype=int), users, derive(3, "context", 0, 1))
    x = env.X
    norms = np.linalg.norm(x, axis=1)
    assert norms.max() <= 1.0 + 1e-12 and norms.max() > 0.99       # scaled to the unit ball, the largest on it
    np.testing.assert_allclose(x[:, -1], 1 / np.sqrt(2))            # bias coordinate
    np.testing.assert_allclose(x[:, :-1].mean(axis=0), 0, atol=1e-12)  # centered principal components
    assert env.estimation_error(np.zeros((10, 16))) is None
    # contexts are rows of the data set, drawn by the round's generator: same generator, same users
    again = make().contexts(users, derive(3, "context", 0, 1))
    np.testing.assert_array_equal(ctx, again)
    assert make(d=11).contexts(users, derive(3, "context", 0, 1)).shape == (300, 11)


def test_linear_structure_is_learnable():
    """A one-vs-rest least-squares fit on the contexts labels about 90% of the data set (chance: 10%)."""
    x, labels = digits_features(16)
    theta = np.linalg.lstsq(x, np.eye(10)[labels], rcond=None)[0]
    accuracy = np.mean(np.argmax(x @ theta, axis=1) == labels)
    assert 0.85 < accuracy < 0.97


def test_oracle_has_zero_regret_and_rewards_are_the_labels():
    env = make(users=5000)
    users = np.arange(5000)
    world = derive(0, "context", 0, 0)
    labels = env.labels[env.draw(users, derive(0, "context", 0, 0))]   # the same draws as contexts() makes
    ctx = env.contexts(users, world)
    rewards, regret = env.step(ctx, labels, users, world)
    assert np.all(rewards == 1.0) and np.all(regret == 0.0)
    world = derive(0, "context", 0, 1)
    labels = env.labels[env.draw(users, derive(0, "context", 0, 1))]
    rewards, regret = env.step(env.contexts(users, world), np.zeros(5000, dtype=int), users, world)
    np.testing.assert_array_equal(rewards, labels == 0)             # reward 1 exactly for the right class
    np.testing.assert_array_equal(rewards + regret, 1.0)


def test_uniform_regret_is_nine_tenths_per_user():
    """Uniform play is right with probability 1/10: mean regret 0.9, sd sqrt(0.09 / T) = 0.0024 at T = 16000."""
    T = 16_000
    result = run_local(RunConfig("uniform", env="classification", users=T, round_size=100, seed=5))
    assert result.summary["final_regret"] / T == pytest.approx(0.9, abs=4 * np.sqrt(0.09 / T))


def test_step_needs_its_contexts():
    env = make()
    with pytest.raises(RuntimeError):
        env.step(None, np.zeros(3, dtype=int), np.arange(3), derive(0, "context", 0, 0))


@pytest.mark.parametrize("params,field", [
    ({"d": 1}, "env_params.d"), ({"d": 66}, "env_params.d"), ({"d": 4.5}, "env_params.d"),
    ({"dim": 10}, "env_params.dim"), ({"K": 5}, "env_params.K"),
])
def test_bad_params_are_rejected(params, field):
    with pytest.raises(ConfigError) as err:
        make(**params)
    assert err.value.field == field


def test_a_whole_float_is_taken_as_its_integer():
    """One check for every integer option (ldpfed.util.errors.integer): 4.0 (JSON, TOML) is the integer 4."""
    assert make(d=4.0).d == 4 and isinstance(make(d=4.0).d, int)

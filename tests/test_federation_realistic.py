"""The realistic federation model (docs/federation.md): heterogeneous populations, dropouts, late messages and
delayed feedback at once run every algorithm (bar the two that cannot take late messages, refused) with the same
bits on the single-process and the Ray engine, and after a resume."""
import pandas as pd
import pytest

from ldpfed.algorithms import REGISTRY
from ldpfed.config import RunConfig
from ldpfed.engine import run_local
from ldpfed.federation import federation_model
from ldpfed.util.errors import ConfigError

OPTIONS = {"spread": 0.3, "size_alpha": 2.0, "p": 0.8, "drop": "after", "latency": 1.0, "reward_delay": 1.5,
           "deadline": 6}
CANNOT_TAKE_LATE = {"ldp-mab-adversarial", "tsallis-inf"}


def config(algorithm, **changes):
    return RunConfig(algorithm, users=240, round_size=24, populations=3, seed=9, federation="realistic",
                     federation_options={**OPTIONS, **changes})


def test_every_option_of_the_three_models_and_what_it_can_do():
    model = federation_model(config("ldp-sgd"))
    assert model.late and model.loses
    assert not federation_model(config("ldp-sgd", latency=0.0, reward_delay=0.0)).late
    assert {"spread", "sizes", "p", "cycle", "trace", "drop", "latency", "reward_delay", "deadline"} <= set(
        model.options)
    for algorithm in CANNOT_TAKE_LATE:
        with pytest.raises(ConfigError, match="importance weights"):
            config(algorithm)
        config(algorithm, latency=0.0, reward_delay=0.0)          # without delays they run


def test_every_algorithm_runs_with_the_same_bits_on_both_engines(ray_session):
    from ldpfed.engine.ray_engine import run_ray

    ran = []
    for algorithm in sorted(set(REGISTRY) - CANNOT_TAKE_LATE):
        run = config(algorithm)
        local = run_local(run)
        table = local.table
        assert table["users_lost"].sum() > 0 and table["users_late"].sum() > 0, algorithm
        remote = run_ray(run, actors=2, shards=2, placement="none")
        pd.testing.assert_frame_equal(table, remote.table, check_exact=True, obj=algorithm)
        ran.append(algorithm)
    assert len(ran) == len(REGISTRY) - len(CANNOT_TAKE_LATE)


def test_resume_gives_the_same_bits(interrupted_and_resumed):
    whole, resumed = interrupted_and_resumed(config("ldp-ols"), 120)
    assert resumed.summary["resumed_from_round"] > 0
    pd.testing.assert_frame_equal(whole.table, resumed.table, check_exact=True)

"""Availability as devices behave (docs/federation.md): a daily cycle, a trace of real participation, and users who
drop after acting (their messages lost); the old options keep their draws."""
import numpy as np
import pandas as pd
import pytest

from ldpfed.config import RunConfig
from ldpfed.engine import run_local
from ldpfed.engine.checkpoint import Checkpointer
from ldpfed.federation import federation_model
from ldpfed.util.errors import ConfigError
from ldpfed.util.rng import derive


def config(algorithm="ldp-sgd", users=600, round_size=20, populations=3, **options):
    return RunConfig(algorithm, users=users, round_size=round_size, populations=populations, seed=5,
                     federation="availability", federation_options=options)


def within_binomial(count, n, p, z=5.0):
    return abs(count - n * p) <= z * np.sqrt(n * p * (1 - p)) + 1e-9


def test_the_old_options_keep_their_draws():
    model = federation_model(config(p=0.6))
    users = np.arange(100, 200)
    expected = users[derive(5, "federation", 2, 7).random(100) < 0.6]
    assert np.array_equal(model.present(7, 2, users), expected)


def test_a_daily_cycle_sets_each_rounds_probability():
    model = federation_model(config(users=10**6, round_size=10**5, populations=1, p=0.5, cycle=0.8, period=4))
    users = np.arange(10**5)
    for r in range(8):
        p = 0.5 * (1 + 0.8 * np.sin(2 * np.pi * r / 4))
        assert model.probability(r, 0) == pytest.approx(p)
        assert within_binomial(len(model.present(r, 0, users)), len(users), p)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_a_trace_drives_participation_and_wraps_around(tmp_path, suffix):
    trace = pd.DataFrame({"round": [0, 0, 1, 1, 2, 2], "population": [0, 1, 0, 1, 0, 1],
                          "p": [0.9, 0.2, 0.5, 1.0, 0.1, 0.7]})
    path = tmp_path / f"trace{suffix}"
    trace.to_csv(path, index=False) if suffix == ".csv" else trace.to_parquet(path)
    run = config(users=10**6, round_size=20_000, populations=2, trace=str(path))
    model = federation_model(run)
    users = np.arange(10_000)
    for r in range(6):                       # rounds 3..5 repeat 0..2
        for k in range(2):
            p = trace.p[(trace["round"] == r % 3) & (trace.population == k)].item()
            assert model.probability(r, k) == p
            assert within_binomial(len(model.present(r, k, users)), len(users), p)
    assert len(model.summary()["federation_trace_sha256"]) == 64


def test_bad_traces_are_refused_before_any_work(tmp_path):
    def refused(frame, says, **extra):
        path = tmp_path / "bad.csv"
        frame.to_csv(path, index=False)
        with pytest.raises(ConfigError, match=says) as caught:
            config(populations=2, trace=str(path), **extra)
        assert caught.value.field in ("federation_options.trace", "federation_options.cycle")

    refused(pd.DataFrame({"round": [0], "q": [0.5]}), "lacks the column")
    refused(pd.DataFrame({"round": [0, 1], "p": [0.5, 1.5]}), r"outside \[0, 1\]")
    refused(pd.DataFrame({"round": [0, 2], "p": [0.5, 0.5]}), "no p for round 1")
    refused(pd.DataFrame({"round": [0], "population": [2], "p": [0.5]}), "population outside")
    refused(pd.DataFrame({"round": [0], "population": [0], "p": [0.5]}), "population 1")
    refused(pd.DataFrame({"round": [0], "p": [0.5]}), "drop the cycle", cycle=0.5)
    with pytest.raises(ConfigError, match="no such file"):
        config(trace=str(tmp_path / "missing.csv"))


def test_users_who_drop_after_acting_are_served_and_their_messages_lost():
    after = run_local(config("ldp-ols", p=0.6, drop="after"))
    table = after.table
    round_users_count = table["users"].diff().fillna(table["users"].iloc[0])
    assert (table["users_served"] == round_users_count).all()        # everyone acted
    lost = table["users_lost"].sum()
    assert within_binomial(lost, 600, 0.4)
    assert after.summary["messages"] == 600 - lost                    # only the sent ones reached the server
    before = run_local(config("ldp-ols", p=0.6))
    assert before.summary["total_users_served"] == 600 - lost         # the same users drop, before or after


def test_drop_after_is_the_same_on_ray_and_after_a_resume(ray_session, tmp_path):
    from ldpfed.engine.ray_engine import run_ray

    run = config("ldp-ols", users=200, round_size=20, populations=5, p=0.5, drop="after", cycle=0.5, period=4)
    local = run_local(run)
    for mode in ("pre-aggregated", "per-user"):
        pd.testing.assert_frame_equal(local.table, run_ray(run, actors=2, shards=2, mode=mode,
                                                           placement="none").table, check_exact=True)

    class Interrupt(BaseException):
        pass

    def progress(done, regret):
        if done == 100:
            raise Interrupt

    with pytest.raises(Interrupt):
        run_local(run, progress=progress, checkpointer=Checkpointer(tmp_path, every_s=None))
    pd.testing.assert_frame_equal(local.table, run_local(run, checkpointer=Checkpointer(tmp_path, every_s=None)).table,
                                  check_exact=True)


def test_dropping_users_do_not_make_a_late_message():
    # a user who drops loses its message; none is late, so an algorithm that cannot take late messages runs
    run = config("ldp-mab-adversarial", p=0.7, drop="after")
    assert not federation_model(run).late and federation_model(run).loses
    assert run_local(run).table["users_lost"].sum() > 0

"""Availability as devices behave (docs/federation.md): a daily cycle, a trace of real participation, and users who
drop after acting (their messages lost); the old options keep their draws."""
import hashlib

import numpy as np
import pandas as pd
import pytest

from ldpfed.config import RunConfig
from ldpfed.engine import run_local
from ldpfed.engine.checkpoint import CheckpointError, Checkpointer
from ldpfed.federation import federation_model
from ldpfed.util.errors import ConfigError
from ldpfed.util.rng import derive


def config(algorithm="ldp-sgd", users=600, round_size=20, populations=3, **options):
    return RunConfig(algorithm, users=users, round_size=round_size, populations=populations, seed=5,
                     federation="availability", federation_options=options)


def within_binomial(count, n, p, z=5.0):
    return abs(count - n * p) <= z * np.sqrt(n * p * (1 - p)) + 1e-9


def write_trace(path, frame):
    frame.to_parquet(path) if path.suffix == ".parquet" else frame.to_csv(path, index=False)
    return str(path)


def test_the_old_options_keep_their_draws():
    # p and p_by_population draw as they always have: one uniform per user from derive(seed, "federation", k, r)
    users = np.arange(100, 200)
    model = federation_model(config(p=0.6))
    expected = users[derive(5, "federation", 2, 7).random(100) < 0.6]
    assert np.array_equal(model.present(7, 2, users), expected)
    by_population = federation_model(config(p_by_population=[0.3, 1.0, 0.8]))
    for k, p in enumerate([0.3, 1.0, 0.8]):
        answer = users if p == 1 else users[derive(5, "federation", k, 4).random(100) < p]
        assert np.array_equal(by_population.present(4, k, users), answer)
    # dropping after acting: everyone acts, and exactly the users who would have been absent lose their message
    after = federation_model(config(p=0.6, drop="after"))
    assert np.array_equal(after.present(7, 2, users), users)
    assert np.array_equal(users[after.delays(7, 2, users) == 0], expected)
    assert set(after.delays(7, 2, users).tolist()) == {0, -1}


def test_a_daily_cycle_sets_each_rounds_probability():
    model = federation_model(config(users=10**6, round_size=10**5, populations=1, p=0.5, cycle=0.8, period=4))
    users = np.arange(10**5)
    for r in range(8):
        p = 0.5 * (1 + 0.8 * np.sin(2 * np.pi * r / 4))
        assert model.probability(r, 0) == pytest.approx(p)
        assert within_binomial(len(model.present(r, 0, users)), len(users), p)


def test_time_zones_shift_the_cycle_and_it_is_clipped_to_one():
    model = federation_model(config(populations=2, p=0.8, cycle=0.5, period=24, phase_by_population=[0, 6]))
    for r in range(30):
        assert model.probability(r, 1) == pytest.approx(min(1.0, 0.8 * (1 + 0.5 * np.sin(2 * np.pi * (r + 6) / 24))))
    assert model.probability(0, 1) == 1.0                     # 0.8 x 1.5 clipped
    users = np.arange(50)
    assert np.array_equal(model.present(0, 1, users), users)  # a probability of 1 takes everyone (and draws nothing)
    for bad in ([0, float("inf")], [0], [0, "6"]):
        with pytest.raises(ConfigError) as caught:
            config(populations=2, cycle=0.5, phase_by_population=bad)
        assert caught.value.field == "federation_options.phase_by_population"


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_a_trace_drives_participation_and_wraps_around(tmp_path, suffix):
    trace = pd.DataFrame({"round": [0, 0, 1, 1, 2, 2], "population": [0, 1, 0, 1, 0, 1],
                          "p": [0.9, 0.2, 0.5, 1.0, 0.1, 0.7]})
    path = write_trace(tmp_path / f"trace{suffix}", trace)
    run = config(users=10**6, round_size=20_000, populations=2, trace=path)
    model = federation_model(run)
    users = np.arange(10_000)
    for r in range(6):                       # rounds 3..5 repeat 0..2
        for k in range(2):
            p = trace.p[(trace["round"] == r % 3) & (trace.population == k)].item()
            assert model.probability(r, k) == p
            assert within_binomial(len(model.present(r, k, users)), len(users), p)
    sha256 = hashlib.sha256(open(path, "rb").read()).hexdigest()
    assert run.federation_options["trace_sha256"] == model.summary()["federation_trace_sha256"] == sha256


def test_a_trace_without_populations_holds_for_every_population(tmp_path):
    path = write_trace(tmp_path / "trace.csv", pd.DataFrame({"round": [1, 0], "p": [0.25, 0.75]}))
    model = federation_model(config(populations=3, trace=path))
    assert [[model.probability(r, k) for k in range(3)] for r in range(3)] == [[0.75] * 3, [0.25] * 3, [0.75] * 3]
    from_path = config(populations=3, trace=tmp_path / "trace.csv")        # a pathlib.Path is recorded as text
    assert from_path.federation_options["trace"] == path and from_path == config(populations=3, trace=path)


def test_bad_traces_are_refused_before_any_work(tmp_path):
    def refused(frame, says, field="federation_options.trace", suffix=".csv", **extra):
        path = write_trace(tmp_path / f"bad{suffix}", frame)
        with pytest.raises(ConfigError, match=says) as caught:
            config(populations=2, trace=path, **extra)
        assert caught.value.field == field

    refused(pd.DataFrame({"round": [0], "q": [0.5]}), "lacks the column")
    refused(pd.DataFrame({"round": [0], "q": [0.5]}), "lacks the column", suffix=".parquet")
    refused(pd.DataFrame({"round": [0, 1], "p": [0.5, 1.5]}), r"outside \[0, 1\]")
    refused(pd.DataFrame({"round": [0, 1], "p": [0.5, -0.1]}), r"outside \[0, 1\]", suffix=".parquet")
    refused(pd.DataFrame({"round": [0, 1], "p": [0.5, "half"]}), r"outside \[0, 1\] \(or not a number\)")
    refused(pd.DataFrame({"round": [0, 1.5], "p": [0.5, 0.5]}), "not an integer")
    refused(pd.DataFrame({"round": [0, 2], "p": [0.5, 0.5]}), "no p for round 1")
    refused(pd.DataFrame({"round": [0, 0], "p": [0.5, 0.6]}), "round 0 more than one p")
    refused(pd.DataFrame({"round": [0], "population": [2], "p": [0.5]}), "population outside")
    refused(pd.DataFrame({"round": [0], "population": [0], "p": [0.5]}), "no p for round 0, population 1")
    refused(pd.DataFrame({"round": [0, 0, 0], "population": [0, 1, 1], "p": [0.5] * 3}),
            "round 0, population 1 more than one p")
    refused(pd.DataFrame({"round": [], "p": []}), "no rows")
    refused(pd.DataFrame({"round": [0], "p": [0.5]}), "drop the cycle", field="federation_options.cycle", cycle=0.5)
    (tmp_path / "garbage.parquet").write_bytes(b"not parquet")
    for path, says in ((tmp_path / "missing.csv", "no such file"), (tmp_path / "garbage.parquet", "unreadable"),
                       (tmp_path, "no such file")):
        with pytest.raises(ConfigError, match=says) as caught:
            config(trace=str(path))
        assert caught.value.field == "federation_options.trace"
    for options in ({"trace_sha256": "0" * 64}, {"trace": write_trace(tmp_path / "t.csv", pd.DataFrame(
            {"round": [0], "p": [0.5]})), "trace_sha256": "ABC"}):
        with pytest.raises(ConfigError) as caught:
            config(**options)
        assert caught.value.field == "federation_options.trace_sha256"


def test_a_run_reads_the_trace_it_was_configured_with(tmp_path):
    # the trace's SHA-256 is in the config: a worker or a resume that finds other content is refused, not misled
    path = write_trace(tmp_path / "trace.csv", pd.DataFrame({"round": [0, 1], "p": [0.5, 0.8]}))
    run = config("ldp-ols", users=200, round_size=20, trace=path)

    class Interrupt(BaseException):
        pass

    def progress(done, regret):
        if done == 100:
            raise Interrupt

    with pytest.raises(Interrupt):
        run_local(run, progress=progress, checkpointer=Checkpointer(tmp_path / "run", every_s=None))
    write_trace(tmp_path / "trace.csv", pd.DataFrame({"round": [0, 1], "p": [0.5, 0.9]}))
    with pytest.raises(ConfigError, match="changed since the run was configured") as caught:
        federation_model(run)
    assert caught.value.field == "federation_options.trace"
    with pytest.raises(ConfigError, match="changed since"):
        RunConfig(**run.to_dict())
    again = config("ldp-ols", users=200, round_size=20, trace=path)   # the same options, read afresh
    assert again.federation_options["trace_sha256"] != run.federation_options["trace_sha256"]
    with pytest.raises(CheckpointError, match="another run"):
        run_local(again, checkpointer=Checkpointer(tmp_path / "run", every_s=None))


def test_users_who_drop_after_acting_are_served_and_their_messages_lost():
    after = run_local(config("ldp-ols", p=0.6, drop="after"))
    table = after.table
    round_users_count = table["users"].diff().fillna(table["users"].iloc[0])
    assert (table["users_served"] == round_users_count).all()        # everyone acted
    lost = table["users_lost"].sum()
    assert within_binomial(lost, 600, 0.4)
    assert after.summary["messages"] == 600 - lost                    # only the sent ones reached the server
    assert (table["users_late"] == 0).all()
    # in round 0 everyone acts on the same initial model as in the ideal federation: the same regret, all counted
    ideal = run_local(config("ldp-ols").replace(federation="ideal"))
    assert table["regret"].iloc[0] == ideal.table["regret"].iloc[0] > 0
    before = run_local(config("ldp-ols", p=0.6))
    assert before.summary["total_users_served"] == 600 - lost         # the same users drop, before or after
    assert before.table["regret"].iloc[0] < table["regret"].iloc[0]


def test_lost_messages_never_reach_the_aggregate():
    # almost no one answers: after acting, every message is lost, so the server learns exactly as much as when no
    # one shows up (an empty aggregate each round) while every user is served and its regret counted
    after = run_local(config("ldp-ols", p=1e-12, drop="after"))
    before = run_local(config("ldp-ols", p=1e-12))
    assert after.table["users_lost"].sum() == 600 and after.summary["messages"] == 0
    assert after.table["users_served"].sum() == 600 and before.table["users_served"].sum() == 0
    assert after.table["regret"].sum() > 0 == before.table["regret"].sum()
    pd.testing.assert_series_equal(after.table["estimation_error"], before.table["estimation_error"],
                                   check_exact=True)


def test_drop_after_is_the_same_on_ray_and_after_a_resume(ray_session, tmp_path):
    from ldpfed.engine.ray_engine import run_ray

    run = config("ldp-ols", users=200, round_size=20, populations=5, p=0.5, drop="after", cycle=0.5, period=4)
    local = run_local(run)
    for mode in ("pre-aggregated", "per-user"):
        pd.testing.assert_frame_equal(local.table, run_ray(run, actors=2, shards=2, mode=mode,
                                                           placement="none").table, check_exact=True)
    trace = write_trace(tmp_path / "trace.parquet", pd.DataFrame({"round": [0, 1, 2], "p": [0.3, 1.0, 0.6]}))
    traced = config("ldp-ols", users=200, round_size=20, populations=2, trace=trace, drop="after")
    pd.testing.assert_frame_equal(run_local(traced).table, run_ray(traced, actors=2, shards=2, mode="pre-aggregated",
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
    assert not federation_model(config(p=0.7)).loses
    result = run_local(run)
    assert result.table["users_lost"].sum() > 0 and "late_messages_never_folded" not in result.summary

"""A round that closes at a wall-clock deadline on Ray (docs/federation.md): a straggler's messages miss the rounds
it straggles in and are folded when they arrive, or lost; the record replays bit for bit on the single-process
engine; a generous deadline without stragglers is today's run."""
import json

import pandas as pd
import pytest

from ldpfed.config import RunConfig
from ldpfed.engine import run_local
from ldpfed.util.errors import ConfigError

# 12 rounds: each waits its 0.8 s deadline for the straggler, whose messages 2.5 s late then arrive within the run
CONFIG = RunConfig("ldp-ols", users=480, round_size=40, populations=4, seed=6)
# 1 of 2 actors' messages leave it 2.5 s after its work; the coordinator closes each round 0.8 s after sending it
# (room for the other actor's work on a loaded machine)
STRAGGLER = dict(actors=2, shards=2, placement="none", transport="ray", group_size=1, straggle_share=0.5,
                 straggle_s=2.5, deadline_s=0.8)


def replay(config, path):
    return config.replace(federation="replay", federation_options={"record": str(path)})


@pytest.mark.parametrize("late", ["fold", "drop"])
def test_a_stragglers_messages_miss_their_round_and_the_record_replays(ray_session, tmp_path, late):
    from ldpfed.engine.ray_engine import run_ray

    path = tmp_path / "deadline-record.json"
    result = run_ray(CONFIG, **STRAGGLER, late=late, deadline_record=str(path))
    record = json.loads(path.read_text())["late_population_rounds"]
    assert record == result.summary["deadline_record"]
    # the straggler hosts 2 of the 4 populations: they miss every round (on a loaded machine the other actor's
    # work may miss one too, e.g. its first round, which compiles)
    missed = {(e["round"], e["population"]) for e in record}
    every_round = {p for p in range(4) if all((r, p) in missed for r in range(CONFIG.rounds))}
    assert len(every_round) >= 2 and len(missed) >= 2 * CONFIG.rounds
    table = result.table
    if late == "fold":
        assert all(e["arrival"] is None or e["arrival"] > e["round"] for e in record)
        assert table["late_folded"].sum() > 0 and table["users_lost"].sum() == 0
    else:
        assert all(e["arrival"] is None for e in record)
        assert table["users_lost"].sum() >= CONFIG.users // 2 and table["late_folded"].sum() == 0
    # the record, replayed by the federation model on the single-process engine: the same table, bit for bit
    pd.testing.assert_frame_equal(table, run_local(replay(CONFIG, path)).table, check_exact=True)


def test_a_generous_deadline_without_stragglers_is_todays_run(ray_session):
    from ldpfed.engine.ray_engine import run_ray

    result = run_ray(CONFIG, actors=2, shards=2, placement="none", transport="ray", group_size=1, deadline_s=60.0)
    assert result.summary["deadline_record"] == []
    today = run_local(CONFIG).table
    for column in today.columns:
        pd.testing.assert_series_equal(today[column], result.table[column], check_exact=True)


def test_what_a_deadline_cannot_run_is_refused(tmp_path):
    from ldpfed.engine.ray_options import RayOptions, check_deadline

    with pytest.raises(ConfigError) as caught:
        RayOptions(deadline_s=1.0, mode="per-user")
    assert caught.value.field == "deadline_s"
    with pytest.raises(ConfigError):
        RayOptions(deadline_s=1.0, late="later")
    with pytest.raises(ConfigError, match="whole batch or sum"):
        check_deadline(RunConfig("ldp-ols", users=240, round_size=40, trust="secagg"), RayOptions(deadline_s=1.0))
    with pytest.raises(ConfigError, match="delays messages itself"):
        check_deadline(RunConfig("ldp-ols", users=240, round_size=40, federation="latency"), RayOptions(deadline_s=1.0))
    with pytest.raises(ConfigError, match="no such file"):
        replay(CONFIG, tmp_path / "none.json")

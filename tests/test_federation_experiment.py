"""jobs/federation_experiment.py at toy scale: each run's ratio is its regret over the uniform run of the same
federation (options included) and seed, and a refused combination is listed with its reason."""
import importlib.util
from pathlib import Path

import pytest

from ldpfed.config import RunConfig
from ldpfed.engine import run

JOB = Path(__file__).resolve().parent.parent / "jobs" / "federation_experiment.py"
spec = importlib.util.spec_from_file_location("federation_experiment", JOB)
job = importlib.util.module_from_spec(spec)
spec.loader.exec_module(job)

SMALL = {"users": 400, "round_size": 20, "populations": 2, "seeds": 1, "workers": 0}


def _uniform(env, federation="ideal", options=None):
    return run(RunConfig("uniform", env=env, users=400, round_size=20, populations=2, seed=0,
                         federation=federation, federation_options=options or {})).summary["final_regret"]


def test_the_ratio_is_against_uniform_under_the_same_federation():
    per_run, table = job.experiment(algorithms=("ldp-sgd",), trusts=("local",), dropouts=(0.5,), delays=(),
                                    spreads=(), **SMALL)
    dropped = per_run[per_run["axis"] == "dropout"].iloc[0]
    ideal = per_run[per_run["axis"] == "ideal"].iloc[0]
    under_dropouts = _uniform("linear", "availability", {"p": 0.5})
    assert under_dropouts != pytest.approx(_uniform("linear"))       # fewer users served: less regret for uniform
    assert dropped["uniform_regret"] == under_dropouts
    assert dropped["ratio"] == pytest.approx(dropped["final_regret"] / under_dropouts)
    assert ideal["ratio"] == pytest.approx(ideal["final_regret"] / _uniform("linear"))
    assert dropped["users_served"] < 400 and ideal["users_served"] == 400
    row = table[(table["axis"] == "dropout")].iloc[0]
    assert row["ratio"] == pytest.approx(dropped["ratio"]) and row["refused"] == ""


def test_a_refused_combination_is_listed_with_its_reason():
    per_run, table = job.experiment(algorithms=("ldp-mab-adversarial",), trusts=("local",), dropouts=(),
                                    delays=(5,), spreads=(), **SMALL)
    late = table[table["axis"] == "delay"].iloc[0]
    assert "federation" in late["refused"] and "late" in late["refused"]
    assert table[table["axis"] == "ideal"].iloc[0]["refused"] == ""
    assert any("refused (1)" in line for line in job.axis_table(table, "delay", 1.0))

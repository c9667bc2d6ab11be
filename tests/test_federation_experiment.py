"""jobs/federation_experiment.py at toy size: a point's ratio is the algorithm's regret over uniform play's under
the same federation model and seed, and a combination the system refuses is a row with its reason."""
import importlib.util
from pathlib import Path

from ldpfed.config import RunConfig
from ldpfed.engine import run_local

JOB = Path(__file__).resolve().parent.parent / "jobs" / "federation_experiment.py"
spec = importlib.util.spec_from_file_location("federation_experiment", JOB)
experiment = importlib.util.module_from_spec(spec)
spec.loader.exec_module(experiment)


def test_a_point_is_over_uniform_play_under_the_same_federation():
    row = experiment.point("ldp-sgd", "local", "dropout", 0.5, 2_000, 100, 2, 3, {})
    same = dict(users=2_000, round_size=100, populations=2, seed=3, federation="availability",
                federation_options={"p": 0.5})
    uniform = run_local(RunConfig("uniform", **same)).summary["final_regret"]
    regret = run_local(RunConfig("ldp-sgd", **same)).summary["final_regret"]
    assert row["uniform"] == uniform and row["regret"] == regret and row["ratio"] == regret / uniform
    # under the ideal federation uniform play serves twice the users: the ratio would be another
    ideal = run_local(RunConfig("uniform", **{**same, "federation": "ideal", "federation_options": {}}))
    assert ideal.summary["final_regret"] > 1.5 * uniform


def test_a_refused_combination_is_a_row_with_its_reason():
    row = experiment.point("ldp-sgd", "shuffle", "delay", 3, 2_000, 100, 2, 0, {})
    assert "late message" in row["refused"] and "ratio" not in row

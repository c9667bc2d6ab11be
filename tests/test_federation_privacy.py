"""Every trust model's reported guarantee under a federation model (docs/federation.md, docs/trust-models.md):
local and central are unchanged; shuffle plans its batch on a lower bound of the senders and refuses, or reports
at its real guarantee, a round below it; secure aggregation accounts the noise shares really in each round's sum;
shuffle and secure aggregation refuse late messages; the server-view audit runs under dropouts."""
import numpy as np
import pandas as pd
import pytest

from ldpfed.config import RunConfig
from ldpfed.engine import run_local
from ldpfed.engine.core import round_bounds
from ldpfed.federation import federation_model
from ldpfed.federation.rounds import round_senders
from ldpfed.server_audit import audit_server_view
from ldpfed.util.errors import ConfigError

AWAY = {"p": 0.9}          # availability: about 10% of each round's users away


def shuffled(algorithm="ldp-sgd", federation="availability", options=AWAY, **trust_options):
    return RunConfig(algorithm, users=20_000, round_size=2_000, populations=4, seed=1, trust="shuffle",
                     trust_options=trust_options, federation=federation, federation_options=options)


def senders_per_round(config):
    model = federation_model(config)
    return [len(round_senders(model, r, *round_bounds(r, config.round_size, config.users), config.populations))
            for r in range(config.rounds)]


def test_shuffle_plans_on_the_lower_bound_and_meets_the_target():
    config = shuffled(min_participants=0.8)
    assert min(senders_per_round(config)) >= 0.8 * config.round_size       # every round meets the bound
    summary = run_local(config).summary
    assert summary["privacy_shuffle_batch"] == 1600                        # planned on 80% of 2,000 users
    assert summary["privacy_eps_composed"] <= config.eps
    assert "privacy_shuffle_rounds_below" not in summary
    # the same run planned on every user has a larger eps0: the bound costs amplification
    ideal = run_local(shuffled(federation="ideal", options={})).summary
    assert ideal["privacy_eps0"] > summary["privacy_eps0"]


def test_a_round_below_the_bound_is_refused_or_reported():
    config_kwargs = dict(min_participants=0.95)
    assert min(senders_per_round(shuffled(min_participants=0.5))) < 0.95 * 2_000
    with pytest.raises(ConfigError, match="below the 1900 the batch is planned on") as caught:
        shuffled(**config_kwargs) and run_local(shuffled(**config_kwargs))
    assert caught.value.field == "trust_options.min_participants"
    reported = run_local(shuffled(below="report", **config_kwargs)).summary
    fewest = min(senders_per_round(shuffled(min_participants=0.5)))
    assert reported["privacy_shuffle_below_target"] and reported["privacy_shuffle_realized_batch"] == fewest
    assert reported["privacy_shuffle_rounds_below"] > 0
    assert reported["privacy_eps_composed"] > 1.0          # the real guarantee of the worst round: weaker


def test_the_shuffled_run_under_dropouts_is_the_same_on_ray(ray_session):
    from ldpfed.engine.ray_engine import run_ray

    config = RunConfig("ldp-sgd", users=2_000, round_size=500, populations=4, seed=2, trust="shuffle",
                       trust_options={"shufflers": 2, "min_participants": 0.6}, federation="availability",
                       federation_options={"p": 0.85, "drop": "after"})
    local = run_local(config)
    remote = run_ray(config, actors=2, shards=2, mode="per-user", placement="none")
    pd.testing.assert_frame_equal(local.table, remote.table, check_exact=True)
    assert local.table["users_lost"].sum() > 0


@pytest.mark.parametrize("trust", ["shuffle", "secagg"])
def test_late_messages_are_refused_by_the_batch_and_share_models(trust):
    with pytest.raises(ConfigError, match=f"the {trust} trust model: a late message") as caught:
        RunConfig("ldp-sgd", users=2_000, round_size=200, trust=trust, federation="latency")
    assert caught.value.field == "federation"


def test_secure_aggregation_accounts_the_shares_really_in_the_sum():
    base = dict(users=2_000, round_size=200, populations=2, seed=3, trust="secagg", federation="availability",
                federation_options={"p": 0.8})
    with pytest.raises(ConfigError, match="fewer than the"):
        RunConfig("ldp-sgd", **base, trust_options={"min_survivors": 0.9}) and run_local(
            RunConfig("ldp-sgd", **base, trust_options={"min_survivors": 0.9}))
    planned = run_local(RunConfig("ldp-sgd", **base, trust_options={"min_survivors": 0.6}))
    assert not planned.summary["privacy_secagg_below_target"]
    assert planned.summary["privacy_eps_composed"] <= 1.0 + 1e-9
    reported = run_local(RunConfig("ldp-sgd", **base, trust_options={"min_survivors": 1.0, "below": "report"}))
    assert reported.summary["privacy_secagg_below_target"]
    assert reported.summary["privacy_secagg_noise_ratio"] < 1.0
    assert reported.summary["privacy_eps_composed"] > 1.0          # fewer shares: less noise, a weaker guarantee
    # the masks of the absent users' never-sent shares are not in the sum: the aggregate decodes to the
    # senders' data (the run learns as the central run does, within the noise)
    assert np.isfinite(planned.table["cumulative_regret"]).all()
    assert planned.summary["final_regret"] < run_local(RunConfig("uniform", users=2_000, round_size=200,
                                                                 populations=2, seed=3, federation="availability",
                                                                 federation_options={"p": 0.8})).summary[
        "final_regret"]


@pytest.mark.parametrize("federation, options", [("availability", {"p": 0.7, "drop": "after"}),
                                                 ("latency", {"latency": 2.0, "deadline": 5})])
def test_central_keeps_its_guarantee_and_folds_each_message_at_most_once(federation, options):
    config = RunConfig("ldp-ols", users=3_000, round_size=100, populations=3, seed=4, trust="central",
                       federation=federation, federation_options=options)
    result = run_local(config)
    ideal = run_local(config.replace(federation="ideal"))
    assert result.summary["privacy_eps_composed"] == ideal.summary["privacy_eps_composed"] <= config.eps
    table = result.table
    # every served user's message is sent on time, folded late, lost, or still due after the last round: once
    late = table["late_folded"].sum() if "late_folded" in table else 0
    accounted = result.summary["messages"] + late + table["users_lost"].sum() + \
        result.summary.get("late_messages_never_folded", 0)
    assert accounted == table["users_served"].sum()


@pytest.mark.parametrize("trust, options", [("shuffle", {"min_participants": 0.7}), ("central", {}),
                                            ("local", {})])
def test_the_server_view_audit_under_dropouts(trust, options):
    audited = audit_server_view("ldp-sgd", trust, users=200, repetitions=300, federation="availability",
                                federation_options={"p": 0.8}, trust_options=options)
    assert not audited["flagged"] and audited["lower_bound"] <= audited["claimed_eps"]
    with pytest.raises(ConfigError, match="does not send"):
        absent = next(u for u in range(200) if u not in set(round_senders(
            federation_model(RunConfig("ldp-sgd", users=200, round_size=200, federation="availability",
                                       federation_options={"p": 0.8})), 0, 0, 200, 1).tolist()))
        audit_server_view("ldp-sgd", trust, users=200, repetitions=10, federation="availability",
                          federation_options={"p": 0.8}, trust_options=options, canary=absent)

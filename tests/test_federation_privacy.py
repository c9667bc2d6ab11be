"""Every trust model's reported guarantee under a federation model (docs/federation.md, docs/trust-models.md):
local and central are unchanged (a user's message is folded into one aggregate at most); shuffle plans its batch on
a lower bound of the senders and refuses, or reports at its real guarantee, a round below it; secure aggregation
accounts the noise shares really in each round's sum; shuffle and secure aggregation refuse late messages; the
server-view audit runs under dropouts. The rounds' senders are recomputed here from the federation model."""
import math

import numpy as np
import pytest

from ldpfed.algorithms import make_algorithm
from ldpfed.config import RunConfig
from ldpfed.engine import core, local as local_engine, run_local
from ldpfed.engine.core import round_bounds, simulate_population
from ldpfed.engine.driver import InFlight
from ldpfed.envs import make_env
from ldpfed.federation import federation_model
from ldpfed.federation.rounds import round_senders
from ldpfed.server_audit import audit_server_view
from ldpfed.trust import TrustModel
from ldpfed.util.errors import ConfigError
from ldpfed.util.rng import derive

EPS, DELTA = 1.0, 1e-6
AWAY = {"p": 0.9}          # availability: about 10% of each round's users away


def shuffled(algorithm="ldp-sgd", federation="availability", options=AWAY, **trust_options):
    return RunConfig(algorithm, users=10_000, round_size=2_000, populations=4, seed=1, trust="shuffle",
                     trust_options=trust_options, federation=federation, federation_options=options)


def senders_per_round(config):
    model = federation_model(config)
    return [len(round_senders(model, r, *round_bounds(r, config.round_size, config.users), config.populations))
            for r in range(config.rounds)]


# ---- shuffle ---------------------------------------------------------------------------------------------------------
def test_shuffle_plans_on_the_lower_bound_and_meets_the_target():
    config = shuffled(min_participants=0.8)
    sent = senders_per_round(config)
    assert 0.8 * config.round_size <= min(sent) and max(sent) < config.round_size   # users away, none below
    summary = run_local(config).summary
    assert summary["privacy_shuffle_batch"] == 1600                        # planned on 80% of 2,000 users
    assert summary["privacy_eps_composed"] <= config.eps
    assert summary["privacy_shuffle_rounds_below"] == 0 and not summary["privacy_shuffle_below_target"]
    assert summary["privacy_shuffle_senders_min"] == min(sent)       # ldp-sgd: one randomizer group per share
    assert summary["total_users_served"] == sum(sent) == summary["messages"]
    # the same run planned on every user has a larger eps0: the bound costs amplification
    ideal = run_local(shuffled(federation="ideal", options={})).summary
    assert ideal["privacy_eps0"] > summary["privacy_eps0"]
    assert "privacy_shuffle_rounds_below" not in ideal


def test_a_round_below_the_bound_is_refused_before_any_message(monkeypatch):
    def no_user(*args, **kwargs):
        raise AssertionError("a user was simulated: the refused run released messages")

    monkeypatch.setattr(core, "simulate_population", no_user)
    assert min(senders_per_round(shuffled())) < 0.95 * 2_000
    with pytest.raises(ConfigError, match="below the 1900 the batch is planned on") as caught:
        run_local(shuffled(min_participants=0.95))
    assert caught.value.field == "trust_options.min_participants"


def test_a_round_below_the_bound_is_reported_at_its_real_guarantee():
    config = shuffled(min_participants=0.95, below="report")
    sent = senders_per_round(config)
    reported = run_local(config).summary
    assert reported["privacy_shuffle_below_target"] and reported["privacy_shuffle_realized_batch"] == min(sent)
    assert reported["privacy_shuffle_rounds_below"] == sum(n < 1900 for n in sent) > 0
    # the worst round's guarantee: the users' eps0 amplified in a batch of its senders only, weaker than the target
    algo = make_algorithm(make_env(config), config)
    real = algo.shuffle.amplified(reported["privacy_eps0"], reported["privacy_delta0"], min(sent))
    assert reported["privacy_eps_composed"] == pytest.approx(real.eps, rel=1e-9) and real.eps > config.eps


@pytest.mark.parametrize("shufflers, options", [(1, AWAY), (2, {"p": 0.85, "drop": "after"})])
def test_the_shuffled_run_under_dropouts_is_the_same_on_ray(ray_session, shufflers, options):
    from test_ray_engine import run_ray_unreserved
    from test_shufflers import assert_same

    # 3,000 users per round in 3 populations: with S = 2 each share's senders (~1,300) make two chunks
    config = RunConfig("ldp-sgd", users=6_000, round_size=3_000, populations=3, seed=2, trust="shuffle",
                       trust_options={"shufflers": shufflers, "min_participants": 0.6}, federation="availability",
                       federation_options=options)
    local = run_local(config)
    remote = run_ray_unreserved(config, actors=2, shards=2, mode="per-user")
    assert_same(local, remote)          # the tables and the server's state, bit for bit
    s = remote.summary
    assert s["rejected_messages"] == 0 and s["shuffler_messages"] == sum(senders_per_round(config)) < config.users
    assert s["privacy_eps_composed"] == local.summary["privacy_eps_composed"] <= config.eps


# ---- what a trust model refuses ---------------------------------------------------------------------------------
@pytest.mark.parametrize("trust", ["shuffle", "secagg"])
def test_late_messages_are_refused_by_the_batch_and_share_models(trust):
    with pytest.raises(ConfigError, match=f"the {trust} trust model: a late message") as caught:
        RunConfig("ldp-sgd", users=2_000, round_size=200, trust=trust, federation="latency")
    assert caught.value.field == "federation"


def test_trust_models_declare_the_federation_models_they_refuse():
    availability = federation_model(shuffled())
    latency = federation_model(RunConfig("ldp-sgd", users=2_000, round_size=1_000, federation="latency"))
    ideal = federation_model(RunConfig("ldp-sgd"))

    class Shuffling(TrustModel):           # a plugin that shuffles and does not count who is there
        name, shuffles = "test-shuffling", True

    class Sharing(TrustModel):             # a plugin whose users add noise shares
        name, noise_at = "test-sharing", "shares"

    for plugin in (Shuffling(), Sharing()):
        assert plugin.federation_refusal(ideal) is None
        assert "lose users" in plugin.federation_refusal(availability)
        assert "lose users" in plugin.federation_refusal(latency)
    assert TrustModel().federation_refusal(availability) is None          # per-user noise: nothing to count
    assert TrustModel().federation_refusal(latency) is None


# ---- secure aggregation ----------------------------------------------------------------------------------------------
SECAGG = dict(users=2_000, round_size=1_000, populations=2, eps=EPS, delta=DELTA, seed=1, trust="secagg",
              federation="availability", federation_options={"p": 0.9})


def test_secagg_counts_the_federation_models_absent_users_as_dropouts():
    config = RunConfig("ldp-ols", **SECAGG, trust_options={"min_survivors": 0.8})
    env = make_env(config)
    algo = make_algorithm(env, config)
    plan, trust = algo.secagg, algo.trust_model()
    federation = federation_model(config)
    for r in range(config.rounds):
        start, stop = round_bounds(r, config.round_size, config.users)
        sent, _ = trust._flags(config, r)
        assert np.array_equal(np.flatnonzero(sent) + start, round_senders(federation, r, start, stop, 2))
    assert plan.worst_ratio == 1.0      # the shares are calibrated for 800 senders: every round has more
    # the round's masked sum unmasks: the absent users' pair masks are removed (else it would be uniform in Z_m)
    model = algo.publish(algo.initial_state(derive(config.seed, "init")))
    users = round_senders(federation, 0, 0, 1_000, 2)
    payload, _, _ = simulate_population(algo, env, model, config.seed, 0, 0, users)
    decoded = trust.decode(algo, algo.sum_layout().join(payload), 0, 1_000)
    central = make_algorithm(env, config.replace(trust="central"))
    clear, _, _ = simulate_population(central, env, model, config.seed, 0, 0, users)
    error = decoded - central.sum_layout().join(clear)
    for name, f in plan.fields.items():
        if f.source is not None:    # the shares of ~900 senders calibrated for 800, and the rounding: sd ~ 1.1 sigma
            sd = math.sqrt(f.variance * len(users) / 800 + len(users) / 4) / f.scale
            assert np.abs(error[algo.sum_layout().slices[name]]).max() < 6 * sd
    summary = run_local(config).summary
    assert summary["privacy_eps_composed"] <= EPS and not summary["privacy_secagg_below_target"]


def test_secagg_below_its_survivors_is_refused_or_reported():
    with pytest.raises(ConfigError, match="fewer than the 1,000 the noise shares are calibrated for") as caught:
        run_local(RunConfig("ldp-ols", **SECAGG))          # min_survivors 1: every user must send
    assert caught.value.field == "trust_options.min_survivors"
    config = RunConfig("ldp-ols", **SECAGG, trust_options={"min_survivors": 0.95, "below": "report"})
    plan = make_algorithm(make_env(config), config).secagg
    ratio = min(senders_per_round(config)) / 950
    assert ratio < 1.0 and plan.worst_ratio == pytest.approx(ratio)
    summary = run_local(config).summary
    assert summary["privacy_secagg_below_target"] and summary["privacy_eps_composed"] > EPS
    assert summary["privacy_secagg_noise_ratio"] == pytest.approx(ratio)


# ---- central ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("federation, options", [("availability", {"p": 0.6, "drop": "after"}),
                                                 ("latency", {"latency": 1.5, "deadline": 3})])
def test_central_folds_each_users_message_once_and_keeps_its_guarantee(monkeypatch, federation, options):
    """Every message the server folds is counted by its user through the run: on time in its round, or on arrival."""
    folded = []
    original_round, original_fold = core.population_round, InFlight.fold

    def population_round(*args, **kwargs):
        payload, regret, metrics, late, on_time = original_round(*args, **kwargs)
        if payload:
            folded.extend(np.asarray(on_time).tolist())
        return payload, regret, metrics, late, on_time

    def fold(self, round_index, sums):
        due = [users for _, _, users, _, _ in self.due.get(round_index, [])]
        sums, count, rejected = original_fold(self, round_index, sums)
        assert rejected == 0 and count == sum(len(users) for users in due)
        folded.extend(int(user) for users in due for user in users)
        return sums, count, rejected

    base = dict(users=3_000, round_size=300, populations=2, eps=EPS, delta=DELTA, seed=4, trust="central")
    ideal = run_local(RunConfig("ldp-ols", **base)).summary
    monkeypatch.setattr(local_engine, "population_round", population_round)
    monkeypatch.setattr(InFlight, "fold", fold)
    result = run_local(RunConfig("ldp-ols", **base, federation=federation, federation_options=options))
    s, table = result.summary, result.table
    assert len(folded) == len(set(folded)) == s["users_in_aggregates"] < s["users"]
    # every served user's message is sent on time, folded late, lost, or still due after the last round: once
    late = table["late_folded"].sum() if "late_folded" in table else 0
    assert s["users_in_aggregates"] == s["messages"] + late
    assert s["users_in_aggregates"] + table["users_lost"].sum() + s.get("late_messages_never_folded", 0) == \
        table["users_served"].sum()
    if federation == "latency":
        assert late > 0 and table["users_lost"].sum() > 0
    # one user's contribution to one aggregate: the same guarantee as with every user there
    assert s["privacy_eps_composed"] == ideal["privacy_eps_composed"] <= EPS
    assert s["privacy_delta_composed"] == ideal["privacy_delta_composed"] <= DELTA


# ---- the server-view audit -------------------------------------------------------------------------------------------
AUDIT = dict(eps=0.5, delta=1e-6, users=200, repetitions=1_500, pilot=500, seed=0, federation="availability",
             federation_options={"p": 0.8})


def absent_users(algorithm="ldp-ols"):
    config = RunConfig(algorithm, users=200, round_size=200, federation="availability", federation_options={"p": 0.8})
    return sorted(set(range(200)) - set(round_senders(federation_model(config), 0, 0, 200,
                                                      config.populations).tolist()))


def test_the_audit_under_dropouts_stays_below_the_shuffle_claim():
    # klucb-cf's user 1 is alone on its scheduled arm: seen as its own message, the audit has power (bound > 0)
    row = audit_server_view("klucb-cf", "shuffle", trust_options={"min_participants": 0.7}, **AUDIT)
    assert row["federation"] == "availability" and row["senders"] < 200 and row["canary"] == 1
    assert 0.0 < row["lower_bound"] <= row["claimed_eps"] <= 0.5 and not row["flagged"]
    with pytest.raises(ConfigError) as caught:      # planned on every user (1.0 of the round): some are away
        audit_server_view("ldp-sgd", "shuffle", **AUDIT)
    assert caught.value.field == "trust_options.min_participants"


@pytest.mark.parametrize("shufflers", [1, 2])
def test_the_audited_shuffle_share_holds_every_sender_at_its_positions(monkeypatch, shufflers):
    from ldpfed import server_audit

    seen = []
    monkeypatch.setattr(server_audit, "shuffle_share", lambda seed, r, s, share: seen.append(share) or [share])
    setup = server_audit.build("ldp-sgd", "shuffle", eps=0.5, delta=1e-6, users=200, seed=0, shufflers=shufflers,
                               trust_options={"min_participants": 0.6}, federation="availability",
                               federation_options={"p": 0.8})
    server_audit.server_view(setup, 0, 1)
    lo, hi = (200 * setup.share // shufflers, 200 * (setup.share + 1) // shufflers)
    inside = setup.users[(setup.users >= lo) & (setup.users < hi)]
    assert setup.canary in inside and len(setup.users) < 200
    assert len(next(iter(seen[0].values()))) == len(inside)     # the share's senders, the canary among them


@pytest.mark.parametrize("trust, options", [("shuffle", {"min_participants": 0.7}), ("central", {}),
                                            ("local", {})])
def test_the_audit_under_dropouts_stays_below_the_claim_and_refuses_an_absent_canary(trust, options):
    row = audit_server_view("ldp-sgd", trust, trust_options=options, **{**AUDIT, "repetitions": 300,
                                                                         "pilot": 200})
    assert row["senders"] == 200 - len(absent_users()) < 200
    assert row["lower_bound"] <= row["claimed_eps"] <= 0.5 and not row["flagged"]
    with pytest.raises(ConfigError, match="does not send in the audited round") as caught:
        audit_server_view("ldp-sgd", trust, trust_options=options, canary=absent_users()[0],
                          **{**AUDIT, "repetitions": 10, "pilot": 10})
    assert caught.value.field == "canary"


@pytest.mark.slow
@pytest.mark.parametrize("algorithm, trust, options", [
    ("ldp-sgd", "shuffle", {"min_participants": 0.7}), ("klucb-cf", "local", {}), ("ldp-ols", "central", {}),
    ("ldp-ols", "secagg", {"min_survivors": 0.7})])
def test_the_audit_under_dropouts_at_full_size(algorithm, trust, options):
    row = audit_server_view(algorithm, trust, trust_options=options, eps=1.0, delta=1e-6, users=200,
                            repetitions=4_000, pilot=1_000, seed=1, federation="availability",
                            federation_options={"p": 0.8})
    assert row["senders"] < 200
    assert row["lower_bound"] <= row["claimed_eps"] <= 1.0 and not row["flagged"]

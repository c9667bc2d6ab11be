"""Every trust model's reported guarantee holds for the users who really take part (docs/trust-models.md, "Under a
federation model"): the shuffle model plans its amplification at a lower bound of each group's senders and refuses
or reports a round below it; secure aggregation counts the federation model's absent users as drop-outs; the central
model folds each user's message into one aggregate at most; both refuse late messages where they cannot account
for them. The rounds' senders are recomputed here from the federation model, independently of the plans."""
import math

import numpy as np
import pytest

from ldpfed.algorithms import make_algorithm
from ldpfed.config import RunConfig
from ldpfed.engine import core, local as local_engine
from ldpfed.engine.core import round_senders, simulate_population
from ldpfed.engine.driver import InFlight
from ldpfed.engine.local import run_local
from ldpfed.envs import make_env
from ldpfed.mechanisms import shuffle
from ldpfed.server_audit import audit_server_view
from ldpfed.trust import TrustModel
from ldpfed.util.errors import ConfigError
from ldpfed.util.rng import derive

EPS, DELTA = 1.0, 1e-6
# two rounds of 1000 users in two populations; with p = 0.9 a round keeps about 900 (sd 9.5): 800 is > 10 sd below
SHUFFLED = dict(users=2000, round_size=1000, populations=2, eps=EPS, delta=DELTA, seed=3, trust="shuffle",
                federation="availability", federation_options={"p": 0.9})


def senders_per_round(config) -> list[int]:
    federation = config.federation_model()
    return [len(round_senders(federation, r, *core.round_bounds(r, config.round_size, config.users),
                              config.populations)) for r in range(config.rounds)]


# ---- shuffle ----------------------------------------------------------------------------------------------------
def test_shuffle_is_accounted_at_the_planned_lower_bound_when_every_round_meets_it():
    config = RunConfig("ldp-sgd", **SHUFFLED, trust_options={"min_participants": 0.8})
    result = run_local(config)
    s = result.summary
    sent = senders_per_round(config)
    assert min(sent) >= 800 and max(sent) < 1000                   # users are missing, none below the bound
    assert s["privacy_shuffle_batch"] == 800 and s["privacy_shuffle_planned"] == 1000
    assert s["privacy_shuffle_senders_min"] == min(sent) and s["privacy_shuffle_rounds_below"] == 0
    assert not s["privacy_shuffle_below_target"]
    # eps0 is what a batch of 800 (not 1000, not the senders there) amplifies to the target
    assert s["privacy_eps0"] == pytest.approx(shuffle.largest_eps0(EPS, 800, DELTA), rel=1e-6)
    assert s["privacy_eps0"] < shuffle.largest_eps0(EPS, min(sent), DELTA)
    assert s["privacy_eps_composed"] <= EPS
    assert s["total_users_served"] == sum(sent) == s["messages"]


def test_a_count_bound_and_its_refusals():
    config = RunConfig("ldp-sgd", **SHUFFLED, trust_options={"min_participants": 750})
    assert make_algorithm(make_env(config), config).shuffle.batch == 750
    with pytest.raises(ConfigError) as caught:       # more senders than the smallest group has users
        make_algorithm(make_env(config), config.replace(trust_options={"min_participants": 1001}))
    assert caught.value.field == "trust_options.min_participants"
    with pytest.raises(ConfigError) as caught:       # a count is whole
        RunConfig("ldp-sgd", **SHUFFLED, trust_options={"min_participants": 2.5})
    assert caught.value.field == "trust_options.min_participants"


def test_a_round_below_the_bound_is_refused_before_any_message(monkeypatch):
    def no_user(*args, **kwargs):
        raise AssertionError("a user was simulated: the refused run released messages")

    monkeypatch.setattr(core, "simulate_population", no_user)
    config = RunConfig("ldp-sgd", **{**SHUFFLED, "federation_options": {"p": 0.5}},
                       trust_options={"min_participants": 0.6})
    assert max(senders_per_round(config)) < 600      # p = 0.5: about 500 of 1000 (sd 16)
    with pytest.raises(ConfigError, match="round 0: .* fewer than the 600") as caught:
        run_local(config)
    assert caught.value.field == "trust_options.min_participants"


def test_a_round_below_the_bound_is_reported_at_its_real_guarantee():
    config = RunConfig("ldp-sgd", **{**SHUFFLED, "federation_options": {"p": 0.5}},
                       trust_options={"min_participants": 0.52, "below": "report"})
    sent = senders_per_round(config)
    below = sum(n < 520 for n in sent)
    assert below >= 1
    s = run_local(config).summary
    assert s["privacy_shuffle_below_target"] and s["privacy_shuffle_rounds_below"] == below
    assert s["privacy_shuffle_senders_min"] == min(sent)
    # the worst round's guarantee: the users' eps0 amplified in a batch of its senders only (weaker than the target)
    real = shuffle.amplify(s["privacy_eps0"], min(sent), DELTA).eps
    assert s["privacy_eps_composed"] == pytest.approx(real, rel=1e-9) and s["privacy_eps_composed"] > EPS


def test_trust_models_declare_the_federation_models_they_refuse():
    availability = RunConfig("ldp-sgd", **SHUFFLED).federation_model()
    latency = RunConfig("ldp-sgd", users=2000, round_size=1000, federation="latency").federation_model()
    ideal = RunConfig("ldp-sgd").federation_model()

    class Shuffling(TrustModel):           # a plugin that shuffles and does not count who is there
        name, shuffles = "test-shuffling", True

    assert Shuffling().federation_refusal(ideal) is None
    assert "lose users" in Shuffling().federation_refusal(availability)
    assert TrustModel().federation_refusal(availability) is None          # per-user noise: nothing to count
    with pytest.raises(ConfigError, match="a late message joins a later round's aggregate") as caught:
        RunConfig("ldp-sgd", users=2000, round_size=1000, trust="shuffle", federation="latency")
    assert caught.value.field == "federation"
    assert latency.late and not availability.late


@pytest.mark.parametrize("shufflers", [1, 2])
def test_ray_with_shufflers_and_dropouts_is_bit_identical_to_run_local(ray_session, shufflers):
    from test_ray_engine import run_ray_unreserved
    from test_shufflers import assert_same

    # 3000 users per round in 3 populations: with S = 2 each share's senders (~1350) make two chunks
    config = RunConfig("ldp-sgd", **{**SHUFFLED, "users": 6000, "round_size": 3000, "populations": 3},
                       trust_options={"min_participants": 0.8, "shufflers": shufflers})
    local = run_local(config)
    remote = run_ray_unreserved(config, actors=2, shards=2, mode="per-user")
    assert_same(local, remote)          # the tables and the server's state, bit for bit
    s = remote.summary
    assert s["rejected_messages"] == 0 and s["shuffler_messages"] == sum(senders_per_round(config)) < config.users
    assert s["privacy_eps_composed"] == local.summary["privacy_eps_composed"] <= EPS


# ---- secure aggregation --------------------------------------------------------------------------------------------
SECAGG = dict(users=2000, round_size=1000, populations=2, eps=EPS, delta=DELTA, seed=1, trust="secagg",
              federation="availability", federation_options={"p": 0.9})


def test_secagg_counts_the_federation_models_absent_users_as_dropouts():
    config = RunConfig("ldp-ols", **SECAGG, trust_options={"min_survivors": 0.8})
    env = make_env(config)
    algo = make_algorithm(env, config)
    plan, trust = algo.secagg, algo.trust_model()
    federation = config.federation_model()
    for r in range(config.rounds):
        start, stop = core.round_bounds(r, config.round_size, config.users)
        sent, _ = trust._flags(config, r, plan.federation)
        assert np.array_equal(np.flatnonzero(sent) + start, round_senders(federation, r, start, stop, 2))
    # the shares are calibrated for 800 senders: every round has more (the noise is at least the target's)
    assert plan.worst_ratio == 1.0
    assert plan.absent == pytest.approx(1 - min(senders_per_round(config)) / 1000)
    # the round's masked sum unmasks: the absent users' pair masks are removed (else it would be uniform in Z_m)
    model = algo.publish(algo.initial_state(derive(config.seed, "init")))
    users = round_senders(federation, 0, 0, 1000, 2)
    payload, _, _ = simulate_population(algo, env, model, config.seed, 0, 0, users)
    decoded = trust.decode(algo, algo.sum_layout().join(payload), 0, 1000)
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
    with pytest.raises(ConfigError, match="availability federation model's absent users") as caught:
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
@pytest.mark.parametrize("federation, options", [("availability", {"p": 0.6}),
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

    base = dict(users=3000, round_size=300, populations=2, eps=EPS, delta=DELTA, seed=4, trust="central")
    ideal = run_local(RunConfig("ldp-ols", **base)).summary
    monkeypatch.setattr(local_engine, "population_round", population_round)
    monkeypatch.setattr(InFlight, "fold", fold)
    s = run_local(RunConfig("ldp-ols", **base, federation=federation, federation_options=options)).summary
    assert len(folded) == len(set(folded)) == s["users_in_aggregates"] < s["users"]
    assert s["users_in_aggregates"] <= s["total_users_served"]
    if federation == "latency":
        assert s["total_late_folded"] > 0 and s["total_users_lost"] > 0
        assert s["users_in_aggregates"] == s["total_users_served"] - s["total_users_lost"] \
            - s["late_messages_never_folded"]
    # one user's contribution to one aggregate: the same guarantee as with every user there
    assert s["privacy_eps_composed"] == ideal["privacy_eps_composed"] <= EPS
    assert s["privacy_delta_composed"] == ideal["privacy_delta_composed"] <= DELTA


# ---- the server-view audit -----------------------------------------------------------------------------------------
AUDIT = dict(eps=0.5, delta=1e-6, users=200, repetitions=1500, pilot=500, seed=0, federation="availability",
             federation_options={"p": 0.8})


def test_the_audit_under_dropouts_stays_below_the_shuffle_claim():
    # klucb-cf's user 1 is alone on its scheduled arm: seen as its own message, the audit has power (bound > 0)
    row = audit_server_view("klucb-cf", "shuffle", trust_options={"min_participants": 0.7}, **AUDIT)
    assert row["federation"] == "availability" and row["senders"] < 200 and row["canary"] == 1
    assert 0.0 < row["lower_bound"] <= row["claimed_eps"] <= 0.5 and not row["flagged"]
    with pytest.raises(ConfigError) as caught:      # 1.0 of the round: some users are away
        audit_server_view("ldp-sgd", "shuffle", **AUDIT)
    assert caught.value.field == "trust_options.min_participants"


def test_the_audit_under_dropouts_stays_below_the_central_claim_and_refuses_an_absent_canary():
    row = audit_server_view("ldp-ols", "central", **AUDIT)
    assert row["senders"] < 200 and row["lower_bound"] <= row["claimed_eps"] <= 0.5 and not row["flagged"]
    absent = sorted(set(range(200)) - set(round_senders(
        RunConfig("ldp-ols", users=200, round_size=200, federation="availability",
                  federation_options={"p": 0.8}).federation_model(), 0, 0, 200, 1).tolist()))
    with pytest.raises(ConfigError, match="absent from the audited round") as caught:
        audit_server_view("ldp-ols", "central", canary=absent[0], **AUDIT)
    assert caught.value.field == "canary"


@pytest.mark.slow
@pytest.mark.parametrize("algorithm, trust, options", [
    ("ldp-sgd", "shuffle", {"min_participants": 0.7}), ("klucb-cf", "local", {}), ("ldp-ols", "secagg",
                                                                                   {"min_survivors": 0.7})])
def test_the_audit_under_dropouts_at_full_size(algorithm, trust, options):
    row = audit_server_view(algorithm, trust, trust_options=options, eps=1.0, delta=1e-6, users=200,
                            repetitions=4000, pilot=1000, seed=1, federation="availability",
                            federation_options={"p": 0.8})
    assert row["lower_bound"] <= row["claimed_eps"] <= 1.0 and not row["flagged"]

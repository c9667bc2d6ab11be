"""The end-to-end audit of what the server sees (ldpfed.server_audit): whole rounds on neighbouring populations, a
Clopper-Pearson lower bound on the canary's eps from the server's view. It must stay below the claim of a correct
run and flag a run whose claim is false: the shuffle accounting before randomizer groups, which gave a user the
public schedule sets apart (alone on its arm) the amplification of the whole round."""
import numpy as np
import pytest

from ldpfed.server_audit import TRUSTS, audit_server_view, build, choose_event, ldp_algorithms, server_view
from ldpfed.util.errors import ConfigError

EPS, DELTA, USERS = 0.5, 1e-6, 200
FAST = dict(eps=EPS, delta=DELTA, users=USERS, repetitions=1500, pilot=500, seed=0)


def test_klucb_cf_correct_run_stays_below_its_claim_and_the_whole_batch_accounting_is_flagged():
    correct = audit_server_view("klucb-cf", "shuffle", **FAST)
    # user 1 pulls arm 1 (the public schedule): alone in its group, so the run is not amplified, eps0 = eps
    assert correct["canary"] == 1 and correct["group"] == 1 and correct["amplified"] is False
    assert correct["eps0"] == pytest.approx(EPS) and correct["claimed_eps"] <= EPS
    assert 0.0 < correct["lower_bound"] <= correct["claimed_eps"] and not correct["flagged"]

    broken = audit_server_view("klucb-cf", "shuffle", whole_batch=True, **FAST)
    # eps0 for the whole round of 200 (1.09), a claim of 0.5, and the canary's report seen alone
    assert broken["accounting"] == "whole batch" and broken["amplified"] is True
    assert broken["eps0"] > 2 * EPS and broken["claimed_eps"] <= EPS
    assert broken["flagged"] and broken["lower_bound"] > broken["claimed_eps"] + 0.2


def test_the_shuffled_view_groups_by_public_fields_only():
    """The server sees the canary's arm (scheduled) but not which message is its: the group of messages on arm 1
    is the canary's alone."""
    setup = build("klucb-cf", "shuffle", eps=EPS, delta=DELTA, users=USERS, seed=0)
    assert setup.keys == ["pulls"] and setup.key_values.tolist() == [0.0, 1.0, 0.0, 0.0, 0.0]
    a, b = server_view(setup, 0, 11), server_view(setup, 1, 11)
    assert a[5:].tolist() == [0.0, 1.0, 0.0, 0.0, 0.0]          # one message counted, on arm 1
    assert np.count_nonzero(a != b) <= 1                      # the worlds differ in the canary's report at most


def test_refusals_are_the_systems():
    with pytest.raises(ConfigError) as caught:
        audit_server_view("ldp-bco-one-point", "shuffle", **FAST)
    assert caught.value.field == "trust"
    with pytest.raises(ConfigError):
        audit_server_view("klucb-cf", "shuffle", small_groups="refuse", **FAST)
    with pytest.raises(ConfigError):
        audit_server_view("klucb-cf", "local", whole_batch=True, **FAST)


def test_choose_event_shows_nothing_on_identical_worlds():
    rng = np.random.default_rng(0)
    same = rng.normal(size=500)
    tau, upper, bound = choose_event(same, same.copy(), 0.0, 0.01)
    assert bound == 0.0


@pytest.mark.slow
def test_every_algorithm_under_every_trust_model_stays_below_its_claim():
    """Every registered LDP algorithm under every trust model it accepts (the refusals are the system's own), at
    eps 1, delta 1e-6, one round of 200 users; and the whole-batch accounting flagged for klucb-cf and sw-klucb-cf."""
    refused = []
    for name in ldp_algorithms():
        for trust in TRUSTS:
            try:
                row = audit_server_view(name, trust, eps=1.0, delta=1e-6, users=200, repetitions=2000, pilot=500)
            except ConfigError as error:
                refused.append((name, trust, error.field))
                continue
            assert row["lower_bound"] <= row["claimed_eps"], row
    assert all(field in ("trust", "trust_options.small_groups") for _, _, field in refused), refused
    assert {(name, trust) for name, trust, _ in refused} >= {("ldp-bco-one-point", "shuffle"),
                                                             ("ldp-bco-two-point", "central")}
    for name in ("klucb-cf", "sw-klucb-cf"):
        row = audit_server_view(name, "shuffle", whole_batch=True, eps=1.0, delta=1e-6, users=200, repetitions=2000,
                                pilot=500)
        assert row["flagged"], row

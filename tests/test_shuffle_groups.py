"""The shuffle trust model hides a user only among the users of its batch that run the same local randomizer.

Whatever a shuffled server sees besides the randomized values (a public arm the schedule fixes, the public count
of the slots a message fills) splits a batch into groups; FMT's amplification holds within a group, so each user's
guarantee is its group's and the run claims its worst-off user's. These tests pin the settings where counting the
whole batch claimed eps 0.5 for users whose real guarantee was the local randomizer's (eps 2.3-3.7)."""
import math

import numpy as np
import pytest
from scipy.optimize import brentq

from ldpfed.algorithms import REGISTRY, make_algorithm
from ldpfed.algorithms.ldp_reductions import LdpMabAdversarial, LdpMabUcb
from ldpfed.trust.shuffling import GroupsBroken, group_sizes, smallest_groups
from ldpfed.config import RunConfig
from ldpfed.engine import run_local
from ldpfed.envs import make_env
from ldpfed.mechanisms import shuffle
from ldpfed.mechanisms.gaussian import analytic_delta
from ldpfed.testing import ConformanceError, check_algorithm
from ldpfed.util.errors import ConfigError

EPS, DELTA = 0.5, 1e-6
LONE = {"ldp-mab-ucb": {"env": "bernoulli", "env_params": {"K": 10}}, "klucb-cf": {}, "sw-klucb-cf": {}}


def shuffled(name, users=10_000, round_size=10_000, **changes):
    changes = {**LONE.get(name, {}), **changes}
    options = {key: changes.pop(key) for key in ("shufflers", "small_groups") if key in changes}
    return RunConfig(name, users=users, round_size=round_size, eps=EPS, delta=DELTA, trust="shuffle",
                     trust_options=options, **changes)


def built(config):
    return make_algorithm(make_env(config), config)


@pytest.mark.parametrize("name", sorted(LONE))
def test_users_the_schedule_sets_apart_are_alone_in_their_group(name):
    """User t < K pulls arm t, the public schedule: in the one round of 10,000 users, K - 1 users are alone on
    their arm (the published arm's group holds the rest, its scheduled user included at most)."""
    config = shuffled(name, small_groups="no-amplification")
    algo = built(config)
    labels = algo.randomizer_groups(np.arange(10_000))
    sizes = np.sort(group_sizes(labels, 10_000))
    assert sizes[0] == 1 and sizes[-1] >= 10_000 - algo.K
    assert smallest_groups(algo, 10_000, 10_000, 1)[0].tolist() == [1]


@pytest.mark.parametrize("name", sorted(LONE))
def test_a_lone_user_refuses_the_run_naming_algorithm_round_and_group(name):
    with pytest.raises(ConfigError) as caught:
        built(shuffled(name))
    error = caught.value
    assert error.field == "trust_options.small_groups"
    assert f"{name}: round 0 has a group of 1 user" in error.reason and "--small-groups no-amplification" in error.reason


def test_lone_users_of_ldp_mab_ucb_now_get_the_guarantee_the_run_reports():
    """Counting the whole batch put the randomizer at eps0 = 3.638 (Gaussian sigma 3.912 for sensitivity 2): a lone
    user's message is then theirs alone, eps 2.33 at that delta. Without amplification the randomizer runs at the
    target, so every user's guarantee is the claimed 0.5."""
    whole_batch = shuffle.largest_eps0(EPS, 10_000, DELTA / 2)
    assert whole_batch == pytest.approx(3.638, abs=1e-3)
    old = built(RunConfig("ldp-mab-ucb", env="bernoulli", env_params={"K": 10}, users=10_000, round_size=10_000,
                          eps=whole_batch, delta=1.258e-11))
    assert old.sigma == pytest.approx(3.912, abs=2e-3)
    # a lone user's guarantee under that sigma: the analytic Gaussian's eps at the delta the run reported
    # (8.4e-7), far above 0.5
    lone_eps = brentq(lambda e: analytic_delta(e, old.sigma / 2.0) - 8.4e-7, 0.01, 10.0)
    assert lone_eps == pytest.approx(2.33, abs=0.01)
    config = shuffled("ldp-mab-ucb", small_groups="no-amplification")
    algo = built(config)
    local = built(config.replace(trust="local", trust_options={}))
    assert algo.eps == EPS and algo.sigma == local.sigma > 3 * old.sigma
    s = run_local(config).summary
    assert s["privacy_eps_composed"] <= EPS and s["privacy_delta_composed"] <= DELTA
    assert s["privacy_shuffle_batch"] == 1 and s["privacy_shuffle_round"] == 0
    assert s["privacy_shuffle_amplified"] is False and s["privacy_eps0"] <= EPS


@pytest.mark.parametrize("name", ["klucb-cf", "sw-klucb-cf"])
def test_lone_users_of_klucb_cf_randomize_at_the_target(name):
    """Randomized response at eps0 = 3.70 for the lone users was eps 3.70 against 0.5; now it runs at 0.5."""
    assert shuffle.largest_eps0(EPS, 10_000, DELTA) == pytest.approx(3.70, abs=0.01)
    algo = built(shuffled(name, small_groups="no-amplification"))
    assert algo.rr.p_flip == pytest.approx(1.0 / (1.0 + math.exp(EPS)))
    assert run_local(shuffled(name, small_groups="no-amplification")).summary["privacy_eps_composed"] <= EPS


@pytest.mark.parametrize("name", ["ldp-sgd-multi", "ldp-ols-multi"])
def test_warm_up_slots_split_a_round_into_groups_of_333(name):
    """T = 1e5, B = 1e4, K = 3: the warm-up's 999 users fill only slot t mod K, which the public count shows, so
    round 0 splits into 333 / 333 / 333 / 9,001. The whole batch's eps0 (3.70) amplifies to nothing at 333 users;
    the plan's eps0 is the largest a group of 333 amplifies to 0.5."""
    config = shuffled(name, users=100_000)
    algo = built(config)
    sizes = np.sort(group_sizes(algo.randomizer_groups(np.arange(10_000)), 10_000))
    assert sizes.tolist() == [333, 333, 333, 9001]
    plan = algo.shuffle
    assert plan.batch == 333 and plan.smallest_round == 0 and plan.largest == 10_000
    assert plan.group_runs == ((0, 0, 333), (1, 9, 10_000))
    delta_pure = plan.delta_pure
    assert shuffle.amplify(shuffle.largest_eps0(EPS, 10_000, delta_pure), 333, delta_pure).eps > 3.0
    assert plan.eps0 == pytest.approx(shuffle.largest_eps0(EPS, 333, delta_pure)) and 1.0 < plan.eps0 < 2.0
    assert shuffle.amplify(plan.eps0, 333, delta_pure).eps <= EPS


def test_the_ledger_reports_each_rounds_smallest_group_and_its_worst_user():
    result = run_local(shuffled("ldp-sgd-multi", users=100_000))
    rows = [row for row in result.ledger if str(row["message"]).startswith("shuffled rounds")]
    assert [(row["rounds"], row["smallest_group"]) for row in rows] == [([0, 0], 333), ([1, 9], 10_000)]
    assert rows[0]["eps"] == pytest.approx(result.summary["privacy_eps_composed"]) and rows[0]["eps"] <= EPS
    assert rows[1]["eps"] < rows[0]["eps"] / 3         # the later rounds' users hide among 10,000
    assert all(row["delta"] <= DELTA for row in rows)


def test_groups_split_by_shufflers():
    """Each of S shufflers mixes its share: the groups are counted inside a share."""
    algo = built(shuffled("ldp-sgd-multi", users=100_000, shufflers=2))
    smallest, largest = smallest_groups(algo, 100_000, 10_000, 2)
    assert smallest[0] == 333 and largest.max() == 5000 and (smallest[1:] == 5000).all()


class Liar(LdpMabUcb):
    """Declares every user of a round one randomizer, though the schedule's arms tell users t < K apart."""

    name = "test-liar-mab"

    def randomizer_groups(self, users):
        return None


def test_a_declaration_that_joins_users_the_server_tells_apart_stops_the_run():
    REGISTRY.register(Liar)
    try:
        config = RunConfig("test-liar-mab", env="bernoulli", env_params={"K": 10}, users=10_000, round_size=10_000,
                           eps=EPS, delta=DELTA, trust="shuffle")
        assert built(config).shuffle.batch == 10_000          # what the false declaration buys
        with pytest.raises(GroupsBroken, match="public field 'arm' of user 1 differs"):
            run_local(config)
    finally:
        REGISTRY.unregister(Liar.name)


def test_the_kit_catches_a_false_declaration():
    with pytest.raises(ConformanceError) as caught:
        check_algorithm(Liar, checks=["public_fields"], ray=False)
    assert caught.value.check == "public_fields" and caught.value.field == "arm"


class Undeclared(LdpMabAdversarial):
    """Its public arm is a common draw, but it does not say so."""

    name = "test-undeclared-arm"
    public_draws = frozenset()


def test_an_undeclared_public_field_is_refused():
    REGISTRY.register(Undeclared)
    try:
        with pytest.raises(ConfigError, match="write randomizer_groups") as caught:
            built(RunConfig("test-undeclared-arm", users=2000, round_size=1000, eps=1.0, delta=DELTA,
                            trust="shuffle"))
        assert caught.value.field == "trust"
    finally:
        REGISTRY.unregister(Undeclared.name)
    # the kit checks declarations; an undeclared one claims nothing (the shuffle model refuses it, above)
    assert check_algorithm(Undeclared, checks=["public_fields"], ray=False) == {"public_fields": "passed"}


def test_a_common_draw_is_one_group():
    """ldp-mab-adversarial's users draw their arm from the published p with their own coins: one randomizer."""
    algo = built(shuffled("ldp-mab-adversarial", users=20_000))
    assert algo.shuffle.batch == 10_000 and algo.shuffle.amplifies

"""The shuffle trust model (ldpfed.trust): the same algorithm, its users' randomizers at the largest
eps0 whose shuffled batch (a round's users) meets the run's --eps/--delta (ldpfed.mechanisms.shuffle)."""
import math

import numpy as np
import pytest

from ldpfed.algorithms import make_algorithm
from ldpfed.trust.shuffle import shuffle_plan, smallest_batch
from ldpfed.cli import main
from ldpfed.config import RunConfig
from ldpfed.engine import run_local
from ldpfed.envs import make_env
from ldpfed.mechanisms import shuffle
from ldpfed.util.errors import ConfigError


def shuffled(algorithm, **changes):
    base = dict(users=4000, round_size=2000, eps=1.0, delta=1e-6, seed=1, trust="shuffle")
    return RunConfig(algorithm, **{**base, **changes})


def test_pure_randomizers_run_at_the_largest_eps0_the_batch_amplifies():
    config = shuffled("ldp-sgd")
    algo = make_algorithm(make_env(config), config)
    eps0 = shuffle.largest_eps0(1.0, 2000, 1e-6)
    assert eps0 > 2.5 and algo.eps == eps0 and algo.mech.eps == eps0      # the l2-ball runs at eps0, not eps
    result = run_local(config)
    s = result.summary
    assert s["privacy_trust"] == "shuffle" and s["privacy_shuffle_batch"] == 2000
    assert s["privacy_eps0"] == pytest.approx(eps0) and s["privacy_delta0"] == 0.0
    assert s["privacy_eps_composed"] <= 1.0 and s["privacy_delta_composed"] <= 1e-6
    # the amplified eps is the pure bound at the batch: just under the target (the binary search's tolerance)
    assert s["privacy_eps_composed"] == pytest.approx(shuffle.numerical_eps(eps0, 2000, 1e-6))
    assert s["privacy_eps_composed"] > 1.0 - 1e-3
    row, rounds = result.ledger      # the randomizer's row, then the rounds' (one run of rounds: both of 2,000)
    assert row["trust"] == "shuffle" and row["eps"] == eps0 and "shuffled batch of >= 2000 users" in row["scope"]
    assert rounds["rounds"] == [0, 1] and rounds["smallest_group"] == 2000
    assert rounds["eps"] == s["privacy_eps_composed"]


def test_gaussian_randomizers_split_delta_with_the_approximate_theorem():
    """(eps0, delta0) Gaussian randomizers (ldp-ols: M and u at eps0/2 each): half of delta to the pure bound,
    delta0 so small that FMT Thm 3.8's added term fits the other half; the composed local budget is what is
    amplified, and the amplified (eps, delta) meets the target."""
    config = shuffled("ldp-ols")
    plan = shuffle_plan(config, pure=False)
    n = 2000
    assert plan.delta_pure == 5e-7
    assert (math.exp(1.0) + 1) * 1.5 * n * plan.delta0 == pytest.approx(5e-7)
    s = run_local(config).summary
    assert s["privacy_eps0"] == pytest.approx(plan.eps0) and s["privacy_delta0"] == pytest.approx(plan.delta0)
    assert s["privacy_eps_composed"] <= 1.0 and s["privacy_delta_composed"] <= 1e-6
    assert plan.eps0 > 2.0


def test_shuffling_buys_a_larger_eps0_so_less_noise_than_local():
    """Same target eps = 0.5 at batches of 1,000: eps0 = 1.9, so the l2-ball's output norm B (prop. to
    coth(eps/2)) is 3x smaller than under local DP at eps = 0.5."""
    config = RunConfig("ldp-sgd", users=20_000, round_size=1000, eps=0.5, delta=1e-6)
    local = make_algorithm(make_env(config), config)
    mixed = make_algorithm(make_env(config), config.replace(trust="shuffle"))
    assert mixed.eps > 3 * 0.5
    assert mixed.mech.output_radius / local.mech.output_radius == pytest.approx(math.tanh(0.25) / math.tanh(mixed.eps / 2))
    assert mixed.mech.output_radius < local.mech.output_radius / 2.9


def test_the_smallest_round_is_the_batch():
    config = shuffled("ldp-sgd", users=4100, round_size=2000)     # rounds of 2000, 2000, 100
    assert smallest_batch(config) == 100
    assert run_local(config).summary["privacy_shuffle_batch"] == 100


@pytest.mark.parametrize("changes,field", [({"round_size": 1, "users": 50}, "round_size"),
                                           ({"round_size": 20, "users": 100}, "round_size")])
def test_a_batch_too_small_to_amplify_is_refused(changes, field):
    with pytest.raises(ConfigError) as caught:
        run_local(shuffled("ldp-sgd", **changes))
    assert caught.value.field == field and "--round-size" in caught.value.reason


def test_only_local_dp_algorithms_can_be_shuffled():
    with pytest.raises(ConfigError) as caught:
        make_algorithm(make_env(shuffled("linucb")), shuffled("linucb"))
    assert caught.value.field == "trust" and "not a local-DP algorithm" in caught.value.reason


def test_cli_runs_shuffle_and_names_the_option_it_refuses(capsys, tmp_path):
    assert main(["run", "ldp-sgd", "--users", "3000", "--round-size", "1000", "--trust", "shuffle", "--delta",
                 "1e-6", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "privacy (shuffle): each user's randomizer at eps0 = 2.72" in out
    assert "the smallest group of users on one randomizer in a shuffled batch: 1,000 (round 0)" in out
    with pytest.raises(SystemExit) as caught:
        main(["run", "ldp-sgd", "--users", "50", "--trust", "shuffle", "--quiet"])
    assert caught.value.code == 2 and "--round-size" in capsys.readouterr().err
    # S shufflers: the batch is a shuffler's share of the round
    assert main(["run", "ldp-sgd", "--users", "4000", "--round-size", "2000", "--trust", "shuffle", "--shufflers", "2",
                 "--delta", "1e-6", "--quiet"]) == 0
    assert "shuffled batch (a round among 2 shufflers): 1,000 (round 0)" in capsys.readouterr().out
    for bad, named in ((["--shufflers", "0", "--trust", "shuffle"], "--shufflers"),
                       (["--shufflers", "2"], "--trust-option shufflers"),
                       (["--trust-option", "shufflers=2"], "--trust-option shufflers"),
                       (["--trust", "shuffle", "--trust-option", "shufflers=0"], "--trust-option shufflers"),
                       (["--trust", "shuffle", "--trust-option", "shuffler=2"], "did you mean 'shufflers'")):
        with pytest.raises(SystemExit) as caught:
            main(["run", "ldp-sgd", "--users", "4000", "--round-size", "2000", "--quiet", *bad])
        assert caught.value.code == 2 and named in capsys.readouterr().err


def test_local_is_unchanged():
    config = RunConfig("ldp-sgd", users=2000, round_size=100, seed=2)
    assert config.trust == "local"
    a, b = run_local(config), run_local(config.replace(trust="local"))
    assert np.array_equal(a.table["regret"], b.table["regret"])
    assert a.summary["privacy_trust"] == "local" and all("trust" not in row for row in a.ledger)


def test_a_sweep_file_shuffles_its_ldp_algorithms(tmp_path):
    from ldpfed.sweep_spec import build, configs, read

    path = tmp_path / "s.toml"
    path.write_text('name = "mixed"\nalgorithms = ["ldp-sgd", "linucb"]\nusers = 4000\nround_size = 2000\n'
                    'delta = 1e-6\ntrust = "shuffle"\n')
    runs = {c.algorithm: c for c in configs(build(read(path)))}
    assert runs["ldp-sgd"].trust == "shuffle" and runs["linucb"].trust == "local"   # central: its own model
    path.write_text(path.read_text() + "shufflers = 2\n")
    runs = {c.algorithm: c for c in configs(build(read(path)))}
    assert runs["ldp-sgd"].shufflers == 2 and runs["linucb"].shufflers == 1


def test_the_ray_engine_builds_the_same_shuffled_algorithm(ray_session):
    from test_ray_engine import run_ray_unreserved

    config = shuffled("ldp-ols", users=3000, round_size=1000, populations=2)
    local, ray = run_local(config), run_ray_unreserved(config, actors=2, shards=2, mode="per-user")
    assert local.table.equals(ray.table) and local.summary["privacy_eps0"] == ray.summary["privacy_eps0"]
    assert not ray.summary.get("rejected_messages")       # the shards check the eps0 mechanisms' domains


def test_a_shuffled_server_cannot_tell_who_sent_what():
    """Under shuffle the aggregate is a function of the round's multiset of messages: ldp-sgd's rows permuted among
    the users give the same sums and the same update (its steps eta_t are applied as the round's mean)."""
    config = shuffled("ldp-sgd", env_params={"d": 4, "K": 3})
    algo = make_algorithm(make_env(config), config)
    users = np.arange(2000, 4000)
    Z = np.random.default_rng(0).standard_normal((len(users), 4))
    sums = algo.aggregate({"Z": Z}, users)
    permuted = algo.aggregate({"Z": Z[np.random.default_rng(1).permutation(len(users))]}, users)
    np.testing.assert_allclose(sums["Z"], permuted["Z"], rtol=1e-12)
    theta = {"theta": np.zeros(4)}
    moved = algo.update(theta, sums, 2000, 4000, np.random.default_rng(2))["theta"]
    eta = algo.step / (users + 1.0 + algo.step_offset)
    np.testing.assert_allclose(moved, -eta.mean() * Z.sum(axis=0), rtol=1e-9)
    local = make_algorithm(make_env(config), config.replace(trust="local"))
    np.testing.assert_allclose(local.aggregate({"Z": Z}, users)["Z"], (eta[:, None] * Z).sum(axis=0), rtol=1e-9)


def test_an_aggregate_that_multiplies_message_entries_cannot_be_shuffled():
    with pytest.raises(ConfigError, match="cannot tell who sent what") as error:
        make_algorithm(make_env(shuffled("ldp-bco-one-point")), shuffled("ldp-bco-one-point"))
    assert error.value.field == "trust"

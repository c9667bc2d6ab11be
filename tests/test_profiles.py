"""Profiles: RunConfig(profile=...) is validated, reaches envs and algorithms, and the CLI and run_all pass it on."""
import subprocess
import sys

import pytest

from ldpfed.algorithms import REGISTRY, make_algorithm
from ldpfed.config import PROFILES, RunConfig
from ldpfed.envs import ENVS, make_env
from ldpfed.errors import ConfigError


def test_profile_defaults_to_paper_and_is_validated():
    assert RunConfig("ldp-sgd").profile == "paper"
    assert RunConfig("ldp-sgd", profile="authors-code").profile == "authors-code"
    for bad in ("authors", "", None, "Paper"):
        with pytest.raises(ConfigError) as error:
            RunConfig("ldp-sgd", profile=bad)
        assert error.value.field == "profile"


def test_profile_defaults_name_known_options():
    """A profile may only change the default of an option the class declares (else it would be a silent no-op)."""
    for cls in [*REGISTRY.values(), *ENVS.values()]:
        for profile, options in cls.profile_defaults.items():
            assert profile in PROFILES, (cls, profile)
            assert set(options) <= set(cls.defaults), (cls, set(options) - set(cls.defaults))


def test_profile_reaches_env_and_algorithm_and_user_options_win():
    config = RunConfig("ldp-sgd", users=100, profile="authors-code")
    env = make_env(config)
    assert env.noise_std == 0.0                         # the authors' noiseless rewards
    assert make_algorithm(env, config).profile == "authors-code"
    env = make_env(config.replace(env_params={"noise_std": 0.2}))
    assert env.noise_std == 0.2                         # an explicit option beats the profile's default
    multi = make_env(RunConfig("ldp-sgd-multi", users=100, profile="authors-code"))
    assert multi.gaussian_contexts and multi.noise_std == 0.05
    assert not make_env(RunConfig("ldp-sgd-multi", users=100)).gaussian_contexts


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "ldpfed", *args], capture_output=True, text=True, timeout=120)


def test_cli_profile_option():
    done = _cli("run", "ldp-sgd", "--users", "500", "--profile", "authors-code", "--quiet")
    assert done.returncode == 0, done.stderr
    assert "profile=authors-code" in done.stdout
    bad = _cli("run", "ldp-sgd", "--users", "500", "--profile", "nope")
    assert bad.returncode == 2 and "--profile" in bad.stderr


def test_run_all_passes_the_profile():
    sys.path.insert(0, "jobs")
    try:
        import run_all
    finally:
        sys.path.remove("jobs")
    from ldpfed.sweep import configs as sweep_configs

    _, args = run_all.parse_args(["--profile", "authors-code", "--algorithms", "ldp-sgd,uniform", "--users", "100"])
    sweep, _ = run_all.load_sweep(args)
    configs = sweep_configs(sweep)
    assert configs and all(c.profile == "authors-code" for c in configs)

"""The trust-model door as a plugin author meets it (docs/writing-a-trust-model.md): a model with an option of its
own, given on the command line, in a sweep file and in RunConfig, validated before any work, recorded in the config,
the checkpoint, the summary and MLflow's params, and the ledger rows labelled by the model."""
import json

import pytest

from ldpfed.algorithms import make_algorithm
from ldpfed.cli import main
from ldpfed.config import RunConfig
from ldpfed.engine import run_local
from ldpfed.envs import make_env
from ldpfed.trust import TRUST_MODELS, TrustModel
from ldpfed.tracking.records import run_params
from ldpfed.util.errors import ConfigError
from ldpfed.util.options import Option


class Budgeted(TrustModel):
    """A deployment that spends only a share of the run's eps on its users' randomizers."""

    name = "test-budgeted"
    about = "local randomizers at a share of --eps"
    options = {"share": Option(0.5, low=0.0, high=1.0, low_open=True, doc="the share of eps the users spend")}

    def build(self, cls, world, config):
        algo = cls(world, config.replace(eps=config.eps * config.trust_options["share"], trust="local"))
        algo.trust = self
        return algo

    def refusal(self, algo):
        return None if algo.privacy_model == "ldp" else "it has no local randomizer"


@pytest.fixture
def budgeted():
    TRUST_MODELS.register(Budgeted)
    yield Budgeted
    TRUST_MODELS.unregister(Budgeted.name)


def test_an_option_of_a_plugin_model_is_validated_recorded_and_labels_the_ledger(budgeted, tmp_path):
    config = RunConfig("ldp-sgd", users=2000, round_size=100, eps=1.0, trust="test-budgeted",
                       trust_options={"share": 0.25})
    assert config.trust_options == {"share": 0.25}
    assert RunConfig("ldp-sgd", trust="test-budgeted").trust_options == {"share": 0.5}     # the default, recorded
    for bad, says in (({"share": 0.0}, r"must be a finite number in \(0, 1\]"), ({"share": "x"}, "must be"),
                      ({"shares": 0.3}, "did you mean 'share'")):
        with pytest.raises(ConfigError, match=says) as caught:
            RunConfig("ldp-sgd", trust="test-budgeted", trust_options=bad)
        assert caught.value.field.startswith("trust_options.")
    result = run_local(config)
    assert result.summary["privacy_eps_composed"] == pytest.approx(0.25)
    assert result.summary["privacy_trust"] == "test-budgeted" and result.summary["privacy_trust_share"] == 0.25
    assert result.ledger and all(row["trust"] == "test-budgeted" for row in result.ledger)
    assert run_params(result)["trust_options.share"] == "0.25"
    assert make_algorithm(make_env(config), config).eps == pytest.approx(0.25)


def test_the_command_line_and_a_sweep_file_give_the_option(budgeted, tmp_path, capsys):
    assert main(["run", "ldp-sgd", "--users", "2000", "--round-size", "100", "--trust", "test-budgeted",
                 "--trust-option", "share=0.2", "--out", str(tmp_path / "run"), "--quiet"]) == 0
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["privacy_trust"] == "test-budgeted" and saved["privacy_trust_share"] == 0.2
    with pytest.raises(SystemExit) as caught:
        main(["run", "ldp-sgd", "--trust", "test-budgeted", "--trust-option", "share=2", "--quiet"])
    assert caught.value.code == 2 and "--trust-option share" in capsys.readouterr().err
    assert main(["describe", "test-budgeted"]) == 0
    out = capsys.readouterr().out
    assert "share" in out and "the share of eps the users spend" in out

    from ldpfed.sweep_spec import build, configs, read

    path = tmp_path / "s.toml"
    path.write_text('name = "door"\nalgorithms = ["ldp-sgd", "linucb"]\nusers = 2000\nround_size = 100\n'
                    'trust = "test-budgeted"\n\n[trust_options]\nshare = 0.3\n')
    runs = {c.algorithm: c for c in configs(build(read(path)))}
    # in reach: the model's options; out of reach (decided on the built algorithm): local, as documented
    assert runs["ldp-sgd"].trust == "test-budgeted" and runs["ldp-sgd"].trust_options == {"share": 0.3}
    assert runs["linucb"].trust == "local" and runs["linucb"].trust_options == {}
    path.write_text(path.read_text().replace("share = 0.3", "share = 3"))
    with pytest.raises(ConfigError, match="trust_options.share"):
        build(read(path))


def test_every_built_in_model_declares_itself_through_the_door():
    for name in ("local", "shuffle", "central"):
        cls = TRUST_MODELS[name]
        assert cls.about and cls.noise_at in ("user", "server", "shares", "none")
        assert cls.checked_options({}) == {key: option.default for key, option in cls.options.items()}
    assert TRUST_MODELS["central"].noise_at == "server" and TRUST_MODELS["shuffle"].noise_at == "user"


def test_a_sweeps_command_line_gives_the_trust_model_and_its_options_over_the_files():
    from ldpfed.sweep_spec import add_arguments, configs, load, overrides_from_args
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--trust", "secagg", "--trust-option", "dropout=0.1", "--trust-option",
                              "min_survivors=0.85", "--users", "2000"])
    overrides = overrides_from_args(args)
    assert overrides["trust_options"] == {"dropout": 0.1, "min_survivors": 0.85}
    sweep, _, _ = load("example", overrides)
    runs = {c.algorithm: c for c in configs(sweep)}
    assert runs["ldp-ols"].trust == "secagg" and runs["ldp-ols"].trust_options["dropout"] == 0.1
    assert runs["ols"].trust == "local"                     # not private: out of the model's reach
    with pytest.raises(ConfigError, match="trust_options.dropout"):
        load("example", {"trust": "secagg", "trust_options": {"dropout": 0.9}})

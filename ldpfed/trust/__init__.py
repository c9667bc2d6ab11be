"""Trust models: where the noise goes, not a different algorithm (ldpfed.trust.base says what a model declares and
does). The registry holds every class registered under the entry point group `ldpfed.trust_models`: ldpfed's
built-ins (pyproject.toml: local, shuffle, central) and any installed plugin's alike, plus LDPFED_PLUGINS
(ldpfed/plugins.py). docs/writing-a-trust-model.md is the guide."""
from ldpfed.mechanisms.noise import FieldNoise
from ldpfed.plugins import TRUST_GROUP, Registry
from ldpfed.trust.base import LOCAL, NOISE_AT, SERVER_VIEWS, TrustModel, check_trust_class
from ldpfed.util.errors import ConfigError

TRUST_MODELS = Registry(TRUST_GROUP, "trust model", lambda: TrustModel, check_trust_class)


def trust_model(config_or_name) -> TrustModel:
    """The trust model of a RunConfig (or by name): a fresh instance of its registered class."""
    name = getattr(config_or_name, "trust", config_or_name)
    if name not in TRUST_MODELS:
        raise ConfigError("trust", name, f"unknown; choose from {sorted(TRUST_MODELS)}")
    return TRUST_MODELS[name]()


def trust_help() -> str:
    """Every registered trust model with its one-line `about`, for the CLI's --trust help."""
    return "; ".join(f"{name}: {TRUST_MODELS[name].about or 'a plugin trust model'}" for name in sorted(TRUST_MODELS))


__all__ = ["FieldNoise", "LOCAL", "NOISE_AT", "SERVER_VIEWS", "TRUST_MODELS", "TrustModel", "trust_help",
           "trust_model"]

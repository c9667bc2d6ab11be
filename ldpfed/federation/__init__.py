"""Federation models: which of a round's users really take part (ldpfed.federation.base says what a model declares
and does, and the semantics every engine implements). The registry holds every class registered under the entry
point group `ldpfed.federations`: ldpfed's built-ins (pyproject.toml: ideal, availability) and any installed
plugin's alike, plus LDPFED_PLUGINS (ldpfed/plugins.py). docs/federation.md is the guide."""
from ldpfed.federation.base import IDEAL, Federation, check_federation_class
from ldpfed.plugins import FEDERATION_GROUP, Registry
from ldpfed.util.errors import ConfigError

FEDERATIONS = Registry(FEDERATION_GROUP, "federation model", lambda: Federation, check_federation_class)


def federation_model(config) -> Federation:
    """The federation model of a RunConfig, built with its seed, populations and options."""
    name = config.federation
    if name not in FEDERATIONS:
        raise ConfigError("federation", name, f"unknown; choose from {sorted(FEDERATIONS)}")
    return FEDERATIONS[name].of(config)


def federation_help() -> str:
    """Every registered federation model with its one-line `about`, for the CLI's --federation help."""
    return "; ".join(f"{name}: {FEDERATIONS[name].about or 'a plugin federation model'}"
                     for name in sorted(FEDERATIONS))


__all__ = ["FEDERATIONS", "Federation", "IDEAL", "federation_help", "federation_model"]

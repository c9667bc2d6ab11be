"""Federation models: which of a round's users really take part (ldpfed.federation.base says what a model declares
and does, and the semantics every engine implements). The registry holds every class registered under the entry
point group `ldpfed.federations`: ldpfed's built-ins (pyproject.toml: ideal, availability, heterogeneous, latency,
realistic) and any installed plugin's alike, plus LDPFED_PLUGINS (ldpfed/plugins.py). docs/federation.md is the guide."""
import functools
import json

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


@functools.lru_cache(maxsize=8)
def _cached(name: str, options: str, seed: int, populations: int) -> Federation:
    return FEDERATIONS[name](seed, populations, json.loads(options))


def federation_of(config) -> Federation:
    """The federation model of a RunConfig, built once per (model, options, seed, populations) in a process: for
    the trust models' accounting, which asks for it round after round."""
    return _cached(config.federation, json.dumps(config.federation_options, sort_keys=True), int(config.seed),
                   int(config.populations))


def federation_help() -> str:
    """Every registered federation model with its one-line `about`, for the CLI's --federation help."""
    return "; ".join(f"{name}: {FEDERATIONS[name].about or 'a plugin federation model'}"
                     for name in sorted(FEDERATIONS))


__all__ = ["FEDERATIONS", "Federation", "IDEAL", "federation_help", "federation_model", "federation_of"]

"""ldpfed: differentially private bandit learning, simulated as a federated system on Ray.

    import ldpfed
    result = ldpfed.sweep("quick", users=2000, workers=2, tracking=False)   # a sweep: ldpfed/sweep_runner.py
    result.table                                                            # one row per run (a DataFrame)
    ldpfed.run(ldpfed.RunConfig("ldp-sgd", users=10_000, eps=1.0))          # one run: ldpfed/engine

The names below are imported when first used, so `import ldpfed` stays cheap.
"""
import importlib

_EXPORTS = {"sweep": ("ldpfed.sweep_runner", "sweep"), "SweepResult": ("ldpfed.sweep_runner", "SweepResult"),
            "run": ("ldpfed.engine", "run"), "RunConfig": ("ldpfed.config", "RunConfig"),
            "ConfigError": ("ldpfed.util.errors", "ConfigError"),
            "TrackingUnavailable": ("ldpfed.tracking.store", "TrackingUnavailable")}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ldpfed' has no attribute {name!r}")
    module, attribute = _EXPORTS[name]
    loaded = importlib.import_module(module)
    return loaded if attribute is None else getattr(loaded, attribute)


def __dir__():
    return sorted(set(globals()) | set(__all__))

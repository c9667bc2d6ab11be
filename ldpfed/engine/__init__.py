"""Engines run a RunConfig to a RunResult: single process (reference) or Ray (federated)."""
from ldpfed.engine.core import RunResult
from ldpfed.engine.local import run_local
from ldpfed.errors import ConfigError

ENGINES = ("local", "ray")


def run(config, engine: str = "local", progress=None, **ray_options) -> RunResult:
    """The one way to run a config; `ray_options` (actors, shards, mode, address, ...) go to the Ray engine."""
    if engine == "local":
        return run_local(config, progress=progress)
    if engine == "ray":
        from ldpfed.engine.ray_engine import run_ray  # Ray is imported only when asked for

        return run_ray(config, progress=progress, **ray_options)
    raise ConfigError("engine", engine, f"must be one of {ENGINES}")


__all__ = ["ENGINES", "RunResult", "run", "run_local"]

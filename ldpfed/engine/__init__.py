"""Engines run a RunConfig to a RunResult: single process (reference) or Ray (federated)."""
from ldpfed.engine.core import RunResult
from ldpfed.engine.local import run_local
from ldpfed.util.errors import ConfigError

ENGINES = ("local", "ray")


def run(config, engine: str = "local", progress=None, fast: bool = True, checkpointer=None,
        **ray_options) -> RunResult:
    """The one way to run a config; `ray_options` (actors, shards, mode, address, round_timeout, ...) go to the
    Ray engine. checkpointer: an `ldpfed.engine.checkpoint.Checkpointer`; the run resumes from its file if any.

    engine="local" at round size 1 with one population uses the compiled sequential engine (engine/sequential.py:
    same algorithm, same privacy, same distribution of results, ~30x faster) when it supports the algorithm, its
    env and options; fast=False, or anything it does not support, runs run_local. The sequential engine writes
    no checkpoints (its runs are short; a killed one is run again). Every engine runs with the BLAS pools of
    ldpfed.util.threads (one thread by default)."""
    if engine == "local":
        if fast and config.round_size == 1 and config.populations == 1:
            from ldpfed.engine.sequential import run_sequential, sequential_unsupported

            if sequential_unsupported(config) is None:
                return run_sequential(config, progress=progress)
        return run_local(config, progress=progress, checkpointer=checkpointer)
    if engine == "ray":
        from ldpfed.engine.ray_engine import run_ray  # Ray is imported only when asked for

        return run_ray(config, progress=progress, checkpointer=checkpointer, **ray_options)
    raise ConfigError("engine", engine, f"must be one of {ENGINES}")


__all__ = ["ENGINES", "RunResult", "run", "run_local"]

"""How many threads numpy's BLAS and OpenMP pools use in a simulation process: one by default.

A round's linear algebra is small (d x d solves, d-vectors): a BLAS pool spinning several threads on it buys
nothing and takes the cores of parallel sweep workers and of Ray actors on the same machine (measured: ldp-sgd,
2e6 users, 5.9 s of CPU with the default pools, 3.5 s with one thread, at the same speed). The engines run under
`limited()`, the Ray actors call `limit()` once; LDPFED_BLAS_THREADS sets another number (e.g. for a LASSO with a
large d on an otherwise idle machine).
"""
from __future__ import annotations

import os

from threadpoolctl import threadpool_limits

from ldpfed.util.errors import ConfigError

VARIABLE = "LDPFED_BLAS_THREADS"


def blas_threads() -> int:
    """LDPFED_BLAS_THREADS (default 1), checked."""
    text = os.environ.get(VARIABLE, "1")
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(VARIABLE, text, "must be a whole number of threads >= 1")
    return value


def limited():
    """A context in which the BLAS and OpenMP pools use blas_threads() threads (restored on exit)."""
    return threadpool_limits(limits=blas_threads())


def limit() -> None:
    """blas_threads() threads from now on, in this whole process (a Ray actor's, a sweep worker's)."""
    threadpool_limits(limits=blas_threads())

"""Loops compiled around an algorithm's or env's own compiled functions, with those functions inlined.

The compiled algorithms (ldpfed.algorithms.compiled) and envs (ldpfed.envs.base.EnvSteps) write one user's step
as a numba function. The loops that run those steps for a round of users (or, in the sequential engine, for every
user) are built here per set of functions, as closures that call them by name, and numba inlines the functions
into the loop (`inline="always"` on a copy of each). A loop that took them as arguments instead paid a real call
per user and step (numba cannot inline a function that arrives from its disk cache): a quarter of the time of the
fast algorithms. A step that numba cannot type once inlined (e.g. one that relies on a branch pruned by the type
of its own arguments) is called as it is: the loop is rebuilt without inlining on the first TypingError.

Loops are compiled once per process and set of functions (about a second; not cached on disk: numba's cache of a
closure grows a new entry in every process) and kept in `_LOOPS`.
"""
from __future__ import annotations

from numba import njit
from numba.core.errors import TypingError

_INLINED: dict = {}
_LOOPS: dict = {}


def inlined(function):
    """A copy of the compiled `function` that numba inlines into its callers (None stays None)."""
    if function is None:
        return None
    if function not in _INLINED:
        _INLINED[function] = njit(inline="always")(function.py_func)
    return _INLINED[function]


def as_is(function):
    return function


def loops(key, build):
    """The loops `build(use)` makes for `key` (a tuple of functions), once per process: `use(f)` is the function a
    loop calls for f (inlined; as it is after a TypingError). Returns a function or a tuple of them, as
    build does."""
    if key not in _LOOPS:
        built = build(inlined)
        single = not isinstance(built, tuple)
        _LOOPS[key] = {"functions": [built] if single else list(built), "inline": True}
        guarded = [_guard(key, build, i, single) for i in range(len(_LOOPS[key]["functions"]))]
        _LOOPS[key]["guarded"] = guarded[0] if single else tuple(guarded)
    return _LOOPS[key]["guarded"]


def _guard(key, build, index, single):
    def call(*args):
        entry = _LOOPS[key]
        try:
            return entry["functions"][index](*args)
        except TypingError:
            if not entry["inline"]:
                raise
            rebuilt = build(as_is)                # typing fails before anything runs: nothing to undo
            entry["functions"], entry["inline"] = ([rebuilt] if single else list(rebuilt)), False
            return entry["functions"][index](*args)
    return call

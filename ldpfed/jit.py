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

import types

from numba import njit
from numba.core.dispatcher import Dispatcher
from numba.core.errors import TypingError

_INLINED: dict = {}
_LOOPS: dict = {}


def inlined(function):
    """A copy of the compiled `function` that numba inlines into its callers (None stays None), calling inlined
    copies of the compiled functions it calls by name in turn: a helper left as a real call (e.g. a clip or a dot
    product) costs the call and, for each array view passed to it, a reference count taken and dropped (atomic
    operations) per user."""
    if function is None:
        return None
    if function not in _INLINED:
        _INLINED[function] = function       # a call back into it while its copy is built stays a plain call
        options = {key: value for key, value in function.targetoptions.items() if key != "nopython"}
        options["inline"] = "always"
        _INLINED[function] = njit(**options)(_with_inlined_calls(function.py_func))
    return _INLINED[function]


def _with_inlined_calls(py_func):
    """py_func with the compiled functions its code names as globals bound to their inlined copies (in a copy of
    its module's globals: the module's own names stay as they are)."""
    names = set()
    stack = [py_func.__code__]
    while stack:
        code = stack.pop()
        names.update(code.co_names)
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    called = {name: py_func.__globals__[name] for name in names
              if isinstance(py_func.__globals__.get(name), Dispatcher)}
    if not called:
        return py_func
    namespace = dict(py_func.__globals__)
    namespace.update({name: inlined(f) for name, f in called.items()})
    copy = types.FunctionType(py_func.__code__, namespace, py_func.__name__, py_func.__defaults__,
                              py_func.__closure__)
    copy.__kwdefaults__, copy.__qualname__ = py_func.__kwdefaults__, py_func.__qualname__
    return copy


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

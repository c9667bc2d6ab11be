"""Loops compiled around an algorithm's or env's own compiled functions, with those functions inlined, and cached on
disk once per machine.

The compiled algorithms (ldpfed.algorithms.compiled) and envs (ldpfed.envs.base.EnvSteps) write one user's step
as a numba function. The loops that run those steps for a round of users (or, in the sequential engine, for every
user) are built here per set of functions: `build(use)` writes them as closures that call the functions by name, and
numba inlines the functions into the loop (`inline="always"` on a copy of each). A loop that took them as arguments
instead paid a real call per user and step (numba cannot inline a function that arrives from its disk cache): a
quarter of the time of the fast algorithms. A step that numba cannot type once inlined (e.g. one that relies on a
branch pruned by the type of its own arguments) is called as it is: the loop is rebuilt without inlining on the
first TypingError (and a marker file says so to the next process).

**The compile cache.** numba's own cache of a closure grows a new entry in every process (its key pickles the
closure's cells, and a dispatcher pickles with a per-process id), so each loop is written out as a real module
instead: the closures' source, their free variables and the globals they read becoming the module's globals, bound
to the same objects after the module is run. numba then caches the module's functions with `cache=True`, keyed by
the module's file, which is named by a hash of everything the loops compile: their own source and options, and,
recursively, every function they call or inline (bytecode, constants, names, compile options, closure cells) and
every constant global those read (numbers, strings, tuples, arrays by content), with the Python, numba and numpy
versions. An edit to any of them names a new file; nothing stale is ever loaded. A second process's first run
loads the loops from disk (tens of milliseconds each) instead of compiling them (about a second each).

Where: `$LDPFED_CACHE_DIR` when set (`off` turns the disk cache off: loops are then compiled per process), else
`$NUMBA_CACHE_DIR/ldpfed` when numba's cache folder is set, else `$XDG_CACHE_HOME/ldpfed/numba` (by default
`~/.cache/ldpfed/numba`). A folder that cannot be written also turns it off. Concurrent processes (sweep workers,
test workers, Ray actors) share it safely: a module is written to a temporary file and renamed into place (its
content and modification time are fixed by its hash, so a second writer's rename changes nothing numba checks),
and numba writes its index and data files the same way. Files of edited functions are left behind; deleting the
folder at any time only costs a compile.

`compile_seconds()` is this process's time spent in numba's compiler (compiling, or loading compiled code from the
disk cache) so far: a run's summary reports its share as `compile_s` (ldpfed.engine.core.make_result).
"""
from __future__ import annotations

import ast
import hashlib
import inspect
import os
import sys
import textwrap
import threading
import time
import types
import uuid
from pathlib import Path

import numba
import numpy as np
from numba import njit
from numba.core import event
from numba.core.dispatcher import Dispatcher
from numba.core.errors import TypingError

CACHE_ENV = "LDPFED_CACHE_DIR"
MODULE_PREFIX = "ldpfed_loops_"
FORMAT = 2                      # of the generated modules: a change renames every file
MTIME = 1_000_000_000           # every generated module's modification time (numba's cache checks it and the size)

_INLINED: dict = {}
_LOOPS: dict = {}


# ---- time in numba's compiler --------------------------------------------------------------------------------------
class _CompileClock(event.Listener):
    """Time inside numba's compiler lock (outermost acquisitions, per thread), which numba holds while it compiles
    or loads a function from its disk cache (and, once per process, while it sets up its typing registries)."""

    def __init__(self):
        self.seconds = 0.0
        self._local, self._lock = threading.local(), threading.Lock()

    def on_start(self, ev):
        depth = getattr(self._local, "depth", 0)
        if depth == 0:
            self._local.started = time.perf_counter()
        self._local.depth = depth + 1

    def on_end(self, ev):
        depth = getattr(self._local, "depth", 0)
        if depth <= 0:          # registered while the lock was held
            return
        self._local.depth = depth - 1
        if depth == 1:
            with self._lock:
                self.seconds += time.perf_counter() - self._local.started


_CLOCK = _CompileClock()
event.register("numba:compiler_lock", _CLOCK)


def compile_seconds() -> float:
    """Seconds this process has spent in numba's compiler so far (compiling, or loading from the disk cache)."""
    return _CLOCK.seconds


def loop_counts() -> dict:
    """{"compiled": n, "loaded": m}: the loops' (signatures') compiles and loads from the disk cache in this
    process so far."""
    compiled = loaded = 0
    for entry in list(_LOOPS.values()):
        for function in entry["functions"]:
            compiled += sum(getattr(function, "_cache_misses", {}).values())
            loaded += sum(getattr(function, "_cache_hits", {}).values())
    return {"compiled": compiled, "loaded": loaded}


# ---- inlined copies -------------------------------------------------------------------------------------------------
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


def _names(code) -> set:
    """Every name the code (and the code nested in it) reads as a global or an attribute."""
    names, stack = set(), [code]
    while stack:
        code = stack.pop()
        names.update(code.co_names)
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return names


def _with_inlined_calls(py_func):
    """py_func with the compiled functions its code names as globals bound to their inlined copies (in a copy of
    its module's globals: the module's own names stay as they are)."""
    called = {name: py_func.__globals__[name] for name in _names(py_func.__code__)
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


# ---- the cache key --------------------------------------------------------------------------------------------------
_PRINTS: dict = {}      # id -> (object, fingerprint): objects kept alive, so an id is never reused while here


def _code_print(code) -> tuple:
    """What a code object computes, without its file, line numbers or name of the file it came from."""
    return ("code", code.co_name, code.co_code, code.co_names, code.co_varnames, code.co_freevars,
            code.co_cellvars, code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount, code.co_flags,
            tuple(_code_print(c) if isinstance(c, types.CodeType) else (type(c).__name__, repr(c))
                  for c in code.co_consts))


def _function_print(py_func, options, stack) -> tuple[tuple, bool]:
    parts, cyclic = [], False
    for value in (() if py_func.__closure__ is None else [cell.cell_contents for cell in py_func.__closure__]):
        digest, cycle = _print(value, stack)
        parts.append(digest)
        cyclic |= cycle
    globals_ = py_func.__globals__
    for name in sorted(_names(py_func.__code__)):
        if name in globals_:
            digest, cycle = _print(globals_[name], stack)
            parts.append((name, digest))
            cyclic |= cycle
    for value in py_func.__defaults__ or ():
        digest, cycle = _print(value, stack)
        parts.append(("default", digest))
        cyclic |= cycle
    # its module too: numba's cached code names the modules of the functions it calls and imports them when it
    # loads, so the same code moved to another module is another entry (an old one would name a module now gone)
    return ("function", py_func.__module__, _code_print(py_func.__code__), repr(sorted(options.items())),
            tuple(parts)), cyclic


def _print(value, stack) -> tuple[str, bool]:
    """(digest, whether it met a function already being described: then it is not kept for reuse)."""
    known = _PRINTS.get(id(value))
    if known is not None and known[0] is value:
        return known[1], False
    if any(value is seen for seen in stack):
        return "cycle:" + getattr(value, "__qualname__", type(value).__name__), True
    stack = stack + (value,)
    cyclic, keep = False, False
    if isinstance(value, Dispatcher):
        described, cyclic = _function_print(value.py_func, value.targetoptions, stack)
        keep = True
    elif isinstance(value, types.FunctionType):
        described, cyclic = _function_print(value, {}, stack)
        keep = True
    elif value is None or isinstance(value, (bool, int, float, complex, str, bytes, np.generic)):
        described = (type(value).__name__, repr(value))
    elif isinstance(value, (tuple, list)):
        items = [_print(v, stack) for v in value]
        described, cyclic = (type(value).__name__, tuple(d for d, _ in items)), any(c for _, c in items)
    elif isinstance(value, dict):
        items = [(repr(k), _print(v, stack)) for k, v in sorted(value.items(), key=lambda kv: repr(kv[0]))]
        described, cyclic = ("dict", tuple((k, d) for k, (d, _) in items)), any(c for _, (_, c) in items)
    elif isinstance(value, np.ndarray):
        described = ("array", str(value.dtype), value.shape,
                     hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest())
    elif isinstance(value, types.ModuleType):
        described = ("module", value.__name__)
    else:   # a class, a numpy ufunc, a numba builtin, ...: by name (and its repr when that has no address)
        text = repr(value)
        described = ("object", type(value).__module__, type(value).__qualname__, getattr(value, "__module__", None),
                     getattr(value, "__qualname__", getattr(value, "__name__", None)),
                     "" if " at 0x" in text or len(text) > 1000 else text)
    digest = hashlib.sha256(repr(described).encode()).hexdigest()
    if keep and not cyclic:     # functions only: a constant (an array, a list) may change between builds
        _PRINTS[id(value)] = (value, digest)
    return digest, cyclic


def _fingerprint(value) -> str:
    """A digest of everything `value` contributes to code that numba compiles around it: for a compiled (or plain)
    function its bytecode, options, closure cells and the globals it reads, recursively; for a constant its value."""
    return _print(value, ())[0]


class _Uncacheable(Exception):
    pass


def _module_text(functions) -> tuple[str, dict, list]:
    """(source, namespace, options): the built loops as one module's source (their closures' free variables and the
    globals they read become module globals, bound to `namespace` after the module runs) and their compile
    options."""
    sources, namespace, options = [], {}, []
    for dispatcher in functions:
        if not isinstance(dispatcher, Dispatcher):
            raise _Uncacheable(f"{dispatcher!r} is not a compiled function")
        py_func = dispatcher.py_func
        bound = {}
        if py_func.__closure__ is not None:
            bound.update(zip(py_func.__code__.co_freevars, (c.cell_contents for c in py_func.__closure__)))
        bound.update({name: py_func.__globals__[name] for name in _names(py_func.__code__)
                      if name in py_func.__globals__ and name not in bound})
        for name, value in bound.items():
            if name in namespace and namespace[name] is not value:
                raise _Uncacheable(f"two loops read different objects as {name}")
            namespace[name] = value
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(py_func)))
        except (OSError, TypeError, SyntaxError) as error:
            raise _Uncacheable(f"no source for {py_func.__qualname__}: {error}") from None
        definition = tree.body[0]
        if not isinstance(definition, ast.FunctionDef) or definition.name != py_func.__name__:
            raise _Uncacheable(f"the source of {py_func.__qualname__} is not its def")
        definition.decorator_list = []
        sources.append(ast.unparse(definition))
        options.append({k: v for k, v in dispatcher.targetoptions.items() if k not in ("nopython", "cache")})
    names = [f.py_func.__name__ for f in functions]
    if len(set(names)) != len(names) or set(names) & set(namespace):
        raise _Uncacheable("two loops of one build share a name")
    return "\n\n\n".join(sources) + "\n", namespace, options


def cache_key(functions) -> str:
    """The hash that names the module of these built loops: their source and options and, recursively, everything
    they read (see the module doc)."""
    return _key(*_module_text(functions))


def _key(source: str, namespace: dict, options: list) -> str:
    described = (FORMAT, sys.version, numba.__version__, np.__version__, source, repr(options),
                 tuple((name, _fingerprint(namespace[name])) for name in sorted(namespace)))
    return hashlib.sha256(repr(described).encode()).hexdigest()[:32]


def cache_dir() -> Path | None:
    """Where the loops' modules (and numba's cache of them) live; None: not on disk (see the module doc)."""
    value = os.environ.get(CACHE_ENV)
    if value is not None:
        if value.strip().lower() in ("", "0", "off", "none", "no", "false"):
            return None
        return Path(value).expanduser()
    if os.environ.get("NUMBA_CACHE_DIR"):
        return Path(os.environ["NUMBA_CACHE_DIR"]).expanduser() / "ldpfed"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ldpfed" / "numba"


def _write_once(path: Path, text: str) -> None:
    """The file at `path` with this text, written once by whichever process comes first: to a temporary name, its
    modification time fixed, then renamed into place (atomic; a later writer's identical file changes nothing)."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        temporary.write_text(text)
        os.utime(temporary, (MTIME, MTIME))
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def _from_disk(functions, directory: Path):
    """The built loops as functions of a generated module under `directory`, compiled with numba's cache."""
    source, namespace, options = _module_text(functions)
    key = _key(source, namespace, options)
    path = directory / f"{functions[0].py_func.__name__}_{key}.py"
    text = (f"# ldpfed.util.jit: the loops {', '.join(f.py_func.__qualname__ for f in functions)}, cache key {key}.\n"
            f"# Generated; ldpfed.util.jit binds their globals when it loads them. Safe to delete.\n\n{source}")
    _write_once(path, text)
    # named by the key: numba's cached code names the module of its globals, and imports it when loaded in a process
    # that has not made it yet (here, it has: sys.modules)
    name = MODULE_PREFIX + key
    module = sys.modules.get(name)
    if module is None or module.__file__ != str(path):    # (the same loops under another cache folder: tests)
        module = types.ModuleType(name)
        module.__file__ = str(path)
        exec(compile(text, str(path), "exec"), module.__dict__)
        sys.modules[name] = module
    module.__dict__.update(namespace)
    made = tuple(njit(cache=True, **opts)(module.__dict__[f.py_func.__name__]) for f, opts in zip(functions, options))
    return made, path


def _build(build, use):
    """build(use), from the disk cache when there is one: (functions as build returns them, the module's path or
    None, why not cached or None)."""
    built = build(use)
    directory = cache_dir()
    if directory is None:
        return built, None, f"${CACHE_ENV} is off"
    single = not isinstance(built, tuple)
    try:
        made, path = _from_disk([built] if single else list(built), directory)
    except Exception as error:      # never a failed run for the cache's sake: the loops are compiled here, as built
        return built, None, f"{type(error).__name__}: {error}"
    return (made[0] if single else made), path, None


def loops(key, build):
    """The loops `build(use)` makes for `key` (a tuple of functions), once per process and, through the disk cache,
    compiled once per machine: `use(f)` is the function a loop calls for f (inlined; as it is after a TypingError).
    Returns a function or a tuple of them, as build does."""
    if key not in _LOOPS:
        built, path, why = _build(build, inlined)
        inline = True
        if path is not None and _marker(path).exists():       # an earlier process found it does not type inlined
            built, path, why = _build(build, as_is)
            inline = False
        single = not isinstance(built, tuple)
        _LOOPS[key] = {"functions": [built] if single else list(built), "inline": inline, "path": path,
                       "uncached": why}
        guarded = [_guard(key, build, i, single) for i in range(len(_LOOPS[key]["functions"]))]
        _LOOPS[key]["guarded"] = guarded[0] if single else tuple(guarded)
    return _LOOPS[key]["guarded"]


def _marker(path: Path) -> Path:
    return path.with_name(path.stem + ".as-is")


def _guard(key, build, index, single):
    def call(*args):
        entry = _LOOPS[key]
        try:
            return entry["functions"][index](*args)
        except TypingError:
            if not entry["inline"]:
                raise
            if entry["path"] is not None:
                try:
                    _write_once(_marker(entry["path"]), "the loops of this module are built without inlining\n")
                except OSError:
                    pass
            rebuilt, entry["path"], entry["uncached"] = _build(build, as_is)   # typing fails before anything runs
            entry["functions"], entry["inline"] = ([rebuilt] if single else list(rebuilt)), False
            return entry["functions"][index](*args)
    return call

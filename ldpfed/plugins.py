"""Where algorithms and envs come from: one door for the built-ins and everyone else's.

Every algorithm and env is found through a Python entry point of an installed package: group `ldpfed.algorithms`
(an `Algorithm` subclass) or `ldpfed.envs` (an `Env` subclass), the entry point's name being the class's `name`.
ldpfed's own built-ins are declared the same way in its pyproject.toml, so a plugin can do whatever a built-in
can. A package installed on every node of a Ray cluster is found there the same way.

For code that is not installed (a script, a notebook, a folder shipped to Ray workers with a runtime environment's
`py_modules`), the environment variable LDPFED_PLUGINS lists "module:attribute" references, comma-separated, each
naming a class (or a list of classes); the Ray engine passes the driver's LDPFED_PLUGINS on to its workers.

Nothing is imported until a registry is first read (a plugin module may itself import ldpfed.algorithms).
This module sits at the bottom: it knows entry points and classes, never what an algorithm or env is; the
registries in `ldpfed.algorithms` and `ldpfed.envs` say which base class and which checks apply.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
from collections.abc import Mapping

from ldpfed.util.errors import ConfigError

ALGORITHM_GROUP = "ldpfed.algorithms"
ENV_GROUP = "ldpfed.envs"
TRUST_GROUP = "ldpfed.trust_models"
FEDERATION_GROUP = "ldpfed.federations"
PLUGINS_VAR = "LDPFED_PLUGINS"
BUILT_IN = "ldpfed"                       # the distribution whose entry points are the built-ins
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
# The profiles, which an algorithm's or env's `profile_defaults` are keyed by (a run picks one: RunConfig.profile).
# "paper": the papers' text, privacy-correct (the default). "authors-code": the choices of the authors' public code
# where it differs from the text (rewards, clip rules, steps, initialisation, estimators, contexts); algorithms and
# envs without such differences run identically under both. See the profile table in docs/tracking-and-sweeps.md.
PROFILES = ("paper", "authors-code")


class PluginError(ConfigError):
    """A plugin that cannot be loaded or breaks the contract; the message names the entry point (or reference),
    the package it comes from and what is wrong (a ConfigError: the CLI reports it and exits with status 2)."""

    def __init__(self, message: str, field: str = "plugin"):
        self.field, self.value, self.reason = field, None, message
        ValueError.__init__(self, message)


def load_reference(reference: str):
    """The object that "module:attribute" (attribute may be dotted) names."""
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise PluginError(f"{PLUGINS_VAR} entry {reference!r}: expected 'module:attribute'")
    try:
        obj = importlib.import_module(module_name)
    except Exception as error:
        raise PluginError(f"{reference}: cannot import {module_name!r} ({type(error).__name__}: {error})") from error
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise PluginError(f"{reference}: module {module_name!r} has no {attribute!r}") from None
    return obj


def environment_references() -> list[str]:
    """The references listed in LDPFED_PLUGINS (empty when unset)."""
    return [part.strip() for part in os.environ.get(PLUGINS_VAR, "").split(",") if part.strip()]


class Registry(Mapping):
    """name -> class, read-only, filled on first use from the entry points of `group` (built-ins first, then other
    packages by name) and from LDPFED_PLUGINS (its classes that are subclasses of `base`), then from `register`.

    base: a zero-argument callable returning the base class (called at load time, so the registry's module does
    not import what the plugins import). check(cls, source): raises PluginError when a class breaks the contract.
    """

    def __init__(self, group: str, kind: str, base, check=None):
        self.group, self.kind, self._base, self._check = group, kind, base, check
        REGISTRIES.append(self)
        self._classes: dict | None = None
        self._sources: dict[str, str] = {}
        self._loading = False

    # ---- Mapping ------------------------------------------------------------------------------
    def __getitem__(self, name):
        return self._loaded()[name]

    def __iter__(self):
        return iter(self._loaded())

    def __len__(self):
        return len(self._loaded())

    def __contains__(self, name):
        return name in self._loaded()

    def __repr__(self):
        return f"Registry({self.group}: {sorted(self._loaded())})"

    # ---- what users call -------------------------------------------------------------------------
    def source(self, name: str) -> str:
        """Where `name` comes from: "ldpfed" (built in), a package name, "LDPFED_PLUGINS" or "register()"."""
        self._loaded()
        return self._sources[name]

    def register(self, cls, source: str = "register()"):
        """Add a class defined in this process (a script, a notebook, a test). Workers of other processes (Ray)
        do not see it: install it as a package, or list it in LDPFED_PLUGINS. Returns cls (usable as a decorator)."""
        self._add(cls, getattr(cls, "name", None), source)
        return cls

    def unregister(self, name: str) -> None:
        """Remove a class added by `register` (tests); built-ins and installed plugins cannot be removed."""
        if self._sources.get(name) != "register()":
            raise PluginError(f"{self.kind} {name!r} was not added by register()")
        del self._loaded()[name]
        del self._sources[name]

    # ---- loading ---------------------------------------------------------------------------------
    def _loaded(self) -> dict:
        if self._classes is None:
            if self._loading:     # a plugin module read the registry while it was being filled
                raise PluginError(f"the {self.kind} registry was read while loading its plugins (a plugin module "
                                  f"must not look {self.kind}s up at import time)")
            self._loading = True
            try:
                self._classes = {}
                self._load_entry_points()
                self._load_environment()
            except BaseException:
                self._classes = None
                self._sources = {}
                raise
            finally:
                self._loading = False
        return self._classes

    def _load_entry_points(self) -> None:
        points = list(importlib.metadata.entry_points(group=self.group))
        if not any(_distribution(point) == BUILT_IN for point in points):
            raise PluginError(f"no built-in {self.kind}s: the entry points of group {self.group!r} from the "
                              f"ldpfed package are missing (install it: pip install -e .)")
        points.sort(key=lambda point: (_distribution(point) != BUILT_IN, _distribution(point), point.name))
        for point in points:
            package = _distribution(point)
            where = f"entry point {point.name!r} = {point.value!r} of package {package!r}"
            try:
                cls = point.load()
            except Exception as error:
                raise PluginError(f"{where}: cannot load it ({type(error).__name__}: {error})") from error
            self._add(cls, point.name, package, where)

    def _load_environment(self) -> None:
        base = self._base()
        bases = tuple(registry._base() for registry in REGISTRIES)
        for reference in environment_references():
            obj = load_reference(reference)
            for cls in (obj if isinstance(obj, (list, tuple)) else [obj]):
                if not (isinstance(cls, type) and issubclass(cls, bases)):   # neither an algorithm nor an env
                    kinds = " or ".join(f"{b.__module__}.{b.__name__}" for b in bases)
                    raise PluginError(f"{PLUGINS_VAR} entry {reference!r}: {cls!r} is not a subclass of {kinds}")
                if issubclass(cls, base):
                    self._add(cls, getattr(cls, "name", None), PLUGINS_VAR, f"{PLUGINS_VAR} entry {reference!r}")

    def _add(self, cls, name, source: str, where: str | None = None) -> None:
        classes = self._loaded()
        where = where or f"{self.kind} {name!r} ({source})"
        base = self._base()
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise PluginError(f"{where}: must name a subclass of {base.__module__}.{base.__name__}, not {cls!r}")
        if getattr(cls, "name", None) != name:
            raise PluginError(f"{where}: the class's name attribute is {getattr(cls, 'name', None)!r}; it must be "
                              f"the entry point's name {name!r}")
        if not isinstance(name, str) or not NAME_PATTERN.match(name):
            raise PluginError(f"{where}: name {name!r} must be lower case letters, digits, '-' or '_'")
        if name in classes:
            if classes[name] is cls:      # the same class through two doors (an entry point and LDPFED_PLUGINS)
                return
            raise PluginError(f"{where}: {self.kind} {name!r} is already provided by {self._sources[name]!r}")
        if self._check is not None:
            self._check(cls, where)
        classes[name] = cls
        self._sources[name] = source


REGISTRIES: list[Registry] = []     # every registry made (ldpfed.algorithms', ldpfed.envs'), in order


def _distribution(point) -> str:
    dist = getattr(point, "dist", None)
    return dist.metadata["Name"] if dist is not None else "?"

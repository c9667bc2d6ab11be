"""The contract every algorithm keeps, built-in or plugin, checked in code (not only in docstrings).

`check_class` runs when a class is registered (ldpfed/plugins.py): what can be told without building it.
`check_instance` runs on every algorithm the engines build (`make_algorithm`): its message fields, their domains
and mechanisms, and its privacy ledger. A break raises PluginError naming the algorithm and the field.

The rules (tests/test_plugins.py breaks each one on purpose; ldpfed.testing checks more, by running the algorithm):
* every message field has a per-user shape of positive integers, and a Domain of that shape: what the server
  shards check every client's values against (the server trusts no client); only a ledger that voids its own
  claim (`claim_void`: a profile reproducing code with unbounded inputs) may lack them;
* under local DP ("ldp") every field is either made by one of the algorithm's mechanisms (`mechanisms[field]`) or
  listed in `public_fields` (a public schedule, a public count): nothing raw leaves the client half;
* `public_fields` are message fields;
* every ledger row names a mechanism's guarantee (eps > 0, 0 <= delta < 1), counts `per_user` >= 1 outputs, and
  the rows compose (ldpfed.mechanisms.accounting); a private algorithm has at least one row;
* an algorithm written once (ldpfed.algorithms.compiled) declares fields(), each made by a mechanism that can
  privatize a compiled row (row_kernel, draw_rows) or passed as it is; its steps are compiled functions; its
  state holds the state_keys as numpy arrays, the model_keys among them; metric_names are names.
"""
from __future__ import annotations

import math

from ldpfed.mechanisms import accounting
from ldpfed.plugins import PROFILES, PluginError

PRIVACY_MODELS = ("ldp", "central", "none")
# What a subclass must write itself: the base class raises NotImplementedError for these.
REQUIRED_METHODS = ("initial_state", "update", "act", "encode", "message_spec")
# What fields() declares for a class (Algorithm derives them from it): a class writes one or the other.
DERIVED_METHODS = ("message_spec", "message_domains")


def check_class(cls, where: str) -> None:
    """PluginError when `cls` (an Algorithm subclass) breaks what can be checked without building it."""
    from ldpfed.algorithms.base import Algorithm

    def fail(what, why):
        raise PluginError(f"{where}: {what}: {why}", field=f"{cls.name}.{what}")

    if cls.privacy_model not in PRIVACY_MODELS:
        fail("privacy_model", f"{cls.privacy_model!r} must be one of {list(PRIVACY_MODELS)}")
    kinds = cls.env_kinds
    if not isinstance(kinds, (tuple, list)) or not kinds or not all(isinstance(k, str) for k in kinds):
        fail("env_kinds", f"{kinds!r} must be a non-empty tuple of env names")
    if cls.default_env not in kinds and not _default_env_runs(cls):
        fail("default_env", f"{cls.default_env!r} must be one of env_kinds {list(kinds)} or a registered env of "
                            f"one of those kinds")
    if not isinstance(cls.defaults, dict):
        fail("defaults", f"{cls.defaults!r} must be a dict of option -> default")
    for profile, options in cls.profile_defaults.items():
        if profile not in PROFILES:
            fail("profile_defaults", f"unknown profile {profile!r} (profiles: {list(PROFILES)})")
        unknown = set(options) - set(cls.defaults)
        if unknown:
            fail(f"profile_defaults.{profile}", f"options {sorted(unknown)} are not in defaults")
    if cls.fields is not Algorithm.fields:
        by_hand = [m for m in DERIVED_METHODS if getattr(cls, m) is not getattr(Algorithm, m)]
        if by_hand:
            fail("fields", f"declared, but the class (or a parent) also writes {', '.join(by_hand)}: one "
                           f"declaration, so either fields() or those methods")
    for method in REQUIRED_METHODS:
        if method == "message_spec" and cls.fields is not Algorithm.fields:
            continue                     # the message is declared as fields()
        if getattr(cls, method) is getattr(Algorithm, method):
            fail(method, "not implemented (every algorithm writes initial_state, update, act, encode, and "
                         "fields() or message_spec)")


def _default_env_runs(cls) -> bool:
    """Whether the default env is a registered env of one of the algorithm's kinds (an env plugin's world, say)."""
    from ldpfed.envs import ENVS

    return isinstance(cls.default_env, str) and cls.default_env in ENVS and cls.runs_on(cls.default_env)


def check_instance(algo) -> None:
    """PluginError when a built algorithm breaks the contract (see the module doc)."""
    name = algo.name

    def fail(what, why):
        raise PluginError(f"algorithm {name!r}: {what}: {why}", field=f"{name}.{what}")

    spec = algo.message_spec()
    if not isinstance(spec, dict):
        fail("message_spec", f"must return a dict field -> per-user shape, not {type(spec).__name__}")
    for field, shape in spec.items():
        if not isinstance(shape, tuple) or not all(isinstance(s, int) and s >= 1 for s in shape):
            fail(f"message field {field!r}", f"shape {shape!r} must be a tuple of positive integers")
    # the algorithm's own message (a trust model may have the users send their share of the aggregate instead)
    declared = set(algo._fields) if getattr(algo, "_fields", None) is not None else set(spec)
    extra = set(algo.public_fields) - declared
    if extra:
        fail(f"public_fields {sorted(extra)}", "not message fields")
    rows = algo.ledger()
    # A profile that reproduces code whose inputs are unbounded says so (claim_void): it claims no guarantee and
    # has no bounded domain to declare; its runs stay on the single-process engine (the shards refuse it).
    if not any(row.get("claim_void") for row in rows):
        _check_domains(algo, spec, fail)
    if algo.privacy_model == "ldp":
        for field in (spec if getattr(algo, "_fields", None) is None else algo._fields):
            if field not in algo.public_fields and field not in algo.mechanisms:
                fail(f"message field {field!r}", "is made by no mechanism and is not public: under local DP a "
                                                 "field must be a mechanism's output (mechanisms[field]) or listed "
                                                 "in public_fields")
    if algo.privacy_model != "none" and not rows:
        fail("ledger", f"empty: a {algo.privacy_model} algorithm must state what its mechanisms guarantee")
    for row in rows:
        label = f"ledger row {row.get('message')!r}"
        eps, delta = row.get("eps"), row.get("delta")
        if not (isinstance(eps, (int, float)) and eps > 0 and not math.isnan(eps)):
            fail(label, f"eps {eps!r} must be a number > 0")
        if not (isinstance(delta, (int, float)) and 0 <= delta < 1):
            fail(label, f"delta {delta!r} must be in [0, 1)")
        per_user = row.get("per_user", 1)
        if isinstance(per_user, bool) or not isinstance(per_user, int) or per_user < 1:
            fail(label, f"per_user {per_user!r} must be an integer >= 1 (how many outputs one user's data changes)")
    if rows:
        try:
            accounting.compose(rows, algo.delta, pld=False)   # every engine process builds one: no PLD here
        except Exception as error:       # a ledger the accountant cannot compose
            fail("ledger", f"does not compose ({type(error).__name__}: {error})")
    from ldpfed.algorithms.compiled import CompiledAlgorithm

    if isinstance(algo, CompiledAlgorithm):
        _check_compiled(algo, fail)


def _check_compiled(algo, fail) -> None:
    """What the compiled paths rely on (see the module doc)."""
    import numpy as np
    from numba.core.dispatcher import Dispatcher

    if algo._fields is None:
        fail("fields", "a compiled algorithm declares its message as fields() (the row layout follows from it)")
    for key, declared in algo._fields.items():
        mech = declared.mechanism
        if mech is not None and not (callable(getattr(mech, "row_kernel", None))
                                     and callable(getattr(mech, "draw_rows", None))):
            fail(f"message field {key!r}", f"its mechanism {type(mech).__name__} cannot privatize a compiled row "
                                           f"(it offers no row_kernel / draw_rows: ldpfed.mechanisms.rows)")
    steps = algo.steps()
    for part in ("act", "prepare", "weigh", "update", "finish"):
        if not isinstance(getattr(steps, part, None), Dispatcher):
            fail(f"steps.{part}", f"{getattr(steps, part, None)!r} must be a numba-compiled function (@njit)")
    if getattr(steps, "fold", None) is not None:
        if not isinstance(steps.fold, Dispatcher):
            fail("steps.fold", f"{steps.fold!r} must be a numba-compiled function (@njit) or None")
        if not algo.sum_fields():
            fail("sum_fields", "a folded aggregate (steps.fold) declares its fields {name: shape} in sum_fields()")
    if not all(isinstance(name, str) for name in algo.metric_names):
        fail("metric_names", f"{algo.metric_names!r} must be a tuple of names")
    missing = set(algo.model_keys) - set(algo.state_keys)
    if missing:
        fail("model_keys", f"{sorted(missing)} are not state_keys")
    state = algo.initial_state(np.random.default_rng(0))
    for key in algo.state_keys:
        if not isinstance(state.get(key), np.ndarray):
            fail(f"state_keys.{key}", f"initial_state()[{key!r}] must be a numpy array (scalars: shape (1,)), "
                                      f"not {type(state.get(key)).__name__}")


def _check_domains(algo, spec: dict, fail) -> None:
    """Every message field has a Domain of its spec's shape (what the server shards check every client against)."""
    try:
        domains = algo.cached_domains()
    except NotImplementedError as error:
        fail("message_domains", str(error))
    for field, shape in spec.items():
        if field not in domains:
            fail(f"message field {field!r}", "has no domain: the server shards could not check it (declare it in "
                                             "message_domains, or make it with a mechanism that has one)")
        if tuple(domains[field].shape) != tuple(shape):
            fail(f"message field {field!r}", f"its domain has shape {domains[field].shape}, the spec {shape}")

"""The conformance kit: what a plugin author's own tests call on their algorithm, the same checks ldpfed runs on
every built-in (tests/test_conformance.py).

    from ldpfed.testing import check_algorithm, ConformanceError, CHECKS

    def test_my_algorithm_conforms():
        report = check_algorithm(MyAlgorithm)      # a class or a registered name; raises ConformanceError
        assert set(report) == set(CHECKS)

The registry checks a class's shape when it is registered and every built instance's declarations when an engine
builds it (ldpfed/algorithms/contract.py). What declarations cannot show is whether the code keeps them: whether
encode's messages have the declared shapes, whether it clips before privatizing, whether its noise gives the
privacy its ledger claims, whether it peeks at the env's ground truth, whether its public fields are data-free,
whether it runs bit-identically on every engine path. Each check below runs the algorithm to find out:

1. "contract"      check_instance; draw_act's shape against act_draws (compiled algorithms); then encode's
                   messages against message_spec (fields, per-user shapes, one numeric dtype for every batch: the
                   shards' wire format), and aggregate against aggregate_bounds.
2. "ledger"        the ledger composes within the configured (eps, delta); no void claim (unless the profile is
                   authors-code); every mechanism has its row; the noise the rows say is drawn supports their claim
                   (dp-accounting's eps of the same composition, from the noise, is not above the basic total).
3. "clipping"      honest messages lie in their Domains; so do messages built from contexts scaled by up to 1e12
                   and rewards of +-1e12 (an unclipped input breaks the domain: public bounds plus the noise tail),
                   and so do their aggregates (aggregate_bounds); and, for the mechanisms of ldpfed, the data encode
                   hands to a mechanism spreads no further than the sensitivity of its ledger row.
4. "privacy_audit" (LDP only) every mechanism, known only through its protocol, on its worst neighbouring inputs:
                   its outputs must not tell them apart beyond its claim (its dp_event's noise, else its
                   guarantee; ldpfed.mechanisms.audit.audit_samples: planned to catch noise 1/1.5 of the claim
                   with probability >= 0.95); and an empirical lower bound on eps from neighbouring users
                   (Clopper-Pearson) must not exceed the ledger's composed eps.
5. "no_truth"      nothing reachable from the algorithm, its model or its server state is an Env or one of the
                   env's arrays; `world` is a PublicWorld.
6. "public_fields" (private algorithms) with the same randomness, other users' data gives the same public fields.
7. "engines"       the local engine twice and the Ray engine (pre-aggregated with 1 shard, per-user with 2) give
                   the same per-round table, bit for bit.

A check returns "passed" or "skipped: why" and raises ConformanceError naming the check, the algorithm and, where
there is one, the message field. Statistical checks use fixed seeds and confidence bounds, so an honest algorithm
fails them with probability below AUDIT_ALPHA whatever the seed.
"""
from __future__ import annotations

import math
import os
import re
import traceback
import types

import numpy as np

from ldpfed.algorithms import REGISTRY, Algorithm
from ldpfed.algorithms.compiled import CompiledAlgorithm
from ldpfed.algorithms.contract import check_instance
from ldpfed.trust import trust_model
from ldpfed.trust.local import LocalTrust
from ldpfed.trust.shuffling import GroupsBroken, check_groups
from ldpfed.config import RunConfig
from ldpfed.engine.core import simulate_population
from ldpfed.envs import make_env
from ldpfed.envs.base import Env, PublicWorld
from ldpfed.mechanisms import accounting, audit
from ldpfed.plugins import PLUGINS_VAR, PluginError, environment_references, load_reference
from ldpfed.util.errors import ConfigError
from ldpfed.util.rng import derive

CHECKS = ("contract", "ledger", "clipping", "privacy_audit", "no_truth", "public_fields", "engines")

# privacy_audit: the confidence (an algorithm that meets its claims fails the check with probability at most
# AUDIT_ALPHA: its audits share it, Bonferroni) and, for the end-to-end audit of encode, samples per neighbour to
# choose the event (pilot) and to measure it. Each mechanism's audit plans its own sample size (within
# ldpfed.mechanisms.audit.MIN_N..MAX_N) to flag noise 1/1.5 of its claim with probability >= 0.95.
PILOT_N = 2_000
AUDIT_N = 10_000
AUDIT_ALPHA = 1e-3
AUDIT_CHUNK = 2_000           # users per encode call of the audit (bounds memory for large messages)
# clipping: how far beyond the public bounds the hostile inputs go (contexts scaled by these, with random signs;
# rewards these multiples of the reward bound, and +-1e12 outright).
HOSTILE_SCALES = (1e-3, 1.0, 7.0, 1e6, 1e12)
HOSTILE_REWARDS = (-1e12, -1e6, -7.0, -1.0, 0.0, 0.4, 1.0, 7.0, 1e6, 1e12)
# ledger: dp-accounting's PLD is pessimistic by at most PLD_INTERVAL per composed mechanism; rounding of the sums.
LEDGER_RTOL = 1e-9
RAY_SKIP = ("class not importable by Ray workers; install it as a package or list it in "
            f"{PLUGINS_VAR}")


class ConformanceError(AssertionError):
    """An algorithm that breaks the contract, found by running it: names the check, the algorithm and, where there
    is one, the message field (`check`, `algorithm`, `field`)."""

    def __init__(self, check: str, algorithm: str, message: str, field: str | None = None):
        self.check, self.algorithm, self.field, self.reason = check, algorithm, field, message
        where = f", message field {field!r}" if field else ""
        super().__init__(f"conformance check {check!r} failed for algorithm {algorithm!r}{where}: {message}")

    def __reduce__(self):          # picklable (its __init__ does not take the formatted message)
        return type(self), (self.check, self.algorithm, self.reason, self.field)


# ---- the one entry point -------------------------------------------------------------------------------------
def check_algorithm(cls_or_name, env=None, *, params=None, env_params=None, eps=1.0, delta=0.01, users=120,
                    round_size=12, seed=0, ray=True, checks=None, settings=None, trust="local",
                    trust_options=None) -> dict:
    """Run the conformance checks on an algorithm (an Algorithm subclass, or a registered name) on env (None: its
    default env); returns {check: "passed" | "skipped: why"} in CHECKS order, raises ConformanceError at the first
    failure. A class not in the registry is registered for the duration of the call (the engines build algorithms
    by name). ray=False skips the Ray half of "engines"; with ray=True, Ray is used if initialized, else a local
    instance is started for the check and shut down after it.

    params and env_params: the algorithm's and the env's options (RunConfig.params / env_params, e.g.
    params={"explore": 0.2}, env_params={"dim": 8, "arms": 5}), checked as `python -m ldpfed run --param` /
    `--env-param` checks them. settings: a list of settings to check in turn, each a dict of this function's
    keyword arguments (env, params, env_params, eps, delta, users, round_size, seed) overriding the ones given
    here; the result is then {label: report} with one label per setting (`setting_label`), and a failure's
    ConformanceError names the setting in its `algorithm`.

    trust, trust_options: the run's trust model (RunConfig.trust) and its options. Under another model than local,
    the algorithm is built by that model (its reach refused as a ConfigError naming trust), "contract", "ledger",
    "no_truth" and "engines" check what it builds and runs (the model's messages and ledger rows; the same bits on
    every engine), and the checks of the local model's messages ("clipping", "privacy_audit", "public_fields") are
    skipped, saying so."""
    selected = _selected(checks)
    base = {"env": env, "params": params, "env_params": env_params, "eps": eps, "delta": delta, "users": users,
            "round_size": round_size, "seed": seed, "trust": trust, "trust_options": trust_options}
    runs = [({}, base)] if settings is None else [(s, {**base, **_setting(s)}) for s in settings]
    cls, added = _resolve(cls_or_name)
    try:
        reports = {}
        for setting, kwargs in runs:
            label = setting_label(setting)
            subject = Subject(cls, ray=ray, name=f"{cls.name} [{label}]" if setting else None, **kwargs)
            reports[label] = {name: _run(name, subject) for name in selected}
        return reports[""] if settings is None else reports
    finally:
        if added:
            REGISTRY.unregister(cls.name)


SETTING_KEYS = ("env", "params", "env_params", "eps", "delta", "users", "round_size", "seed")


def _setting(setting) -> dict:
    if not isinstance(setting, dict):
        raise ConfigError("settings", setting, "each setting is a dict of check_algorithm's keyword arguments")
    unknown = sorted(set(setting) - set(SETTING_KEYS))
    if unknown:
        raise ConfigError("settings", unknown, f"unknown keys; choose from {list(SETTING_KEYS)}")
    return setting


def setting_label(setting: dict) -> str:
    """A setting as one line, e.g. "env=linear params={'explore': 0.2} users=500" ("" for none)."""
    return " ".join(f"{key}={setting[key]!r}" if isinstance(setting[key], str) else f"{key}={setting[key]}"
                    for key in SETTING_KEYS if key in setting)


def _selected(checks) -> list[str]:
    if checks is None:
        return list(CHECKS)
    names = [checks] if isinstance(checks, str) else list(checks)
    unknown = [name for name in names if name not in CHECKS]
    if unknown:
        raise ConfigError("checks", unknown, f"unknown checks; choose from {list(CHECKS)}")
    return [name for name in CHECKS if name in names]


def _resolve_in(registry, base, cls_or_name, refused):
    """(class, whether this call registered it) for a kit's subject: a registered name, or a subclass of `base`
    registered for the call (`refused(name, error)`: the kit's error when the registry's checks refuse it)."""
    kind = registry.kind
    if isinstance(cls_or_name, str):
        if cls_or_name not in registry:
            raise ConfigError(kind, cls_or_name, f"not registered; registered: {sorted(registry)}")
        return registry[cls_or_name], False
    cls = cls_or_name
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ConfigError(kind, cls, f"must be an {base.__name__} subclass or a registered name")
    name = getattr(cls, "name", "")
    if name in registry:
        if registry[name] is not cls:
            raise PluginError(f"{kind} {name!r} is already provided by {registry.source(name)!r} (another class): "
                              f"give yours another name", field=f"{name}.name")
        return cls, False
    try:
        registry.register(cls)
    except PluginError as error:       # the registry's checks: what can be told without building it
        raise refused(name or repr(cls), error) from error
    return cls, True


def _resolve(cls_or_name):
    """(class, whether this call registered it)."""
    return _resolve_in(REGISTRY, Algorithm, cls_or_name,
                      lambda name, error: ConformanceError("contract", name, str(error), _message_field(error)))


def _run(name: str, subject: "Subject") -> str:
    """One check: "passed", "skipped: why", or ConformanceError (an unexpected exception of the algorithm's code
    is a failure of the check that ran it)."""
    try:
        outcome = CHECK_FUNCTIONS[name](subject)
    except ConformanceError:
        raise
    except Exception as error:
        frame = traceback.extract_tb(error.__traceback__)[-1]          # where the algorithm's code failed
        try:
            path = os.path.relpath(frame.filename)
        except ValueError:                                              # another drive
            path = frame.filename
        where = f" (at {path}:{frame.lineno}, in {frame.name})"
        raise ConformanceError(name, subject.name, f"raised {type(error).__name__}: {error}{where}") from error
    return "passed" if outcome is None else outcome


class Subject:
    """The algorithm under test and the run it is checked in; every check builds its own instance."""

    def __init__(self, cls, env, *, eps, delta, users, round_size, seed, ray, params=None, env_params=None,
                 name=None, trust="local", trust_options=None):
        self.cls = cls
        self.name = name or cls.name     # what a failure calls it (with the setting, when there are several)
        self.eps, self.delta, self.users, self.round_size, self.seed = eps, delta, users, round_size, seed
        self.ray = ray
        self.env_name = env
        self.params, self.env_params = dict(params or {}), dict(env_params or {})
        self.trust, self.trust_options = trust, dict(trust_options or {})
        self.config()          # usage errors (an env it does not run on, bad sizes or options) raise ConfigError here

    def config(self, populations: int = 1) -> RunConfig:
        return RunConfig(self.cls.name, env=self.env_name, users=self.users, round_size=self.round_size,
                         populations=populations, eps=self.eps, delta=self.delta, seed=self.seed,
                         params=dict(self.params), env_params=dict(self.env_params), trust=self.trust,
                         trust_options=dict(self.trust_options))

    def build(self):
        """(config, env, algorithm), built as make_algorithm does but without its contract check (check 1's): by
        the run's trust model (the class itself under local)."""
        config = self.config()
        env = make_env(config)
        if self.local():
            return config, env, REGISTRY[self.cls.name](env.public(), config)
        return config, env, trust_model(config).build(REGISTRY[self.cls.name], env.public(), config)

    def local(self) -> bool:
        """Whether the run is under the local model (every check applies)."""
        return type(trust_model(self.config())) is LocalTrust

    def local_only(self, check: str) -> str | None:
        """The skip of a check about the local model's messages, under another trust model."""
        if self.local():
            return None
        return (f"skipped: {check} checks the local model's messages; under --trust {self.trust} the users send "
                f"the trust model's (contract, ledger, no_truth and engines check those)")

    def fail(self, check: str, message: str, field: str | None = None):
        raise ConformanceError(check, self.name, message, field)

    def batches(self, config) -> list[np.ndarray]:
        """Users of two batches: the run's first users (warm-up, initialization schedules) and its last ones."""
        n = min(config.round_size, config.users)
        return [np.arange(n, dtype=np.int64), np.arange(config.users - n, config.users, dtype=np.int64)]


def _message_field(error, algo=None) -> str | None:
    """The message field a contract error is about, if any (named in its `field`, "<algorithm>.<what>"); with the
    algorithm, only a name that is one of its message fields."""
    found = re.search(r"(?:message field|ledger row) '([^']+)'", str(getattr(error, "field", "")))
    if found is None:
        return None
    return found.group(1) if algo is None else _field_of(algo, found.group(1))


def _model(algo, config):
    return algo.publish(algo.initial_state(derive(config.seed, "init")))


def _client_round(algo, env, model, users, seed: int):
    """(contexts, actions, rewards) of these users, from generators keyed by seed (as a population's round)."""
    nature, client = np.random.default_rng([seed, 1]), np.random.default_rng([seed, 2])
    contexts = env.contexts(users, nature)
    actions = algo.act(model, contexts, users, client)
    rewards, _ = env.step(contexts, actions, users, nature)
    return contexts, actions, rewards


# ---- 1. contract -----------------------------------------------------------------------------------------------
def check_contract(subject: Subject):
    """check_instance on a built instance, then what it does against what it declares: encode's fields and per-user
    shapes are message_spec's (the shards reject anything else), in one numeric dtype for every batch (the
    per-user wire format is probed once), and aggregate's fields are those aggregate_bounds bounds."""
    check = "contract"
    config, env, algo = subject.build()
    try:
        check_instance(algo)
    except PluginError as error:
        subject.fail(check, str(error), _message_field(error, algo))
    if isinstance(algo, CompiledAlgorithm):      # compiled code does not check bounds: a short row is read past
        draws = np.asarray(algo.draw_act(3, np.random.default_rng(0)))
        if draws.shape != (3, algo.act_draws):
            subject.fail(check, f"draw_act(3, rng) has shape {draws.shape}, act_draws = {algo.act_draws} says "
                                f"(3, {algo.act_draws}): act would read past its draws")
    spec = algo.message_spec()
    model = _model(algo, config)
    dtypes = {}
    for batch, users in enumerate(subject.batches(config)):
        messages, _, metrics = simulate_population(algo, env, model, config.seed, batch, 0, users,
                                                   pre_aggregate=False)
        if not isinstance(messages, dict):
            subject.fail(check, f"encode returned {type(messages).__name__} messages, not a dict field -> array")
        if not isinstance(metrics, dict):
            subject.fail(check, f"encode returned {type(metrics).__name__} metrics, not a dict of counters")
        for field in sorted(set(spec) | set(messages)):
            if field not in messages:
                subject.fail(check, "declared in message_spec, missing from encode's messages", field)
            if field not in spec:
                subject.fail(check, "sent by encode, not declared in message_spec", field)
            value = np.asarray(messages[field])
            want = (len(users), *spec[field])
            if value.shape != want:
                subject.fail(check, f"encode made shape {value.shape} for {len(users)} users, message_spec says "
                                    f"{spec[field]} per user, i.e. {want}", field)
            if value.dtype.kind not in "biuf":
                subject.fail(check, f"dtype {value.dtype} is not numeric", field)
            if dtypes.setdefault(field, value.dtype) != value.dtype:
                subject.fail(check, f"dtype {value.dtype} for users {users[0]}.., {dtypes[field]} for the first "
                                    f"users: the per-user wire format must not change", field)
        sums = algo.aggregate(messages, users)
        if not isinstance(sums, dict):
            subject.fail(check, f"aggregate returned {type(sums).__name__}, not a dict")
        try:
            bounds = algo.sum_bounds(users)
        except NotImplementedError as error:
            subject.fail(check, f"aggregate_bounds: {error} (pre-aggregated server shards check population sums "
                                f"against it)")
        if set(bounds) != set(sums):
            subject.fail(check, f"aggregate_bounds covers {sorted(bounds)}, aggregate makes {sorted(sums)}")


# ---- 2. ledger -------------------------------------------------------------------------------------------------
def check_ledger(subject: Subject):
    """The ledger composes within the configured budget, claims something (no void rows outside the authors-code
    profile), has a row for every mechanism, and claims no more than the noise the rows record can give:
    dp-accounting's eps of the same composition (computed from the noise drawn, the sensitivity and the node counts)
    at the configured delta is at most the basic total, up to its discretization."""
    check = "ledger"
    config, env, algo = subject.build()
    rows = algo.ledger()
    if not rows:
        if algo.privacy_model != "none":
            subject.fail(check, f"empty ledger for a {algo.privacy_model} algorithm")
        return "skipped: privacy model 'none' and an empty ledger: nothing to compose"
    listed = {row.get("message") for row in rows}
    for key in algo.mechanisms:
        if key not in listed:
            subject.fail(check, f"mechanism {key!r} has no ledger row: what it spends is not accounted",
                         _field_of(algo, key))
    try:
        composed = accounting.compose(rows, config.delta)
    except Exception as error:
        subject.fail(check, f"the ledger does not compose ({type(error).__name__}: {error})")
    if composed.void:
        if algo.profile == "authors-code":
            return f"skipped: claim void under profile authors-code ({composed.void})"
        row = next(row for row in rows if row.get("claim_void"))
        subject.fail(check, f"claim void ({composed.void}): only profile authors-code may reproduce unprivate "
                            f"code", _field_of(algo, row.get("message")))
    try:
        accounting.check_budget(composed, config.eps, config.delta, subject.name)
    except ConfigError as error:
        subject.fail(check, f"over budget: {error}")
    if composed.eps_pld is not None:
        slack = composed.eps * LEDGER_RTOL + accounting.PLD_INTERVAL * sum(
            int(row.get("per_user", 1)) * int(row.get("nodes", 1)) for row in rows)
        if composed.eps_pld > composed.eps + slack:
            subject.fail(check, f"the noise the ledger records gives eps = {composed.eps_pld:.4g} at delta = "
                                f"{config.delta:g} (dp-accounting, from noise_std/noise_scale and sensitivity), more "
                                f"than the {composed.eps:.4g} it claims: a mechanism draws less noise than its claim "
                                f"needs")


def _field_of(algo, key):
    """key if it names a message field, else None (a server release)."""
    return key if key in algo.message_spec() else None


# ---- 3. clipping -----------------------------------------------------------------------------------------------
def check_clipping(subject: Subject):
    """Messages stay in their Domains (what honest clients can send: public bounds plus the noise tail) for honest
    inputs and for inputs far beyond the public bounds, and their aggregates in aggregate_bounds; for the mechanisms
    of ldpfed (Gaussian, symmetric Gaussian, Laplace, l2-ball, randomized response), the data encode hands them
    spreads no further than their ledger rows' sensitivity: the noise was calibrated for that spread."""
    skip = subject.local_only("clipping")
    if skip:
        return skip
    check = "clipping"
    config, env, algo = subject.build()
    domains = algo.cached_domains()
    model = _model(algo, config)
    rows = {row.get("message"): row for row in algo.ledger()}
    seen = record_inputs(algo, rows) if algo.privacy_model == "ldp" else {}
    c_r = float(algo.world.reward_bound)
    for batch, users in enumerate(subject.batches(config)):
        contexts, actions, rewards = _client_round(algo, env, model, users, seed=1000 + batch)
        honest, _ = algo.encode(model, contexts, actions, rewards, users, np.random.default_rng([batch, 3]))
        _check_domains(subject, check, algo, domains, honest, users, "an honest message")
        rng = np.random.default_rng([batch, 4])
        hostile_contexts = hostile(contexts, rng)
        hostile_rewards = rng.choice(np.array(HOSTILE_REWARDS) * np.where(np.abs(HOSTILE_REWARDS) < 1e6, c_r, 1.0),
                                     size=np.shape(rewards))
        try:
            messages, _ = algo.encode(model, hostile_contexts, actions, hostile_rewards, users, rng)
        except Exception as error:
            subject.fail(check, f"encode raised {type(error).__name__} ({error}) on contexts scaled by up to 1e12 and "
                                f"rewards up to +-1e12: a client clips (or rounds) its inputs to the public bounds "
                                f"(PublicWorld.reward_bound, context_bound) before privatizing, whatever they are")
        _check_domains(subject, check, algo, domains, messages, users,
                       "with contexts scaled by up to 1e12 and rewards up to +-1e12, the message")
    for key, calls in seen.items():          # any two users, honest or not, of both batches
        _check_spread(subject, check, algo, key, rows[key], calls)


def hostile(values, rng, scales=HOSTILE_SCALES):
    """values (None: none) scaled per leading index by a factor drawn from `scales`, with a random sign."""
    if values is None:
        return None
    x = np.asarray(values, dtype=float)
    factor = rng.choice(scales, size=len(x)) * rng.choice([-1.0, 1.0], size=len(x))
    return x * factor.reshape((-1,) + (1,) * (x.ndim - 1))


def _check_domains(subject, check, algo, domains, messages, users, what):
    for field, value in messages.items():
        why = domains[field].reason(np.asarray(value), users)
        if why is not None:
            subject.fail(check, f"{what} is outside its domain ({domains[field].source}): {why}: the server "
                                f"shards would reject it", field)
    sums = algo.aggregate(messages, users)
    bounds = algo.sum_bounds(users)
    for field, value in sums.items():
        why = bounds[field].reason(np.asarray(value, dtype=float).reshape(-1))
        if why is not None:
            subject.fail(check, f"{what}s' aggregate {field!r} is outside aggregate_bounds: {why}",
                         field if field in domains else None)


def record_inputs(algo, rows=None) -> dict:
    """Make the algorithm's own mechanisms (of ldpfed's kinds, with a ledger row; rows: message -> ledger row,
    default the algorithm's ledger) keep a copy of the data they are asked to privatize; instance attributes, so
    only this algorithm's mechanisms are watched."""
    if rows is None:
        rows = {row["message"]: row for row in algo.ledger()}
    kinds = ("gaussian", "symmetric-gaussian", "laplace", "l2-ball", "randomized-response")
    seen = {}
    if isinstance(algo, CompiledAlgorithm) and algo.compiled_steps() is not None:
        # written once: every field's input is the row prepare wrote (ldpfed.algorithms.compiled)
        watched = [key for key, mech in algo.mechanisms.items() if key in rows
                   and rows[key].get("mechanism") in kinds and key in algo.layout().names]
        seen.update({key: [] for key in watched})

        def client_inputs(*args, _original=algo.client_inputs):
            inputs, counts = _original(*args)
            fields = algo.layout().split(inputs)
            for key in watched:
                seen[key].append(np.array(fields[key], dtype=float, copy=True))
            return inputs, counts

        algo.client_inputs = client_inputs
        return seen
    for key, mech in algo.mechanisms.items():
        if key not in rows or rows[key].get("mechanism") not in kinds or not hasattr(mech, "privatize"):
            continue
        seen[key] = []
        for method in ("privatize", "privatize_counted"):     # (a call of one through the other records twice)
            if hasattr(mech, method):

                def privatize(values, rng, _original=getattr(mech, method), _key=key):
                    seen[_key].append(np.array(values, dtype=float, copy=True))
                    return _original(values, rng)

                setattr(mech, method, privatize)
        if hasattr(mech, "privatize_gram"):        # privatize(x x^T) without building it: the data is x x^T

            def privatize_gram(x, rng, _original=mech.privatize_gram, _key=key):
                x = np.array(x, dtype=float)
                seen[_key].append(x[..., :, None] * x[..., None, :])
                return _original(x, rng)

            mech.privatize_gram = privatize_gram
    return seen


def units(kind: str, data: np.ndarray) -> np.ndarray:
    """The vectors a mechanism's sensitivity is about, one per row: a user's value or one slot's (last axis); for
    symmetric matrix noise the upper triangle incl. the diagonal of each matrix."""
    if kind == "symmetric-gaussian":
        d = data.shape[-1]
        iu = np.triu_indices(d)
        return data.reshape(-1, d, d)[:, iu[0], iu[1]]
    return data.reshape(-1, 1) if data.ndim == 1 else data.reshape(-1, data.shape[-1])


def _max_distance(units: np.ndarray, norm: str) -> float:
    """Largest distance between two rows (l1 or l2)."""
    if len(units) < 2:
        return 0.0
    if norm == "l1":
        return max(float(np.abs(units[i + 1:] - units[i]).sum(axis=1).max()) for i in range(len(units) - 1))
    sq = np.einsum("ij,ij->i", units, units)
    d2 = sq[:, None] + sq[None, :] - 2.0 * (units @ units.T)
    return float(np.sqrt(max(float(d2.max()), 0.0)))


def _check_spread(subject, check, algo, key, row, calls):
    if not calls:
        return
    data = np.concatenate([c.reshape(-1, *c.shape[1:]) for c in calls])
    kind, sensitivity = row["mechanism"], float(row["sensitivity"])
    field = _field_of(algo, key)
    if not np.isfinite(data).all():
        subject.fail(check, f"mechanism {key!r} was handed non-finite data", field)
    if kind == "randomized-response":                      # the input is a bit
        if not set(np.unique(data).tolist()) <= {0.0, 1.0}:
            subject.fail(check, f"randomized response {key!r} was handed values other than bits", field)
    elif kind == "l2-ball":                                # the ledger's bound is the radius of the input ball
        norms = np.linalg.norm(data.reshape(-1, data.shape[-1]), axis=1)
        if norms.max() > sensitivity * (1 + 1e-9):
            subject.fail(check, f"mechanism {key!r} was handed a vector of norm {norms.max():.4g} > its radius "
                                f"{sensitivity:.4g}", field)
    else:                                                  # Gaussian / Laplace: two users' data apart
        spread = _max_distance(units(kind, data), row.get("norm", "l2"))
        if spread > sensitivity * (1 + 1e-9):
            subject.fail(check, f"mechanism {key!r} was handed data of two users {spread:.4g} apart ({row['norm']}) "
                                f"> the sensitivity {sensitivity:.4g} its noise is calibrated for: clip to the public "
                                f"bounds before privatizing", field)


# ---- 4. privacy_audit -------------------------------------------------------------------------------------------
def check_privacy_audit(subject: Subject):
    """Two audits, sharing the confidence AUDIT_ALPHA (Bonferroni):

    * Every mechanism of the algorithm, known only through its protocol (ldpfed.mechanisms.audit.audit_samples):
      on the inputs a user hands it (recorded from encode; for an algorithm written once, the user's row of
      client_inputs) and their worst neighbour under its claim (audit.neighbours), its outputs must not tell the two
      apart beyond its claim: the noise its dp_event declares (a Gaussian event: the GDP bound on mu), else its
      guarantee (the Clopper-Pearson event bound). The samples come from the mechanism's own privatize, or for a
      compiled algorithm from the field's compiled row privatizer, the code the algorithm runs.
    * End to end, encode on neighbouring users whose inputs differ maximally within the public bounds (what the
      noise is calibrated for; check "clipping" covers inputs beyond them): same user index (past any warm-up),
      same arm, same model; rewards +-the reward bound; contexts from the env (x, and another user's x2). Candidate
      pairs: the rewards differ; the contexts differ; both differ. Each message (its private fields, flattened) is
      reduced to one number: the projection on the mean difference of the two users' messages (estimated on pilot
      samples drawn with common random numbers, so additive noise cancels), scaled by the per-coordinate variance.
      On the pilot, the pair and the event "statistic above tau" (or below) with the largest eps lower bound are
      chosen; on fresh samples that event's Clopper-Pearson bound (model-free) must not exceed the ledger's
      composed eps at its composed delta.

    Seeds derive from the run's seed."""
    skip = subject.local_only("privacy_audit")
    if skip:
        return skip
    check = "privacy_audit"
    config, env, algo = subject.build()
    if algo.privacy_model != "ldp":
        if algo.privacy_model == "central":
            return ("skipped: central model: encode sends raw data to the trusted server, the noise is in the "
                    "server's releases (audit those with ldpfed.mechanisms.audit)")
        return "skipped: privacy model 'none': nothing to audit"
    claim = _basic_claim(algo.ledger())
    if claim is None:
        subject.fail(check, "LDP algorithm with an empty ledger")
    if claim.void:
        return f"skipped: the ledger's claim is void ({claim.void})"
    private = [f for f in sorted(algo.message_spec()) if f not in algo.public_fields]
    if not private:
        return "skipped: no private message field"
    model = _model(algo, config)
    user = np.array([config.users - 1], dtype=np.int64)    # past any warm-up: the whole message is sent
    contexts, actions, rewards = _client_round(algo, env, model, user, seed=7)
    mechanisms = _mechanism_samplers(subject, algo, model, contexts, actions, rewards, user)
    alpha = AUDIT_ALPHA / (len(mechanisms) + 1)
    for index, (key, mech, sample, pair) in enumerate(mechanisms):
        result = audit.audit_samples(sample, audit.claim_of(mech.guarantee, mech.dp_event()), alpha=alpha,
                                     seed=(subject.seed, 17, index), pair=pair)
        if result.flagged:
            subject.fail(check, f"mechanism {key!r} ({type(mech).__name__}) tells neighbouring inputs ({pair}) apart "
                                f"beyond its claim with confidence {1 - alpha:.4g}: {result.result}; "
                                f"{result.statistic}, event {result.event}; claim: {result.claim.source}",
                         _field_of(algo, key))
    _audit_encode(subject, check, algo, env, model, user, contexts, actions, rewards, claim, private, alpha)


def _audit_encode(subject, check, algo, env, model, user, contexts, actions, rewards, claim, private, alpha):
    """The end-to-end audit of encode (check_privacy_audit's second part)."""
    other, _, _ = _client_round(algo, env, model, user, seed=8)
    c_r = float(algo.world.reward_bound)
    signs = np.where(np.arange(np.size(rewards)) % 2 == 0, 1.0, -1.0).reshape(np.shape(rewards))
    up, down = c_r * signs, -c_r * signs                     # (two-point feedback: r1 - r2 = +-2 c_r)
    pairs = {"rewards differ": ((contexts, up), (contexts, down))}
    if contexts is not None:
        pairs["contexts differ"] = ((contexts, up), (other, up))
        pairs["both differ"] = ((contexts, up), (other, down))

    def sample(inputs, n, seed):
        return _audit_vectors(algo, model, *inputs, actions, user, private, n, (subject.seed, seed))

    best = None
    for label, (input_a, input_b) in pairs.items():
        pilot_a, pilot_b = sample(input_a, PILOT_N, 101), sample(input_b, PILOT_N, 101)   # common randomness
        shift = (pilot_b - pilot_a).mean(axis=0)
        var = 0.5 * (pilot_a.var(axis=0) + pilot_b.var(axis=0))
        positive = var[var > 0]                          # a coordinate without noise weighs most
        direction = shift / np.maximum(var, 1e-6 * float(positive.min()) if positive.size else 1.0)
        if not np.isfinite(direction).all() or not direction.any():
            continue                                     # the pilot sees no difference in this pair
        centre = 0.5 * (pilot_a.mean(axis=0) + pilot_b.mean(axis=0))
        tau, upper, bound = _choose_event((pilot_a - centre) @ direction, (pilot_b - centre) @ direction,
                                          claim.delta, alpha)
        if best is None or bound > best[0]:
            best = (bound, label, input_a, input_b, centre, direction, tau, upper)
    if best is None:
        return                                           # no pair's messages differ: nothing to tell apart
    _, label, input_a, input_b, centre, direction, tau, upper = best
    stat_a = (sample(input_a, AUDIT_N, 201) - centre) @ direction
    stat_b = (sample(input_b, AUDIT_N, 202) - centre) @ direction
    if upper:            # "stat > tau" is likelier under b
        result = audit.event_audit(stat_b > tau, stat_a > tau, claim.eps, claim.delta, alpha)
    else:                # "stat <= tau" is likelier under a
        result = audit.event_audit(stat_a <= tau, stat_b <= tau, claim.eps, claim.delta, alpha)
    if result.flagged:
        subject.fail(check, f"neighbouring users ({label}) are told apart beyond the ledger's claim: eps >= "
                            f"{result.eps_lower:.3f} with confidence {1 - alpha:.4g} > claimed eps = "
                            f"{claim.eps:.4g} (delta = {claim.delta:.3g}); event: statistic "
                            f"{'>' if upper else '<='} {tau:.4g} on fields {', '.join(private)}, counts "
                            f"{result.counts} of {result.n}", private[0] if len(private) == 1 else None)


def _mechanism_samplers(subject, algo, model, contexts, actions, rewards, user) -> list:
    """(key, mechanism, sample, pair) for every mechanism of the algorithm with a ledger row that this user's encode
    hands data to: sample(which, n, rng) draws its outputs on the user's input (which = 0) or its neighbour (1),
    audit.neighbours. An algorithm written once privatizes its fields in compiled rows: the samples are those rows,
    from the user's row of client_inputs; otherwise the mechanism's privatize, on the input encode handed it."""
    keys = [key for key in algo.mechanisms if key in {row.get("message") for row in algo.ledger()}]
    out = []
    if isinstance(algo, CompiledAlgorithm) and algo.compiled_steps() is not None:
        layout = algo.layout()
        inputs, _ = algo.client_inputs(model, contexts, actions, rewards, user)
        for key in keys:
            if key not in layout.names:
                continue
            part, shape = layout.slices[key], layout.shapes[key]
            x_a, x_b, pair = audit.neighbours(algo.mechanisms[key], inputs[0, part].reshape(shape))
            rows = []
            for x in (x_a, x_b):
                row = inputs[0].copy()
                row[part] = x.reshape(-1)
                rows.append(row)
            out.append((key, algo.mechanisms[key], _row_sampler(layout, key, rows), pair))
        return out
    _, _, probe = subject.build()            # a second instance, whose mechanisms record what they are handed
    seen = {key: [] for key in keys}
    for key in keys:
        mech = probe.mechanisms[key]
        for method in ("privatize", "privatize_counted"):
            if callable(getattr(mech, method, None)):
                def record(values, rng, _original=getattr(mech, method), _key=key):
                    seen[_key].append(np.array(values, copy=True))
                    return _original(values, rng)
                setattr(mech, method, record)
        if callable(getattr(mech, "privatize_gram", None)):      # privatize(x x^T) without building it
            def gram(x, rng, _original=mech.privatize_gram, _key=key):
                x = np.asarray(x, dtype=float)
                seen[_key].append(x[..., :, None] * x[..., None, :])
                return _original(x, rng)
            mech.privatize_gram = gram
    probe.encode(model, contexts, actions, rewards, user, np.random.default_rng([subject.seed, 16]))
    for key in keys:
        if not seen[key]:
            continue                         # this user's encode does not use it
        mech, first = algo.mechanisms[key], np.asarray(seen[key][0])
        x_a, x_b, pair = audit.neighbours(mech, first[0] if first.ndim else first)
        out.append((key, mech, audit.batch_sampler(mech.privatize, x_a, x_b), pair))
    return out


def _row_sampler(layout, key, rows):
    """sample(which, n, rng): the compiled rows' privatizer on n copies of rows[which], the field `key`'s part. Only
    that field's random numbers are drawn (the other fields' outputs are not read: their draws stay zero)."""
    from ldpfed.mechanisms.rows import DRAW_OFFSET

    part, mech, shape = layout.slices[key], layout.mechanisms[key], layout.shapes[key]
    first = int(layout.layout[layout.names.index(key), DRAW_OFFSET])
    draws = slice(first, first + layout.kernels[key].draws)
    chunk = max(1, min(8192, audit.CHUNK_VALUES // max(1, layout.width + layout.draw_width)))

    def sample(which, n, rng):
        inputs = np.repeat(rows[which][None], min(chunk, n), axis=0)      # not overwritten: reused
        z = np.zeros((len(inputs), layout.draw_width))
        for start in range(0, n, chunk):
            k = min(chunk, n - start)
            if hasattr(mech, "fill_rows"):
                mech.fill_rows(rng, z[:k, draws])
            else:
                z[:k, draws] = mech.draw_rows(rng, k, shape)
            yield layout.privatize(inputs[:k], z[:k])[:, part]

    return sample


def _basic_claim(rows):
    """The ledger's claim by basic composition (what check_budget holds against the budget), without
    dp-accounting's PLD, which the audit does not need; None for an empty ledger."""
    rows = list(rows or [])
    if not rows:
        return None
    void = "; ".join(sorted({str(row["claim_void"]) for row in rows if row.get("claim_void")})) or None
    per_user = [int(row.get("per_user", 1)) for row in rows]
    eps = sum(k * float(row["eps"]) for k, row in zip(per_user, rows))
    delta = sum(k * float(row["delta"]) for k, row in zip(per_user, rows))
    return types.SimpleNamespace(eps=eps, delta=delta, void=void)


def _audit_vectors(algo, model, contexts, rewards, actions, user, fields, n, seed) -> np.ndarray:
    """n encodes of one user's input (each with its own randomness): the private fields, flattened, (n, m)."""
    def copies(value, m):
        return None if value is None else np.repeat(np.asarray(value), m, axis=0)

    rng = np.random.default_rng([*np.atleast_1d(seed).tolist(), 5])
    out = []
    for start in range(0, n, AUDIT_CHUNK):
        m = min(AUDIT_CHUNK, n - start)
        messages, _ = algo.encode(model, copies(contexts, m), copies(actions, m), copies(rewards, m),
                                  np.repeat(user, m), rng)
        out.append(np.concatenate([np.asarray(messages[f], dtype=float).reshape(m, -1) for f in fields], axis=1))
    return np.concatenate(out)


def _choose_event(stat_a: np.ndarray, stat_b: np.ndarray, delta: float, alpha: float = AUDIT_ALPHA):
    """(tau, upper, bound): the threshold event with the largest eps lower bound on the pilot samples; upper: the
    event is "stat > tau" (likelier under b), else "stat <= tau" (likelier under a)."""
    pooled = np.concatenate([stat_a, stat_b])
    values = np.unique(pooled)
    if len(values) <= 256:                        # discrete statistics (bits): between consecutive values
        taus = 0.5 * (values[1:] + values[:-1]) if len(values) > 1 else values
    else:
        q = np.concatenate([[0.0005, 0.001, 0.002, 0.005], np.linspace(0.01, 0.99, 99), [0.995, 0.998, 0.999,
                                                                                        0.9995]])
        taus = np.unique(np.quantile(pooled, q))
    a_sorted, b_sorted = np.sort(stat_a), np.sort(stat_b)
    n_a, n_b = len(stat_a), len(stat_b)
    best = (float(np.median(pooled)), True, -1.0)
    for tau in taus:
        above_a = n_a - np.searchsorted(a_sorted, tau, side="right")
        above_b = n_b - np.searchsorted(b_sorted, tau, side="right")
        for upper, (k_b, nb, k_a, na) in ((True, (above_b, n_b, above_a, n_a)),
                                          (False, (n_a - above_a, n_a, n_b - above_b, n_b))):
            bound = audit.eps_lower_bound(k_b, nb, k_a, na, delta, alpha)
            if bound > best[2]:
                best = (float(tau), upper, bound)
    return best


# ---- 5. no_truth -----------------------------------------------------------------------------------------------
def check_no_truth(subject: Subject):
    """Nothing reachable from the algorithm (attributes, containers, mechanisms, closures, bound methods), from the
    model it publishes or from its server state after a round is the env or one of the env's arrays (the env holds
    the ground truth: theta*, change points, support, the data set); `world` is a PublicWorld."""
    check = "no_truth"
    config, env, algo = subject.build()
    if not isinstance(algo.world, PublicWorld):
        subject.fail(check, f"algo.world is a {type(algo.world).__name__}, not the env's PublicWorld")
    truths = env_arrays(env)
    state = algo.initial_state(derive(config.seed, "init"))
    roots = [("the algorithm", algo), ("its initial state", state)]
    model = algo.publish(state)
    users = subject.batches(config)[0]
    sums, _, _ = simulate_population(algo, env, model, config.seed, 0, 0, users)
    state = algo.update(state, sums or {}, int(users[0]), int(users[-1]) + 1, derive(config.seed, "server", 0))
    roots += [("its published model", model), ("its state after a round", state), ("the algorithm after a round",
                                                                                       algo)]
    for label, root in roots:
        for obj in reachable(root):
            if isinstance(obj, Env):
                subject.fail(check, f"{label} can reach the env ({type(obj).__name__}), which holds the ground "
                                    f"truth: an algorithm sees only env.public()")
            name = truth_match(obj, truths)
            if name is not None:
                subject.fail(check, f"{label} can reach the env's {name!r} ({type(obj).__name__}): ground truth")


def env_arrays(env) -> list[tuple[str, object]]:
    """Every array (size > 1) and non-empty dict the env holds besides its options: its ground truth, whatever the
    env calls it."""
    found = []
    for name, value in vars(env).items():
        if name == "params":
            continue
        if isinstance(value, np.ndarray) and value.size > 1:
            found.append((name, value))
        elif isinstance(value, dict) and value:
            found.append((name, value))
    return found


def truth_match(obj, truths):
    for name, truth in truths:
        if obj is truth:
            return name
        if isinstance(obj, np.ndarray) and isinstance(truth, np.ndarray) and obj.size > 1:
            if np.shares_memory(obj, truth):
                return name
            if obj.shape == truth.shape and obj.dtype.kind in "biuf" and np.array_equal(obj, truth):
                return name
    return None


def reachable(root):
    """Every object reachable from root through attributes, containers, closures and bound methods (the walk of
    tests/test_public_world.py)."""
    seen, stack, out = set(), [root], []
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (type, types.ModuleType, str, bytes, int, float, bool, type(None))):
            continue
        seen.add(id(obj))
        out.append(obj)
        if isinstance(obj, (dict, types.MappingProxyType)):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        elif isinstance(obj, np.ndarray):
            if obj.dtype == object:
                stack.extend(obj.ravel().tolist())
            if obj.base is not None:
                stack.append(obj.base)
            continue
        if isinstance(obj, types.MethodType):
            stack.append(obj.__self__)
            stack.append(obj.__func__)
        if isinstance(obj, types.FunctionType):
            stack.extend(cell.cell_contents for cell in (obj.__closure__ or ()) if _has_contents(cell))
            stack.extend(obj.__defaults__ or ())
            continue
        if isinstance(obj, np.random.Generator):
            continue
        if hasattr(obj, "__dict__"):
            stack.append(vars(obj))
        for slot in getattr(type(obj), "__slots__", ()):
            if isinstance(slot, str) and hasattr(obj, slot):
                stack.append(getattr(obj, slot))
    return out


def _has_contents(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


# ---- 6. public_fields ------------------------------------------------------------------------------------------
def check_public_fields(subject: Subject):
    """Public fields carry no user data: the same users with the same randomness (act and encode draw from one
    client generator, as in a population) but other contexts and rewards (another draw of the env's) send the
    same public fields, bit for bit. Checked for private algorithms ("ldp", "central"); without privacy every
    field may carry data."""
    skip = subject.local_only("public_fields")
    if skip:
        return skip
    check = "public_fields"
    config, env, algo = subject.build()
    public = sorted(algo.public_fields)
    if algo.privacy_model == "none":
        return "skipped: privacy model 'none': no field is private, so public_fields may carry data"
    if not public:
        return "skipped: no public fields"
    model = _model(algo, config)
    for batch, users in enumerate(subject.batches(config)):
        sent = []
        for variant in range(2):
            nature = np.random.default_rng([batch, variant, 11])  # other contexts and rewards (the env's)
            client = np.random.default_rng([batch, 12])          # the same randomness for both variants
            contexts = env.contexts(users, nature)
            actions = algo.act(model, contexts, users, client)
            rewards, _ = env.step(contexts, actions, users, nature)
            messages, _ = algo.encode(model, contexts, actions, rewards, users, client)
            sent.append(messages)
        for field in public:
            first, second = np.asarray(sent[0][field]), np.asarray(sent[1][field])
            if first.shape != second.shape or not np.array_equal(first, second):
                changed = int(np.count_nonzero(np.any((first != second).reshape(len(users), -1), axis=1))) \
                    if first.shape == second.shape else len(users)
                subject.fail(check, f"public field differs for {changed} of {len(users)} users (users {users[0]}..) "
                                    f"when only their contexts and rewards change: it depends on their data",
                             field)
        if algo.privacy_model == "ldp":     # what a shuffled server tells apart: the declared randomizer groups
            _check_groups(subject, check, algo, batch, users, sent[0])


def _check_groups(subject, check, algo, batch, users, messages):
    """Users that `randomizer_groups` declares alike send the same public fields (bar `public_draws`): else a
    shuffled server could tell them apart, and the shuffle model's amplification would be claimed for nobody.
    Groups left undeclared claim nothing (the shuffle model refuses such an algorithm), so they pass here."""
    try:
        check_groups(algo, batch, users, messages)
    except NotImplementedError:
        return
    except GroupsBroken as error:
        field = re.search(r"public field '([^']+)'", str(error))
        subject.fail(check, f"randomizer_groups joins users a server tells apart: {error}",
                     field.group(1) if field else None)


# ---- 7. engines ------------------------------------------------------------------------------------------------
def check_engines(subject: Subject):
    """The same config (2 populations) gives the same per-round table bit for bit on every engine path: the local
    engine twice (determinism), the compiled sequential loop at round size 1 against the local engine (an algorithm
    written once, ldpfed.algorithms.compiled, on an env with a compiled step), and the Ray engine pre-aggregated
    with 1 shard and per-user with 2 shards (2 actors) when ray=True and the Ray workers can build the algorithm."""
    from ldpfed.engine import run
    from ldpfed.engine.sequential import run_sequential, sequential_unsupported

    check = "engines"
    config = subject.config(populations=min(2, subject.round_size))
    reference = run(config, "local", fast=False)
    _same(subject, check, reference, run(config, "local", fast=False), "a second local run")
    sequential = subject.config().replace(round_size=1)
    algo = subject.build()[2]
    written_once = isinstance(algo, CompiledAlgorithm) and algo.compiled_steps() is not None
    if written_once and sequential_unsupported(sequential) is None:
        # fed the local engine's own random draws, the sequential loop runs the same functions on the same numbers
        _same(subject, check, run(sequential, "local", fast=False), run_sequential(sequential, streams="generic"),
              "the sequential engine (round size 1)")
    if not subject.ray:
        return ("skipped: ray=False: the Ray engine was not compared (the local engine was: two runs "
                "bit-identical)")
    why = _ray_unavailable(subject.cls.name)
    if why is not None:
        return f"skipped: {why} (the local engine was: two runs bit-identical)"
    import ray

    from ldpfed.engine.ray_engine import IDLE_ACTORS, ensure_ray

    started = ensure_ray(log_to_driver=False, logging_level="ERROR")
    try:
        for actors, shards, mode in ((2, 1, "pre-aggregated"), (2, 2, "per-user")):
            # no placement group: the second shape reuses the first's processes (a check of results, not of CPUs)
            result = run(config, "ray", actors=actors, shards=shards, mode=mode, placement="none")
            label = f"the Ray engine ({actors} actors, {shards} shards, {mode})"
            _same(subject, check, reference, result, label)
            if result.summary.get("rejected_messages"):
                subject.fail(check, f"{label}: the shards rejected {result.summary['rejected_messages']} honest "
                                    f"messages")
    finally:
        if started:
            IDLE_ACTORS.clear()
            ray.shutdown()


def _ray_unavailable(name: str) -> str | None:
    """Why Ray workers could not build `name` (they load the registry themselves), or None."""
    if REGISTRY.source(name) == "register()" and not any(
            _names_class(reference, REGISTRY[name]) for reference in environment_references()):
        return RAY_SKIP
    return None


def _names_class(reference: str, cls) -> bool:
    """Does the LDPFED_PLUGINS reference name cls (or a list holding it)? False if it cannot be loaded."""
    try:
        obj = load_reference(reference)
    except PluginError:
        return False
    return obj is cls or (isinstance(obj, (list, tuple)) and cls in obj)


def _same(subject, check, want, got, label):
    import pandas as pd

    try:
        pd.testing.assert_frame_equal(want.table, got.table, check_exact=True)
    except AssertionError as error:
        subject.fail(check, f"{label} differs from the local engine's per-round table: {error}")
    if want.summary["final_regret"] != got.summary["final_regret"]:
        subject.fail(check, f"{label}: final regret {got.summary['final_regret']!r} != "
                            f"{want.summary['final_regret']!r}")
    if [row.get("users_sending") for row in want.ledger] != [row.get("users_sending") for row in got.ledger]:
        subject.fail(check, f"{label}: the ledger's users_sending differ")


CHECK_FUNCTIONS = {
    "contract": check_contract,
    "ledger": check_ledger,
    "clipping": check_clipping,
    "privacy_audit": check_privacy_audit,
    "no_truth": check_no_truth,
    "public_fields": check_public_fields,
    "engines": check_engines,
}

__all__ = ["CHECKS", "ConformanceError", "check_algorithm"] + [f"check_{name}" for name in CHECKS]


# ---- the env kit -----------------------------------------------------------------------------------------------
# What an env plugin's own tests call on their env (tests/test_env_conformance.py runs it on every built-in env):
#
#     from ldpfed.testing import ENV_CHECKS, check_env
#
#     def test_my_env_conforms():
#         assert set(check_env(MyEnv, env_params={"d": 3})) == set(ENV_CHECKS)    # raises EnvConformanceError
#
# 1. "options"  every option has a doc and refuses, with a ConfigError naming env_params.<option>, the values its
#               Option does not accept (NaN, inf, a string or a bool for a number, 1.5 for an int, values past
#               its bounds, a choice not listed); an unknown option is refused naming it, a misspelt one with a
#               did-you-mean. An option of kind "any" (plain `defaults`) cannot refuse anything: declare it.
# 2. "public"   env.public() is a frozen PublicWorld of scalars that agrees with the env (name, d, K, multi,
#               horizon, a finite reward bound > 0) and holds no ground-truth value; the truth depends on the seed
#               only (two builds, the same arrays).
# 3. "kind"     for each kind besides its own name (Env.kinds): the env of that name exists, and this env keeps its
#               contract at the same options: multi, link, arms or not, contexts or not and their rank, and every
#               PublicWorld field the reference defines (the algorithms of that kind read them).
# 4. "step"     the batched step (what the round engines run) and the compiled step (EnvSteps, what the sequential
#               engine runs), on the same contexts and noise, give the same rewards and regrets, bit for bit;
#               context_stream gives the same contexts as contexts(), and leaves the generator where it does.
# 5. "regret"   pseudo-regret is finite and >= 0 for every user and action; with arms, the best of each user's
#               arms has regret 0, and regret matches the rewards: with common random numbers, reward + regret has
#               the same mean (the best arm's mean) whatever arm is pulled (a z-test at ENV_Z standard errors).
# 6. "varied"   for an env that says how its world varies (Env.varies; skipped otherwise): varied(0, rng) is the env
#               itself; varied(0.5, rng) keeps the public world, moves some truth on a copy (the run's world is
#               untouched), is a function of the Generator's state, and steps from its own truth with regret >= 0.
ENV_CHECKS = ("options", "public", "kind", "step", "regret", "varied")
ENV_Z = 5.0                   # regret: an honest env fails with probability ~6e-7 (two-sided normal tail)
ENV_TOLERANCE = 1e-9          # regret: rounding of best - chosen
ENV_MAX_ARMS = 64             # regret: arms stepped per user (every arm up to this many)


class EnvConformanceError(ConformanceError):
    """An env that breaks the contract, found by running it: names the check, the env and, where there is one,
    the option (`check`, `env`, `field`)."""

    def __init__(self, check: str, env: str, message: str, field: str | None = None):
        self.check, self.env, self.field, self.reason = check, env, field, message
        self.algorithm = None
        where = f", option {field!r}" if field else ""
        AssertionError.__init__(self, f"env conformance check {check!r} failed for env {env!r}{where}: {message}")

    def __reduce__(self):
        return type(self), (self.check, self.env, self.reason, self.field)


def check_env(cls_or_name, *, env_params=None, users=400, seed=0, samples=1000, checks=None) -> dict:
    """Run the env conformance checks (ENV_CHECKS, above) on an env (an Env subclass, or a registered name) with
    these options (checked as `--env-param` checks them) and horizon; returns {check: "passed" | "skipped: why"}
    in ENV_CHECKS order, raises EnvConformanceError at the first failure. No algorithm is involved: an env that no
    algorithm runs on yet is checked too. A class not in the registry is registered for the duration of the call.
    samples: users stepped by "regret" (every arm each). Keep sizes small: the checks build the env a few times."""
    names = list(ENV_CHECKS) if checks is None else ([checks] if isinstance(checks, str) else list(checks))
    unknown = [name for name in names if name not in ENV_CHECKS]
    if unknown:
        raise ConfigError("checks", unknown, f"unknown checks; choose from {list(ENV_CHECKS)}")
    cls, added = _resolve_env(cls_or_name)
    try:
        subject = EnvSubject(cls, dict(env_params or {}), users, seed, samples)
        report = {}
        for name in (n for n in ENV_CHECKS if n in names):
            try:
                outcome = ENV_CHECK_FUNCTIONS[name](subject)
            except ConformanceError:
                raise
            except Exception as error:
                frame = traceback.extract_tb(error.__traceback__)[-1]
                where = f"{frame.filename}:{frame.lineno}, in {frame.name}"
                raise EnvConformanceError(name, cls.name, f"raised {type(error).__name__}: {error} (at {where})") \
                    from error
            report[name] = "passed" if outcome is None else outcome
        return report
    finally:
        if added:
            from ldpfed.envs import ENVS

            ENVS.unregister(cls.name)


def _resolve_env(cls_or_name):
    """(class, whether this call registered it)."""
    from ldpfed.envs import ENVS

    return _resolve_in(ENVS, Env, cls_or_name, lambda name, error: EnvConformanceError("options", name, str(error)))


class EnvSubject:
    """The env under test: its class, options, horizon and seed; every check builds its own instance."""

    def __init__(self, cls, env_params, users, seed, samples):
        self.cls, self.name, self.env_params, self.users, self.seed = cls, cls.name, env_params, users, seed
        self.samples = samples
        cls.checked_params(env_params, users=users)     # a bad setting is a usage error (ConfigError), not a finding

    def build(self, seed=None, name=None):
        from ldpfed.envs import build_env

        return build_env(name or self.name, self.users, self.seed if seed is None else seed, self.env_params)

    def spread(self, n: int) -> np.ndarray:
        """n users (global indices) spread over the horizon, sorted (repeats when n exceeds it)."""
        return np.linspace(0, self.users - 1, n).round().astype(np.int64)

    def actions(self, env, world, n: int, rng) -> np.ndarray:
        """Valid actions for n users: arms uniformly, or points well inside the public domain (continuous)."""
        if env.K > 0:
            return rng.integers(env.K, size=n).astype(np.int64)
        radius = 0.5 * (world.radius if world.radius is not None else 1.0)
        points = rng.standard_normal((n, env.d))
        points /= np.maximum(np.linalg.norm(points, axis=1, keepdims=True), 1e-300)
        return points * radius * rng.random((n, 1))

    def fail(self, check, message, field=None):
        raise EnvConformanceError(check, self.name, message, field)


_BAD_NUMBERS = (float("nan"), float("inf"), float("-inf"), "inf", "1", True, None, [1.0])


def _bad_values(option) -> list:
    """Values the Option must refuse (given its kind and bounds), except the ones it lists as allowed."""
    kind = option.kind
    if kind == "any":
        return []
    if kind == "bool":
        bad = [1, 0, "true", None, float("nan")]
    elif kind == "choice":
        bad = ["no-such-choice", 1, None, float("nan")]
    else:
        bad = [v for v in _BAD_NUMBERS if not (option.allow_inf and v == float("inf") and not isinstance(v, str))]
        if kind == "int":
            bad += [1.5, -2.5]              # (a whole float, 2.0 or 1e3, is its integer: ldpfed.util.errors.integer)
        step = 1 if kind == "int" else 1e-6
        if option.low is not None and math.isfinite(option.low):
            bad.append(option.low if option.low_open else option.low - step)
        if option.high is not None and math.isfinite(option.high):
            bad.append(option.high if option.high_open else option.high + step)
    return [v for v in bad if not any(_same_value(v, a) for a in option.allow)]


def _same_value(a, b) -> bool:
    return a is b or (type(a) is type(b) and a == b)


def check_env_options(subject: EnvSubject):
    check = "options"
    cls = subject.cls
    field = None
    for name, option in cls.options.items():
        if option.kind == "any" and not option.doc:
            subject.fail(check, "declared as a plain default: it accepts anything and `describe` cannot say what it "
                                "is; declare it with ldpfed.util.options.Option (kind, bounds, doc)", name)
        if not option.doc:
            subject.fail(check, "has no doc (python -m ldpfed describe shows it to users)", name)
        for bad in _bad_values(option):
            try:
                cls.checked_params({**subject.env_params, name: bad}, users=subject.users)
            except ConfigError as error:
                field = error.field
                if field != f"env_params.{name}":
                    subject.fail(check, f"{bad!r} was refused, but the error names {field!r}", name)
                continue
            subject.fail(check, f"accepted {bad!r}, which its Option ({option.accepts()}) refuses", name)
    try:
        cls.checked_params({"no_such_option": 1}, users=subject.users)
        subject.fail(check, "an unknown option (no_such_option) was accepted")
    except ConfigError as error:
        if error.field != "env_params.no_such_option":
            subject.fail(check, f"an unknown option was refused, but the error names {error.field!r}")
    longest = max(cls.options, key=len, default="")
    if len(longest) >= 4:
        typo = longest[:-2] + longest[-1] + longest[-2]
        try:
            cls.checked_params({typo: cls.defaults[longest]}, users=subject.users)
        except ConfigError as error:
            if "did you mean" not in error.reason:
                subject.fail(check, f"a misspelt option ({typo}) was refused without a did-you-mean: "
                                    f"{error.reason}")
        else:
            subject.fail(check, f"a misspelt option ({typo}) was accepted")


def check_env_public(subject: EnvSubject):
    import dataclasses

    check = "public"
    env = subject.build()
    world = env.public()
    if not isinstance(world, PublicWorld):
        subject.fail(check, f"public() returned a {type(world).__name__}, not a PublicWorld")
    values = {f.name: getattr(world, f.name) for f in dataclasses.fields(world)}
    loose = {k: v for k, v in values.items() if not (v is None or isinstance(v, (str, int, float, bool)))}
    if loose:
        subject.fail(check, f"public fields must be scalars (a truth could hide in anything else): {loose}")
    expected = {"name": subject.name, "d": int(env.d), "K": int(env.K), "multi": bool(env.multi),
                "horizon": subject.users}
    for key, want in expected.items():
        if values[key] != want:
            subject.fail(check, f"PublicWorld.{key} is {values[key]!r}, the env's is {want!r}")
    if not (math.isfinite(world.reward_bound) and world.reward_bound > 0):
        subject.fail(check, f"PublicWorld.reward_bound {world.reward_bound!r} must be finite and > 0")
    truths = env_arrays(env)
    secret = set()
    for _, truth in truths:
        if isinstance(truth, np.ndarray) and truth.dtype.kind == "f":
            secret.update(float(v) for v in truth.ravel() if v != 0)
    leaked = [k for k, v in values.items() if isinstance(v, float) and v in secret]
    if leaked:
        subject.fail(check, f"PublicWorld field(s) {leaked} hold a ground-truth value")
    again = env_arrays(subject.build())
    if [name for name, _ in truths] != [name for name, _ in again] or not all(
            _equal(a, b) for (_, a), (_, b) in zip(truths, again)):
        subject.fail(check, "two builds with the same seed differ: the ground truth must depend on the seed only "
                            "(draw it from the rng the env is given)")


def _equal(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
    try:
        return bool(a == b)
    except Exception:
        return False


def check_env_kind(subject: EnvSubject):
    import dataclasses

    from ldpfed.envs import ENVS

    check = "kind"
    others = subject.cls.kinds_of()[1:]
    if not others:
        return "skipped: of its own kind only (Env.kinds is empty): algorithms that list its name run on it"
    env = subject.build()
    world = env.public()
    rng = np.random.default_rng([subject.seed, 3])
    users = subject.spread(4)
    contexts = env.contexts(users, rng)
    for kind in others:
        if kind not in ENVS:
            subject.fail(check, f"kind {kind!r} is not a registered env (a kind is the name of the env whose "
                                f"contract this one keeps); registered: {sorted(ENVS)}")
        from ldpfed.envs import build_env

        shared = {k: v for k, v in subject.env_params.items() if k in ENVS[kind].defaults}   # e.g. d, K
        reference = build_env(kind, subject.users, subject.seed, shared)
        ref_world = reference.public()
        ref_contexts = reference.contexts(users, np.random.default_rng([subject.seed, 3]))
        differences = []
        for what, mine, theirs in (("multi", bool(env.multi), bool(reference.multi)),
                                   ("link", env.link, reference.link),
                                   ("arms (K > 0)", env.K > 0, reference.K > 0),
                                   ("contexts (d > 0)", env.d > 0, reference.d > 0),
                                   ("contexts() is None", contexts is None, ref_contexts is None),
                                   ("contexts' rank", np.ndim(contexts), np.ndim(ref_contexts))):
            if mine != theirs:
                differences.append(f"{what}: {mine!r} here, {theirs!r} for {kind}")
        defined = {f.name for f in dataclasses.fields(world) if getattr(world, f.name) is not None}
        needed = {f.name for f in dataclasses.fields(ref_world) if getattr(ref_world, f.name) is not None}
        if needed - defined:
            differences.append(f"PublicWorld fields {sorted(needed - defined)} are None here; {kind} defines them "
                               f"(algorithms of its kind read them)")
        if differences:
            subject.fail(check, f"declares kind {kind!r} but breaks its contract: " + "; ".join(differences))


def check_env_step(subject: EnvSubject):
    check = "step"
    env = subject.build()
    steps = env.compiled()
    n = min(subject.samples, 256)
    users = subject.spread(n)
    actions = subject.actions(env, env.public(), n, np.random.default_rng([subject.seed, 5]))
    nature = np.random.default_rng([subject.seed, 6])
    contexts = env.contexts(users, nature)
    rewards, regret = env.step(contexts, actions, users, nature)
    after_batched = nature.bit_generator.state
    if np.shape(rewards) != (n,) or np.shape(regret) != (n,):
        subject.fail(check, f"step returned shapes {np.shape(rewards)} and {np.shape(regret)}, not ({n},) each")
    if steps is None:
        return ("skipped: no compiled step (env.compiled() is None): its batched step runs on every round engine, "
                "the compiled sequential loop cannot run it")
    nature = np.random.default_rng([subject.seed, 6])
    again = env.contexts(users, nature)
    if not _equal(np.asarray(env.context_rows(again, n)), np.asarray(env.context_rows(contexts, n))):
        subject.fail(check, "contexts() of the same users from the same generator state differ")
    noise = env.draw_noise(n, nature)
    rows = env.context_rows(again, n)
    for i in range(n):
        reward, gap = steps.step(steps.truth, rows, i, users[i], actions, noise)
        if reward != rewards[i] or gap != regret[i]:
            subject.fail(check, f"user {users[i]}: the batched step gives (reward, regret) = ({rewards[i]!r}, "
                                f"{regret[i]!r}), the compiled step ({reward!r}, {gap!r})")
    if nature.bit_generator.state != after_batched:
        subject.fail(check, "the batched step and draw_noise leave the generator in different states (the engines "
                            "draw what follows from it)")
    nature = np.random.default_rng([subject.seed, 6])
    stream = env.context_stream(users, nature)
    half = n // 2
    streamed = [np.array(stream(0, half)), np.array(stream(half, n))]
    if not _equal(np.concatenate(streamed), np.asarray(rows)):
        subject.fail(check, "context_stream's rows differ from contexts()' (the sequential engine reads the stream)")
    if not _equal(env.draw_noise(n, nature), noise):
        subject.fail(check, "after context_stream, draw_noise draws other numbers than after contexts()")


def check_env_regret(subject: EnvSubject):
    check = "regret"
    env = subject.build()
    n = subject.samples
    users = subject.spread(n)
    if env.K == 0:
        actions = subject.actions(env, env.public(), n, np.random.default_rng([subject.seed, 8]))
        nature = np.random.default_rng([subject.seed, 9])
        _, regret = env.step(env.contexts(users, nature), actions, users, nature)
        _nonnegative(subject, check, regret, "a point")
        return None
    arms = range(min(env.K, ENV_MAX_ARMS))
    rewards, regrets = np.empty((n, len(arms))), np.empty((n, len(arms)))
    for a in arms:              # the same contexts and noise for every arm: common random numbers
        nature = np.random.default_rng([subject.seed, 9])
        contexts = env.contexts(users, nature)
        rewards[:, a], regrets[:, a] = env.step(contexts, np.full(n, a, dtype=np.int64), users, nature)
    _nonnegative(subject, check, regrets, "an arm")
    scale = max(1.0, float(np.abs(rewards).max()))
    if env.K <= ENV_MAX_ARMS:
        worst = float(regrets.min(axis=1).max())
        if worst > ENV_TOLERANCE * scale:
            subject.fail(check, f"a user's best arm has regret {worst!r}: pseudo-regret is the gap to the user's best "
                                f"arm, 0 for that arm")
    best = regrets.argmin(axis=1)
    total = rewards + regrets                     # each arm: mean reward + gap = the best arm's mean
    diff = total.mean(axis=1) - total[np.arange(n), best]
    mean, sd = float(diff.mean()), float(diff.std(ddof=1)) if n > 1 else 0.0
    if abs(mean) > ENV_Z * sd / math.sqrt(n) + ENV_TOLERANCE * scale:
        subject.fail(check, f"regret does not match the rewards: reward + regret averages {mean:+.4g} more over all "
                            f"arms than on the best arm ({ENV_Z} standard errors: {ENV_Z * sd / math.sqrt(n):.3g}); "
                            f"regret must be the best arm's mean reward minus the pulled arm's")


def _nonnegative(subject, check, regret, what):
    regret = np.asarray(regret, dtype=float)
    if not np.all(np.isfinite(regret)):
        subject.fail(check, f"pseudo-regret is not finite for {what}")
    if regret.min() < -ENV_TOLERANCE * max(1.0, float(np.abs(regret).max())):
        subject.fail(check, f"pseudo-regret {regret.min()!r} < 0 for {what}: it is the gap to the best action")


def check_env_varied(subject: EnvSubject):
    """A population's world (the heterogeneous federation model): spread 0 is the env itself; a spread > 0 keeps
    the public world, moves some truth, is a function of its Generator (the same state: the same world; another:
    another world) and leaves the run's world alone; its steps give non-negative regret, from its own truth (on the
    same contexts, actions and noise, not the run's world's)."""
    check = "varied"
    env = subject.build()
    if env.varied(0.0, np.random.default_rng(0)) is not env:
        subject.fail(check, "varied(0, rng) must be the env itself (the same world, no draw)")
    if not env.varies:
        return "skipped: the env does not say how its world varies (no `varies`)"
    env.compiled()      # a step the env caches must not serve a varied copy
    before = {name: np.copy(value) if isinstance(value, np.ndarray) else value for name, value in env_arrays(env)}
    world = env.varied(0.5, np.random.default_rng(1))
    if world.public() != env.public():
        subject.fail(check, f"a varied world's public world differs: {world.public()} != {env.public()}")
    after = dict(env_arrays(env))
    if before.keys() != after.keys() or not all(_equal(before[name], after[name]) for name in before):
        subject.fail(check, "varied changed the run's own world (it must change a copy)")
    truth = dict(env_arrays(world))

    def moved(a, b):
        return a.keys() != b.keys() or not all(_equal(a[name], b[name]) for name in a)

    if not moved(before, truth):
        subject.fail(check, f"varied(0.5, rng) moved none of the world's arrays ({sorted(truth)})")
    if moved(truth, dict(env_arrays(env.varied(0.5, np.random.default_rng(1))))):
        subject.fail(check, "two varied worlds from the same Generator state differ")
    if not moved(truth, dict(env_arrays(env.varied(0.5, np.random.default_rng(2))))):
        subject.fail(check, "varied worlds from two Generator states are the same (it draws nothing from rng)")
    users = subject.spread(min(subject.samples, 200))
    nature = np.random.default_rng(subject.seed)
    contexts = world.contexts(users, nature)
    actions = subject.actions(world, world.public(), len(users), nature)
    state = nature.bit_generator.state
    rewards, regret = world.step(contexts, actions, users, nature)
    if not (np.isfinite(regret).all() and (regret >= -ENV_TOLERANCE).all()):
        subject.fail(check, "a varied world's step gives negative or non-finite regret")
    nature.bit_generator.state = state
    runs_rewards, runs_regret = env.step(contexts, actions, users, nature)
    if np.array_equal(rewards, runs_rewards) and np.array_equal(regret, runs_regret):
        subject.fail(check, "a varied world steps as the run's world does (does its step read a cached truth?)")


ENV_CHECK_FUNCTIONS = {
    "options": check_env_options,
    "public": check_env_public,
    "kind": check_env_kind,
    "step": check_env_step,
    "regret": check_env_regret,
    "varied": check_env_varied,
}

__all__ += ["ENV_CHECKS", "EnvConformanceError", "check_env"]

"""What every simulated world offers the engine.

An env holds the ground truth (drawn once from the run's "env" generator). Per round, a population asks it
for its users' contexts, lets the algorithm's client half act, then asks for rewards and pseudo-regret.
Regret is a simulation metric: it never travels to the server.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numba import njit

from ldpfed.util.errors import ConfigError, integer
from ldpfed.util.jit import loops
from ldpfed.util.options import Option, declare_options, option_rows, refuse_unknown


@dataclass(frozen=True)
class PublicWorld:
    """Everything an algorithm may know about its world: what the papers assume public, and no ground truth.

    Built by `Env.public()`; `make_algorithm` hands an algorithm this, never the env (which holds theta*,
    the change points, the support, x*, ...). Scalars only, frozen: an algorithm cannot reach or alter the truth.
    Fields that a world does not define are None.
    """
    name: str                   # the env's name
    d: int                      # context (or action) dimension; 0 for context-free worlds
    K: int                      # number of arms; 0 for continuous actions
    multi: bool                 # one parameter per arm (contexts (n, d)) instead of (n, K, d)
    horizon: int                # T, the number of users (every paper assumes T known or uses a doubling trick)
    reward_bound: float         # |r| <= reward_bound: clients clip to it before privatizing
    link: str | None = None     # GLM link ("identity", "logistic", "poisson")
    context_bound: float | None = None    # ||x|| <= context_bound (sparse-linear: every coordinate |x_i| <= it)
    context_min_eig: float | None = None  # smallest eigenvalue of E[x x^T] (seed 001's lambda_0, seed 003's phi^2)
    # Seed 003 assumes s0 known ("assuming the knowledge of s0 ... needed for calibrating noise", Section 1).
    sparsity: int | None = None
    # Seed 004's L_T, the number of stationary segments, enters its window w = sqrt(4 e T / (L_T + 4))
    # (Theorem 1); the change times themselves are unknown to the learner.
    segments: int | None = None
    # Seed 002's BCO on a ball: domain radius R, inner radius r, loss bound B (= reward_bound), Lipschitz
    # constant G and strong-convexity modulus mu, all assumed known by its Theorems 5-6.
    radius: float | None = None
    inner_radius: float | None = None
    lipschitz: float | None = None
    strong_convexity: float | None = None


class EnvSteps(NamedTuple):
    """An env's step for one user, compiled (numba): what its batched `step` and the sequential engine both run.

    `step(truth, contexts, i, user, actions, noise) -> (reward, regret)`: user i of the block (global index `user`)
    chose actions[i] on contexts[i] (a (n, 0) array in context-free worlds); noise[i] is its pre-drawn randomness
    (Env.draw_noise). `truth`: the env's arrays and constants that only `step` reads (the engine passes it on
    unopened: no algorithm ever sees it)."""

    step: object
    truth: tuple


def step_loop(step):
    """The loop of a round's users around an env's compiled step (inlined: ldpfed.util.jit), built once per process and
    compiled once per machine (ldpfed.util.jit's disk cache): what an env's batched `step` runs."""
    def build(use):
        one = use(step)

        @njit
        def run_steps(truth, contexts, users, actions, noise, rewards, regret):
            for i in range(actions.shape[0]):
                rewards[i], regret[i] = one(truth, contexts, i, users[i], actions, noise)

        return run_steps

    return loops(("env", step), build)


class Env:
    """A world of users: contexts, rewards and the ground truth (which no algorithm may see; it gets `public()`).

    Class attributes a subclass sets: `name`, `options` ({name: Option}: default, kind, bounds, doc, as an
    algorithm's: `--env-param NAME=VALUE`; `defaults` is derived from them), `profile_defaults`, `kinds` (below),
    and, per instance, `d` (context dimension; 0 without contexts), `K` (arms; 0 for continuous actions), `multi`
    (contexts (n, d) with one parameter per arm instead of (n, K, d)), `reward_bound` (the public |r| <= c_r that
    clients clip to) and `link` (the GLM link, where there is one). `contexts(users, rng)` gives the users' contexts,
    `step(contexts, actions, users, rng)` their rewards and regrets; `compiled()` optionally gives numba steps for
    the compiled paths.

    Kinds: an algorithm lists the kinds of world it runs on (`Algorithm.env_kinds`), and runs on every env of one of
    them. An env is of its own kind (its name) and of each kind in `kinds`: the names of other envs whose contract
    it keeps (the shapes of contexts and actions, `multi`, `link`, the PublicWorld fields they define), e.g.
    `kinds = ("linear",)` for a linear world with K unit-bounded contexts per user: every algorithm that runs on
    "linear" then runs on it, unchanged. ldpfed.testing.check_env's "kind" check compares it with those envs.

    Options are checked in one place, `checked_params` (RunConfig calls it, so a bad value stops a run before any
    work; `__init__` calls it again): unknown names (with a did-you-mean), wrong types, NaN, inf, out-of-range values
    raise ConfigError naming `env_params.<option>`; `cross_check` adds the checks that involve several options or
    the number of users. A class that lists plain `defaults` instead still works: its options are then accepted as
    they are."""

    name: str = ""
    kinds: tuple = ()      # other envs' names whose contract this one keeps (its own name is always its kind)
    options: dict = {}     # option name -> Option (ldpfed.util.options): default, kind, bounds, doc
    defaults: dict = {}    # option name -> default, derived from `options`
    # Options whose default differs under RunConfig.profile="authors-code" (make_env applies them); keys of `defaults`.
    profile_defaults: dict = {}
    d: int = 0          # context (or action) dimension; 0 for context-free worlds
    K: int = 0          # number of arms; 0 for continuous actions
    multi: bool = False  # contexts (n, d) with one parameter per arm, instead of (n, K, d)
    reward_bound: float = 1.0  # a public bound |r| <= c_r that clients clip to before privatizing
    link: str | None = None    # GLM link, where the world has one
    varies: str = ""           # what `varied` changes in a population's world ("": the env does not say: no `varied`)

    def __init_subclass__(cls, **kwargs):
        """`defaults` from the class's own `options` (each Option's default must pass its own check); for a class
        that lists plain `defaults`, options built from them (ldpfed.util.options.options_from_defaults)."""
        super().__init_subclass__(**kwargs)
        declare_options(cls, "env_params")

    def __init__(self, rng: np.random.Generator, users: int, **params):
        self.params = self.checked_params(params, users=users)
        self.horizon = users

    @classmethod
    def kinds_of(cls) -> tuple:
        """The kinds of world this env is: its own name, then `kinds`."""
        return (cls.name, *(kind for kind in cls.kinds if kind != cls.name))

    @classmethod
    def checked_params(cls, params: dict, profile: str = "paper", users: int | None = None) -> dict:
        """A run's env options over the defaults (its profile's first), each checked by its Option, then
        `cross_check`: ConfigError naming env_params.<name> for an unknown or bad one."""
        if not isinstance(params, dict):
            raise ConfigError("env_params", params, "must be a mapping")
        refuse_unknown(params, cls.defaults, "env_params", f"of env {cls.name}")
        merged = {**cls.defaults, **cls.profile_defaults.get(profile, {}), **params}
        options = cls.options
        values = {name: (options[name].validate(name, _whole(options[name], value), "env_params")
                         if name in options else value) for name, value in merged.items()}
        cls.cross_check(values, users)
        return values

    @classmethod
    def cross_check(cls, params: dict, users: int | None) -> None:
        """ConfigError naming env_params.<name> when options that pass their own checks do not fit together or
        with the number of users (None: not known yet). Default: nothing to check."""

    @classmethod
    def option_table(cls) -> list[dict]:
        """One row per option: name, default, kind, bounds, choices, allow, accepts, doc, and the profiles whose
        default differs (as Algorithm.option_table)."""
        return option_rows(cls.options, cls.profile_defaults)

    def contexts(self, users: np.ndarray, rng: np.random.Generator):
        """Contexts of these users (global indices), or None for context-free worlds."""
        return None

    def context_stream(self, users: np.ndarray, rng: np.random.Generator):
        """`contexts(lo, hi)`: the context rows (context_rows) of users[lo:hi], asked for in order, with `rng` left
        where `contexts(users, rng)` leaves it (the draws after the contexts, e.g. draw_noise's, are the same), for
        the sequential engine, which reads them a sub-block at a time. Default: every user's contexts drawn at
        once; an env whose contexts are large draws them when asked (SparseLinear)."""
        rows = self.context_rows(self.contexts(users, rng), len(users))
        return lambda lo, hi: rows[lo:hi]

    def step(self, contexts, actions, users: np.ndarray, rng: np.random.Generator):
        """(rewards, pseudo-regret per user) for the chosen actions. An env with a compiled step (`compiled()`)
        inherits this: its noise drawn by draw_noise, then its step for every user."""
        steps = self.compiled()
        if steps is None:
            raise NotImplementedError
        n = len(actions)
        noise = self.draw_noise(n, rng)
        rewards, regret = np.empty(n), np.empty(n)
        step_loop(steps.step)(steps.truth, self.context_rows(contexts, n), np.asarray(users, dtype=np.int64),
                  np.asarray(actions), noise, rewards, regret)
        return rewards, regret

    def compiled(self) -> EnvSteps | None:
        """The env's step for one user, compiled (EnvSteps), or None: an env without one runs its batched `step`
        only (the sequential engine then cannot run it)."""
        return None

    def draw_noise(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """The randomness of n users' steps, drawn after their contexts from the same Generator, (n,) or (n, q)."""
        return rng.random(n)

    @staticmethod
    def context_rows(contexts, n: int) -> np.ndarray:
        """The contexts as the compiled steps take them: a (n, 0) array when the world has none."""
        return np.zeros((n, 0)) if contexts is None else contexts

    def varied(self, spread: float, rng: np.random.Generator) -> "Env":
        """A world drawn around this one, for a population of its own (the heterogeneous federation model): the same
        public world (dimension, arms, bounds), its truth moved by `spread` >= 0. Spread 0 is this very world, for
        every env (no draw). An env says what moves in `varies` and does it in `_vary` on a copy; for a spread > 0,
        NotImplementedError when it says nothing."""
        if isinstance(spread, bool) or not isinstance(spread, (int, float)) or not np.isfinite(spread) or spread < 0:
            raise ValueError(f"env {self.name}: a world's spread must be a finite number >= 0, got {spread!r}")
        if spread == 0:
            return self
        if not self.varies:
            raise NotImplementedError(f"env {self.name} does not say how its world varies (Env.varied)")
        world = copy.copy(self)
        world.__dict__.pop("_steps", None)      # a cached compiled step holds the old truth
        world._vary(float(spread), rng)
        return world

    def _vary(self, spread: float, rng: np.random.Generator) -> None:
        """Replace (never modify in place: the arrays are shared with the run's world) the truth of this copy."""
        raise NotImplementedError

    def estimation_error(self, estimate) -> float | None:
        """Distance of an algorithm's parameter estimate from the truth, where defined."""
        return None

    def public(self) -> PublicWorld:
        """What the algorithms may know (see PublicWorld); subclasses add their public parameters."""
        return PublicWorld(name=self.name, d=int(self.d), K=int(self.K), multi=bool(self.multi),
                           horizon=int(self.horizon), reward_bound=float(self.reward_bound), link=self.link)

    def describe(self) -> dict:
        return {"env": self.name, "d": self.d, "K": self.K, **self.params}


def _whole(option: Option, value):
    """An env's integer option takes a whole float as its integer (4.0 or 1e3 from JSON or TOML), as every integer
    option of a run does (ldpfed.util.errors.integer); NaN, inf and 2.5 stay floats, which the Option refuses."""
    if option.kind == "int" and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def nonneg_float(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) or value < 0:
        raise ConfigError(name, value, "must be a finite number >= 0")
    return float(value)


def unit_sphere(rng: np.random.Generator, shape, d: int) -> np.ndarray:
    """Uniform draws on the unit sphere of R^d, shape (*shape, d)."""
    x = rng.standard_normal((*np.atleast_1d(shape), d))
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def turned(vectors: np.ndarray, spread: float, rng: np.random.Generator) -> np.ndarray:
    """Each row (or the vector) moved by about `spread` of its norm in a uniformly random direction, its norm kept:
    v' = |v| (v/|v| + spread g/sqrt(d)) / |...|, g standard normal. A world's parameter turned, its bounds unchanged."""
    vectors = np.asarray(vectors, dtype=float)
    d = vectors.shape[-1]
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    unit = np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)
    moved = unit + spread * rng.standard_normal(vectors.shape) / np.sqrt(d)
    return norms * moved / np.linalg.norm(moved, axis=-1, keepdims=True)


def check_env_class(cls, where: str) -> None:
    """PluginError when an Env subclass breaks what the engines rely on (checked when it is registered)."""
    from ldpfed.plugins import PluginError

    def fail(what, why):
        raise PluginError(f"{where}: {what}: {why}", field=f"{cls.name}.{what}")

    if not isinstance(cls.defaults, dict):
        fail("defaults", f"{cls.defaults!r} must be a dict of option -> default")
    if not isinstance(cls.kinds, (tuple, list)) or not all(isinstance(k, str) and k for k in cls.kinds):
        fail("kinds", f"{cls.kinds!r} must be a tuple of env names (the kinds of world it also is)")
    for profile, options in cls.profile_defaults.items():
        unknown = set(options) - set(cls.defaults)
        if unknown:
            fail(f"profile_defaults.{profile}", f"options {sorted(unknown)} are not in defaults")
    if cls.step is Env.step and cls.compiled is Env.compiled:
        fail("step", "not implemented (an env returns rewards and pseudo-regret for the chosen actions)")

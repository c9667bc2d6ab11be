"""A sweep: which runs a job makes, read from a TOML file, a preset, a mapping or keyword arguments, with overrides
(`load`). The presets quick, paper and example ship with the package (ldpfed/presets/*.toml, package data).
`add_arguments` / `api_options`: the command line of `python -m ldpfed sweep FILE|PRESET` and jobs/run_all.py.
`ldpfed.sweep(...)` runs a sweep (ldpfed/sweep_runner.py). The keys:

    name = "quick"                      # the sweep's name (MLflow parent run, results folder); default: file stem
    description = "..."                 # one line, shown on the MLflow parent run
    algorithms = "all"                  # or a list of registry names
    envs = "paper"                      # each algorithm on its paper's env; or a list: every algorithm on each
                                        # listed env it supports (a listed algorithm that supports none of them
                                        # is an error before any run)
    eps = [0.5, 2.0]                    # privacy budgets of the private algorithms
    seeds = [0, 1]                      # a list, or an inclusive range "0-9"
    users = 10000                       # omit: each algorithm's paper setting
    round_size = 500
    populations = 4
    delta = 0.01                        # omit: each algorithm's paper setting
    engine = "ray"                      # or "local"
    profile = "paper"                   # or "authors-code"
    [ray]                               # Ray engine options
    actors = 2
    shards = 2
    placement = "spread"                # or "pack"; "none": no placement group (RayBackend's doc)
    [params.ldp-sgd]                    # algorithm options, per algorithm
    step = 0.5
    [env_params.linear]                 # env options, per env (over the paper setting's); checked before
    d = 10                              # any run (python -m ldpfed describe ENV lists them)
    [env_round_size]                    # users per round of every run on that env, over round_size (e.g. a
    piecewise-bernoulli = 10            # sliding window's world: rounds well under the window)

Non-private algorithms (privacy model "none") run once per seed, not once per eps: eps plays no part in them.
Uniform play, when listed, runs on every distinct world (env, its options, users) of the other runs that has arms.
"""
from __future__ import annotations

import json
import math
import re
import tomllib
from dataclasses import dataclass, field, fields, replace
from importlib import resources
from pathlib import Path

from ldpfed.config import DEFAULT_FEDERATION, DEFAULT_TRUST
from ldpfed.engine.ray_options import PLACEMENTS, RayOptions
from ldpfed.util.errors import ConfigError, integer

ENGINES = ("local", "ray")
# What a sweep's [ray] table may set for each of its Ray-engine runs (checked by RayOptions)
RAY_KEYS = ("actors", "shards", "mode", "placement", "actor_cpus", "shard_cpus")
EXPERIMENT, OUT = "run_all", "results/run_all"     # where sweeps go unless told (`ldpfed sync` assumes the same)


@dataclass(frozen=True)
class Sweep:
    name: str
    description: str = ""
    algorithms: tuple = ()                 # () = every algorithm
    envs: tuple = ()                       # () = each algorithm's paper env
    eps: tuple = (1.0,)
    seeds: tuple = (0,)
    users: int | None = None
    round_size: int = 1
    populations: int = 1
    delta: float | None = None
    engine: str = "local"
    profile: str = "paper"
    trust: str = DEFAULT_TRUST             # the trust model of the algorithms in its reach (the others: local)
    trust_options: dict = field(default_factory=dict)   # its options (RunConfig.trust_options), validated
    federation: str = DEFAULT_FEDERATION   # the federation model of every run (ldpfed.federation)
    federation_options: dict = field(default_factory=dict)   # its options (RunConfig.federation_options), validated
    ray: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)
    env_params: dict = field(default_factory=dict)
    env_round_size: dict = field(default_factory=dict)     # env -> users per round on it (over round_size)

    def to_dict(self) -> dict:
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v) for f in fields(self)}


# The shuffle model's options as top-level keys, as sweep files wrote them before [trust_options] (aliases).
TRUST_OPTION_KEYS = ("shufflers", "small_groups")
KEYS = {f.name for f in fields(Sweep)} | set(TRUST_OPTION_KEYS)


def parse_seeds(value, where: str = "seeds") -> tuple:
    """A list of seeds, or an inclusive range "A-B" (also accepted: "0,1,5" from the command line)."""
    if isinstance(value, str):
        text = value.replace(" ", "")
        match = re.fullmatch(r"(\d+)-(\d+)", text)
        if match:
            low, high = int(match.group(1)), int(match.group(2))
            if high < low:
                raise ConfigError(where, value, "an empty range: write low-high")
            return tuple(range(low, high + 1))
        try:
            value = [int(s) for s in text.split(",") if s]
        except ValueError:
            raise ConfigError(where, value, "expected a list of seeds or an inclusive range such as 0-9") from None
    if not isinstance(value, (list, tuple)) or not value:
        raise ConfigError(where, value, "expected a non-empty list of seeds or an inclusive range such as 0-9")
    seeds = []
    for seed in value:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ConfigError(where, seed, "a seed is an integer >= 0")
        if seed in seeds:
            raise ConfigError(where, seed, "listed twice")
        seeds.append(seed)
    return tuple(seeds)


def parse_eps(value, where: str = "eps") -> tuple:
    if isinstance(value, str):
        try:
            value = [float(e) for e in value.split(",") if e.strip()]
        except ValueError:
            raise ConfigError(where, value, "expected comma-separated numbers") from None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        raise ConfigError(where, value, "expected a non-empty list of numbers")
    out = []
    for eps in value:
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
            raise ConfigError(where, eps, "eps is a finite number > 0")
        out.append(float(eps))
    return tuple(dict.fromkeys(out))


def _names(value, where: str, known) -> tuple:
    if value in ("all", "paper", None):
        return ()
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ConfigError(where, value, "expected a list of names")
    for name in value:
        if name not in known:
            raise ConfigError(where, name, f"unknown; choose from {sorted(known)}")
    return tuple(dict.fromkeys(value))


def build(data: dict, source: str = "sweep") -> Sweep:
    """A validated Sweep from a mapping (a parsed TOML file, with overrides); errors name `source` and the key."""
    from ldpfed.algorithms import REGISTRY
    from ldpfed.trust import TRUST_MODELS
    from ldpfed.config import PROFILES
    from ldpfed.federation import FEDERATIONS
    from ldpfed.envs import ENVS

    unknown = set(data) - KEYS
    if unknown:
        raise ConfigError(f"{source}: {sorted(unknown)[0]}", data[sorted(unknown)[0]],
                          f"unknown key; known: {sorted(KEYS)}")
    name = data.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[\w.+-]+", name or ""):
        raise ConfigError(f"{source}: name", name, "a sweep needs a name of letters, digits and . _ + -")
    engine = data.get("engine", "local")
    if engine not in ENGINES:
        raise ConfigError(f"{source}: engine", engine, f"choose from {list(ENGINES)}")
    profile = data.get("profile", "paper")
    if profile not in PROFILES:
        raise ConfigError(f"{source}: profile", profile, f"choose from {list(PROFILES)}")
    trust = data.get("trust", DEFAULT_TRUST)
    if trust not in TRUST_MODELS:
        raise ConfigError(f"{source}: trust", trust, f"choose from {sorted(TRUST_MODELS)}")
    trust_options = data.get("trust_options", {})
    if not isinstance(trust_options, dict):
        raise ConfigError(f"{source}: trust_options", trust_options, "must be a table")
    trust_options = dict(trust_options)
    for key in TRUST_OPTION_KEYS:       # aliases of [trust_options] keys
        if key in data:
            if key in trust_options and trust_options[key] != data[key]:
                raise ConfigError(f"{source}: {key}", data[key], f"given twice, differently (trust_options.{key} = "
                                                                 f"{trust_options[key]!r})")
            trust_options[key] = data[key]
    try:        # the trust model's own checks, before any run
        trust_options = TRUST_MODELS[trust].checked_options(trust_options)
    except ConfigError as error:
        raise ConfigError(f"{source}: {error.field}", error.value, error.reason) from None
    federation = data.get("federation", DEFAULT_FEDERATION)
    if federation not in FEDERATIONS:
        raise ConfigError(f"{source}: federation", federation, f"choose from {sorted(FEDERATIONS)}")
    federation_options = data.get("federation_options", {})
    if not isinstance(federation_options, dict):
        raise ConfigError(f"{source}: federation_options", federation_options, "must be a table")
    try:        # the federation model's own checks, before any run
        federation_options = FEDERATIONS[federation].checked_options(dict(federation_options))
    except ConfigError as error:
        raise ConfigError(f"{source}: {error.field}", error.value, error.reason) from None
    delta = data.get("delta")
    if delta is not None and not (isinstance(delta, (int, float)) and 0 < delta < 1):
        raise ConfigError(f"{source}: delta", delta, "must be in (0, 1)")
    users = data.get("users")
    sweep = Sweep(
        name=name, description=str(data.get("description", "")),
        algorithms=_names(data.get("algorithms", "all"), f"{source}: algorithms", REGISTRY),
        envs=_names(data.get("envs", "paper"), f"{source}: envs", ENVS),
        eps=parse_eps(data.get("eps", [1.0]), f"{source}: eps"),
        seeds=parse_seeds(data.get("seeds", [0]), f"{source}: seeds"),
        users=None if users is None else integer(f"{source}: users", users),
        round_size=integer(f"{source}: round_size", data.get("round_size", 1)),
        populations=integer(f"{source}: populations", data.get("populations", 1)),
        delta=None if delta is None else float(delta), engine=engine, profile=profile, trust=trust,
        trust_options=trust_options, federation=federation, federation_options=federation_options)
    for key in ("ray", "params", "env_params", "env_round_size"):
        value = data.get(key, {})
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: {key}", value, "must be a table")
        sweep = replace(sweep, **{key: dict(value)})
    for algorithm, options in sweep.params.items():
        if algorithm not in REGISTRY or not isinstance(options, dict):
            raise ConfigError(f"{source}: params.{algorithm}", options, "a table per known algorithm")
    for env, options in sweep.env_params.items():
        if env not in ENVS or not isinstance(options, dict):
            raise ConfigError(f"{source}: env_params.{env}", options, "a table per known env")
    check_env_params(sweep, source)
    check_algorithms_run(sweep, source)
    for env, size in sweep.env_round_size.items():
        if env not in ENVS:
            raise ConfigError(f"{source}: env_round_size.{env}", size, f"unknown env; choose from {sorted(ENVS)}")
        sweep.env_round_size[env] = integer(f"{source}: env_round_size.{env}", size)
    unknown_ray = set(sweep.ray) - set(RAY_KEYS)
    if unknown_ray:
        raise ConfigError(f"{source}: ray", sorted(unknown_ray), f"known: {', '.join(RAY_KEYS)}")
    try:          # the Ray engine's own checks, before any run
        RayOptions(**sweep.ray)
    except ConfigError as error:
        raise ConfigError(f"{source}: ray.{error.field}", error.value, error.reason) from None
    return sweep


def check_env_params(sweep: Sweep, source: str = "sweep") -> None:
    """Every [env_params.ENV] table's options checked as a run checks them (unknown names, types, NaN, inf, ranges:
    the env's Options), before any run: a ConfigError naming `<source>: env_params.<env>.<option>`."""
    from ldpfed.envs import ENVS

    for env, options in sweep.env_params.items():
        try:
            ENVS[env].checked_params(options, sweep.profile)
        except ConfigError as error:
            field = error.field.removeprefix("env_params.")
            raise ConfigError(f"{source}: env_params.{env}.{field}", error.value, error.reason) from None


def check_algorithms_run(sweep: Sweep, source: str = "sweep") -> None:
    """A listed algorithm that runs on none of the listed envs is an error before any run (not a silent drop: the
    sweep would report without it). With algorithms = "all", each runs on the listed envs it supports."""
    from ldpfed.algorithms import REGISTRY

    if not sweep.algorithms or not sweep.envs:
        return
    for name in sweep.algorithms:
        cls = REGISTRY[name]
        if not any(cls.runs_on(env) for env in sweep.envs):
            raise ConfigError(f"{source}: algorithms", name, f"runs on none of the listed envs {list(sweep.envs)}; "
                                                             f"it runs on {cls.envs()}: list one of those in envs, "
                                                             f"or drop {name}")


def presets() -> dict:
    """The sweep presets shipped with ldpfed (package data ldpfed/presets/*.toml), by name: {name: file}.

    They are the resources of the package `ldpfed.presets`, not a folder next to `ldpfed`'s own path: from a folder
    that holds a folder named ldpfed (a clone of the repository, say), Python takes that folder for a namespace
    package `ldpfed`, while an editable install's finder still serves ldpfed's modules and `ldpfed.presets`. Not
    found at all (a broken install): a ConfigError, which the command line prints as one line."""
    try:
        folder = resources.files("ldpfed.presets")
        items = sorted(folder.iterdir(), key=lambda item: item.name)
    except (ImportError, OSError) as error:
        raise ConfigError("presets", "ldpfed/presets", f"the sweep presets shipped with ldpfed are not found "
                          f"({type(error).__name__}: {error}); reinstall ldpfed (pip install -e .)") from None
    return {item.name[:-len(".toml")]: item for item in items if item.name.endswith(".toml")}


def locate(spec, where: str = "FILE|PRESET"):
    """The sweep file `spec` names: a path to a TOML file, else the preset of that name."""
    path = Path(spec)
    if path.is_file():
        return path
    shipped = presets()
    if str(spec) in shipped:
        return shipped[str(spec)]
    raise ConfigError(where, str(spec), f"no such file, and not a preset ({', '.join(shipped)})")


def read(path) -> dict:
    """The raw mapping of a sweep file (a path, or a preset from `presets()`); `name` defaults to the file's stem."""
    path = path if hasattr(path, "open") and hasattr(path, "name") else Path(path)
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError("--sweep", str(path), "no such file") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError("--sweep", str(path), f"not valid TOML: {error}") from None
    data.setdefault("name", Path(path.name).stem)
    return data


def configs(sweep: Sweep) -> list:
    """The RunConfigs of a sweep, in order: per algorithm (sorted), per world, per eps (private ones only),
    per seed; uniform play last, once per world with arms."""
    from ldpfed.algorithms import REGISTRY
    from ldpfed.config import RunConfig
    from ldpfed.envs import ENVS

    names = sorted(sweep.algorithms or REGISTRY)
    learners = [n for n in names if n != "uniform"]
    worlds = []          # (algorithm, env, env_params, users, delta, params)
    for name in learners:
        cls = REGISTRY[name]
        setting = dict(cls.paper_setting)
        envs = [e for e in sweep.envs if cls.runs_on(e)] if sweep.envs else [cls.default_env]
        for env in envs:
            env_params = dict(setting.get("env_params", {})) if env == cls.default_env else {}
            env_params.update(sweep.env_params.get(env, {}))
            worlds.append((name, env, env_params, sweep.users or setting.get("users", 100_000),
                           sweep.delta or setting.get("delta", 0.01),
                           {**setting.get("params", {}), **sweep.params.get(name, {})}))
    if "uniform" in names:
        seen = {}
        candidates = [(env, env_params, users) for _, env, env_params, users, _, _ in worlds]
        if not learners:       # uniform alone: on the listed envs (or every env it knows) with their options
            candidates = [(env, dict(sweep.env_params.get(env, {})), sweep.users or 100_000)
                          for env in (sweep.envs or REGISTRY["uniform"].envs())]
        for env, env_params, users in candidates:
            if not REGISTRY["uniform"].runs_on(env):
                continue
            key = (env, repr(sorted({**ENVS[env].defaults, **env_params}.items())), users)
            seen.setdefault(key, (env, env_params, users))
        worlds += [("uniform", env, env_params, users, sweep.delta or 0.01, sweep.params.get("uniform", {}))
                   for env, env_params, users in seen.values()]
    out = []
    for name, env, env_params, users, delta, params in worlds:
        round_size = min(sweep.env_round_size.get(env, sweep.round_size), users)
        private = REGISTRY[name].privacy_model != "none"
        # eps is a required field of a RunConfig; a non-private algorithm ignores it: one run per seed at eps 1
        runs = [RunConfig(algorithm=name, env=env, users=users, round_size=round_size,
                          populations=min(sweep.populations, round_size), eps=eps, delta=delta, seed=seed,
                          env_params=env_params, params=params, profile=sweep.profile, federation=sweep.federation,
                          federation_options=sweep.federation_options)
                for eps in (sweep.eps if private else (1.0,)) for seed in sweep.seeds]
        if runs and in_reach(sweep.trust, runs[0]):      # the others run under local
            runs = [run.replace(trust=sweep.trust, trust_options=sweep.trust_options) for run in runs]
        out += runs
    return out


def in_reach(trust: str, config) -> bool:
    """Whether the trust model can run the algorithm of `config` (a local run), decided on the algorithm built
    under local (TrustModel.reach): a sweep runs the others under local, as it says."""
    from ldpfed.algorithms import REGISTRY
    from ldpfed.envs import make_env
    from ldpfed.trust import TrustModel, trust_model

    model = trust_model(trust)
    if type(model).refusal is TrustModel.refusal:      # a model that reaches every algorithm: nothing to build
        return True
    return model.reach(REGISTRY[config.algorithm], make_env(config).public(), config) is None


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} to TOML")


def to_toml(sweep: Sweep) -> str:
    """The sweep as a TOML file that `read` + `build` turn back into the same Sweep (the effective sweep of a
    job, logged with it so it can be rerun as is)."""
    data = sweep.to_dict()
    lines = []
    for key, value in data.items():
        if key in ("ray", "params", "env_params", "env_round_size", "trust_options", "federation_options") \
                or value is None:
            continue
        if key in ("algorithms", "envs") and not value:
            value = "all" if key == "algorithms" else "paper"
        lines.append(f"{key} = {_toml_value(value)}")
    if data["trust_options"]:
        lines += ["", "[trust_options]"] + [f'"{k}" = {_toml_value(v)}' for k, v in data["trust_options"].items()]
    given = {k: v for k, v in data["federation_options"].items() if v is not None}   # None: TOML has no null
    if given:
        lines += ["", "[federation_options]"] + [f'"{k}" = {_toml_value(v)}' for k, v in given.items()]
    if data["ray"]:
        lines += ["", "[ray]"] + [f"{k} = {_toml_value(v)}" for k, v in data["ray"].items()]
    if data["env_round_size"]:
        lines += ["", "[env_round_size]"] + [f'"{k}" = {_toml_value(v)}' for k, v in data["env_round_size"].items()]
    for table in ("params", "env_params"):
        for owner, options in data[table].items():
            lines += ["", f'[{table}."{owner}"]'] + [f'"{k}" = {_toml_value(v)}' for k, v in options.items()]
    return "\n".join(lines) + "\n"


# Command-line options that override a key of the sweep file: (option dest, sweep key, parser of the text).
OVERRIDES = [("algorithms", "algorithms", None), ("envs", "envs", None), ("eps", "eps", parse_eps),
             ("seeds", "seeds", parse_seeds), ("users", "users", int), ("round_size", "round_size", int),
             ("populations", "populations", int), ("delta", "delta", float), ("engine", "engine", None),
             ("profile", "profile", None), ("trust", "trust", None)]


def add_arguments(parser) -> None:
    """The command-line options of a sweep job (besides the choice of the sweep file): name, overrides of the file's
    keys, engine, where the runs run, tracking, resume. `python -m ldpfed sweep` and jobs/run_all.py share them;
    `api_options` turns the parsed options into the keyword arguments of `ldpfed.sweep`."""
    from ldpfed.config import PROFILES

    parser.add_argument("--name", default=None,
                        help="the sweep's name (MLflow parent run, results folder); default: the file's, or "
                             "the file's with the overrides, e.g. 'quick+users2000'")
    over = parser.add_argument_group("overrides of the sweep file's keys (default: the file's value)")
    over.add_argument("--algorithms", default=None, help="comma-separated names, or 'all'")
    over.add_argument("--envs", default=None, help="comma-separated envs, or 'paper' (each algorithm's own)")
    over.add_argument("--eps", default=None, help="comma-separated eps values (private algorithms)")
    over.add_argument("--seeds", default=None, help="comma-separated seeds, or an inclusive range such as 0-9")
    over.add_argument("--users", default=None, help="users per run (default of the file: the paper setting)")
    over.add_argument("--round-size", default=None,
                      help="users per round of every run (over the file's round_size and [env_round_size])")
    over.add_argument("--populations", default=None, help="populations per run")
    over.add_argument("--delta", default=None, help="delta of every run (default of the file: the paper setting)")
    over.add_argument("--engine", choices=ENGINES, default=None, help="engine")
    over.add_argument("--profile", choices=PROFILES, default=None,
                      help="paper: the papers' text; authors-code: the public reference code's choices")
    over.add_argument("--trust", default=None, help="the trust model of the algorithms in its reach (the others run "
                                                    "under local); `python -m ldpfed list` names them")
    over.add_argument("--trust-option", action="append", default=None, metavar="KEY=VALUE",
                      help="an option of that trust model (repeatable), over the file's [trust_options]")
    parser.add_argument("--actors", type=int, default=None, help="population actors per run (ray; file: [ray])")
    parser.add_argument("--shards", type=int, default=None, help="server shard actors per run (ray; file: [ray])")
    parser.add_argument("--placement", choices=list(PLACEMENTS), default=None,
                        help="each run's placement group (ray; file: [ray]; default spread); none: no group, the "
                             "actors ask for no CPUs and every run reuses the processes, whatever its shape")
    parser.add_argument("--actor-cpus", type=float, default=None,
                        help="CPUs each population actor asks for (ray; file: [ray]; default: what fits)")
    parser.add_argument("--shard-cpus", type=float, default=None,
                        help="CPUs each server shard actor asks for (ray; file: [ray]; default: what fits)")
    parser.add_argument("--address", default=None,
                        help="Ray cluster address, e.g. auto: the runs go to that cluster (default: without "
                             "--workers, this process; with it, a local Ray started for the sweep)")
    parser.add_argument("--workers", default=None, metavar="N|auto",
                        help="runs at once: 1 runs them in this process, one after another (the default without "
                             "--address); N or auto (the cluster's CPUs; the default with --address) sends them "
                             "to Ray as tasks, one CPU each (local engine); on the ray engine N or auto runs at "
                             "once, each driving its own actors, with --actor-cpus and --shard-cpus set (default: "
                             "one at a time, reusing the actors)")
    parser.add_argument("--tracking-uri", default=None,
                        help="MLflow store (default: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here)")
    parser.add_argument("--experiment", default=EXPERIMENT, help="MLflow experiment")
    parser.add_argument("--out", default=OUT, help="local copy of every result")
    parser.add_argument("--no-tracking", action="store_true", help="local results only, no MLflow")
    parser.add_argument("--resume", nargs="?", const="", default=None, metavar="DIR",
                        help="continue an interrupted sweep in its folder DIR (default: --out/<name>): its finished "
                             "runs are kept, an interrupted run continues from its checkpoint, the rest run; the "
                             "sweep is DIR/sweep.toml (no other option needed)")
    parser.add_argument("--checkpoint-every-s", type=float, default=20.0,
                        help="each run writes a checkpoint at least this often (seconds)")


def parse_workers(value, where: str = "workers"):
    """None (the default: 1 without an address, the cluster's CPUs with one), "auto" or an integer >= 1."""
    if value is None or value == "auto":
        return value
    try:
        return integer(where, int(value) if isinstance(value, str) else value)
    except (ValueError, ConfigError):
        raise ConfigError(where, value, "an integer >= 1 or 'auto'") from None


def overrides_from_args(args) -> dict:
    """The sweep keys the command line sets (--eps, --users, ...; --actors and --shards as the [ray] table), each
    converted from its text; a bad value is a ConfigError naming the option."""
    overrides = {}
    if getattr(args, "trust_option", None):
        options = {}
        for text in args.trust_option:
            if "=" not in text:
                raise ConfigError("--trust-option", text, "expected KEY=VALUE")
            key, raw = text.split("=", 1)
            try:
                options[key.strip()] = json.loads(raw)
            except json.JSONDecodeError:
                options[key.strip()] = raw
        overrides["trust_options"] = options
    for dest, key, convert in OVERRIDES:
        text = getattr(args, dest)
        if text is None:
            continue
        try:
            overrides[key] = convert(text) if convert is not None else text
        except ValueError:
            raise ConfigError("--" + dest.replace("_", "-"), text, "not a valid value") from None
    return overrides


def api_options(args) -> dict:
    """The keyword arguments of `ldpfed.sweep` that a parsed command line (`add_arguments`) gives, besides the
    sweep file: the overrides, the name, where the runs run, tracking, resume."""
    return {**overrides_from_args(args), "name": args.name, "actors": args.actors, "shards": args.shards,
            "placement": args.placement, "actor_cpus": args.actor_cpus, "shard_cpus": args.shard_cpus,
            "workers": parse_workers(args.workers, "--workers"), "address": args.address,
            "tracking": not args.no_tracking, "tracking_uri": args.tracking_uri, "experiment": args.experiment,
            "out": args.out, "resume": None if args.resume is None else (args.resume or True),
            "checkpoint_every_s": args.checkpoint_every_s}


def overridden_name(base: str, overrides: dict, limit: int = 80) -> str:
    """A file's sweep run with other keys: its name says which, e.g. "quick+users2000+eps0.5-1" (a sweep's name is
    letters, digits and . _ + -)."""
    def text(value):
        if isinstance(value, dict):         # e.g. trust_options: "dropout0.1-min_survivors0.85"
            return "-".join(f"{key}{text(item)}" for key, item in value.items())
        return "-".join(map(text, value)) if isinstance(value, (list, tuple)) else f"{value:g}" \
            if isinstance(value, float) else str(value)

    name = "+".join([base] + [f"{key}{text(value)}" for key, value in overrides.items()])
    return re.sub(r"[^\w.+-]", "-", name)[:limit]


def load(spec=None, overrides: dict | None = None, name: str | None = None, resume=None, out=OUT,
         ray: dict | None = None) -> tuple[Sweep, Path | None, Path | None]:
    """The sweep to run, validated; the file it came from (None for a mapping or keywords alone); the folder of the
    sweep it continues (None: a new sweep).

    spec: a sweep file, a preset's name, a mapping of sweep keys, or None (the overrides alone). overrides: sweep
    keys over the spec's (None values are left out); with any, a file's sweep is named after the file and them
    (`overridden_name`) unless `name` is given. ray: entries over the [ray] table (RAY_KEYS). resume: a sweep folder to continue, or True for
    out/<name>; the sweep is then that folder's sweep.toml."""
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    ray = {k: v for k, v in (ray or {}).items() if v is not None}
    resume_dir = None
    if resume is True:
        sweep, _, _ = load(spec, overrides, name, None, out, ray)
        resume_dir = Path(out) / slug_of(sweep.name)
    elif resume is not None and resume is not False:
        resume_dir = Path(resume)
    if resume_dir is not None:
        path = resume_dir / "sweep.toml"
        if not path.exists():
            raise ValueError(f"--resume: {path} not found (not the folder of a sweep)")
        data = read(path)
    elif spec is None or isinstance(spec, dict):
        path, data = None, {"name": "custom", **(spec or {})}
    else:
        path = spec if hasattr(spec, "open") and not isinstance(spec, (str, Path)) else locate(spec)
        data = read(path)
    if overrides and path is not None and resume_dir is None:
        data["name"] = overridden_name(data.get("name") or path.stem, overrides)
    if "round_size" in overrides and "env_round_size" not in overrides:
        data.pop("env_round_size", None)        # --round-size means every run's round size
    if "trust" in overrides and overrides["trust"] != data.get("trust") and "trust_options" not in overrides:
        data.pop("trust_options", None)         # another trust model: its own options, not the file's
    elif "trust_options" in overrides:          # over the file's table, key by key
        overrides = {**overrides, "trust_options": {**data.get("trust_options", {}), **overrides["trust_options"]}}
    data.update(overrides)
    if ray:
        data["ray"] = {**data.get("ray", {}), **ray}
    if name is not None:
        data["name"] = name
    return build(data, source=str(path) if path is not None else "sweep"), path, resume_dir


def slug_of(name: str) -> str:
    """The folder name of a sweep called `name` (as the tracker names it)."""
    from ldpfed.tracking.records import slug

    return slug(name)


def resume_folder(args, path) -> Path | None:
    """The folder of the sweep to continue (--resume DIR, or --out/<name> for a bare --resume), or None."""
    if args.resume is None:
        return None
    if args.resume:
        return Path(args.resume)
    sweep, _ = from_args(args, path, resuming=False)
    return Path(args.out) / slug_of(sweep.name)


def from_args(args, path, resuming: bool = True) -> tuple[Sweep, Path]:
    """The sweep file `path` with the command line's overrides applied, validated; and the file it came from. When
    resuming, the sweep as it was run (its folder's sweep.toml)."""
    resume = (args.resume or True) if resuming and args.resume is not None else None
    sweep, source, _ = load(path, overrides_from_args(args), args.name, resume, args.out,
                            {"actors": args.actors, "shards": args.shards})
    return sweep, source

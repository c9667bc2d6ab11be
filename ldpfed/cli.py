"""Command line: `python -m ldpfed run ALGORITHM ...`, `list`, `describe ALGORITHM`, `sweep FILE|PRESET`, `ui`,
`sync`."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ldpfed import sweep_spec as sweeps
from ldpfed.config import DEFAULT_FEDERATION, DEFAULT_TRUST, PROFILES, did_you_mean
from ldpfed.federation import FEDERATIONS, federation_help
from ldpfed.trust import TRUST_MODELS, trust_help, trust_model
from ldpfed.trust.shuffle import SMALL_GROUPS
from ldpfed.engine.ray_options import PLACEMENTS, TRANSPORTS
from ldpfed.engine.ray_shard import MODES
from ldpfed.plugins import PluginError
from ldpfed.tracking.store import TrackingUnavailable
from ldpfed.util.errors import ConfigError, integer

# Where a RunConfig field comes from on the command line, so an error names the option the user typed.
OPTION_OF_FIELD = {"algorithm": "ALGORITHM", "env": "--env", "users": "--users", "round_size": "--round-size",
                   "populations": "--populations", "eps": "--eps", "delta": "--delta", "seed": "--seed",
                   "profile": "--profile", "trust": "--trust", "trust_options": "--trust-option",
                   "federation": "--federation", "federation_options": "--federation-option",
                   "mode": "--mode",
                   "out": "--out", "resume": "--resume", "group_size": "--group-size", "actors": "--actors",
                   "shards": "--shards", "transport": "--transport", "actor_cpus": "--actor-cpus",
                   "deadline_s": "--deadline-s", "straggle_share": "--straggle-share", "straggle_s": "--straggle-s",
                   "shard_cpus": "--shard-cpus", "placement": "--placement"}


def _key_value(text: str):
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    key, raw = text.split("=", 1)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key.strip(), value


def _positive_int(text: str) -> int:
    """A count from the command line: an integer >= 1, also written as 1e5 (ldpfed.util.errors.integer checks it)."""
    try:
        return integer("value", float(text) if "e" in text.lower() else int(text))
    except (ValueError, ConfigError):
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


class _Defaults(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, except where there is none to show (the help then says what happens)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or action.default == []:
            return action.help
        return super()._get_help_string(action)


class ExamplesHelp(argparse.RawDescriptionHelpFormatter, _Defaults):
    """_Defaults, with the description and the examples (epilog) as written."""


SWEEP_EXAMPLES = """examples:
  python -m ldpfed sweep quick --users 2000                 # the quick preset, 2,000 users per run
  python -m ldpfed sweep example --workers 2                # 2 runs at once, Ray tasks on a local Ray
  python -m ldpfed sweep paper --address auto               # on the running Ray cluster, every node's CPUs
  python -m ldpfed sweep my-sweep.toml --eps 0.5,1 --seeds 0-4 --name my-sweep
  python -m ldpfed sweep --resume results/run_all/quick     # continue a sweep stopped with Ctrl-C
"""
UI_EXAMPLES = """examples:
  python -m ldpfed ui                                # ./mlflow.db (where sweeps log), its latest sweep
  python -m ldpfed ui results/run_all/quick          # the store of that sweep, and a link to it
  python -m ldpfed ui other.db --port 5001
"""


def _preset_names() -> str:
    """The presets for `sweep --help`; the parser is built before every command, so presets that cannot be found
    do not stop the others (`sweep PRESET` then says so in one line)."""
    try:
        return ", ".join(sweeps.presets())
    except ConfigError as error:
        return f"none found ({error.reason})"


def build_parser() -> argparse.ArgumentParser:
    defaults = _Defaults
    parser = argparse.ArgumentParser(prog="python -m ldpfed", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one algorithm on one env and print its final regret",
                         formatter_class=defaults,
                         description="Run one algorithm on one env. `python -m ldpfed describe ALGORITHM` lists "
                                     "its options (--param) and its envs' options (--env-param).")
    run.add_argument("algorithm", help="a name from `python -m ldpfed list`")
    run.add_argument("--env", default=None, help="env name (default: the algorithm's paper env)")
    run.add_argument("--users", type=_positive_int, default=10_000, help="number of users T (1e5 is accepted)")
    run.add_argument("--round-size", type=_positive_int, default=1, help="users per round B (1 = sequential)")
    run.add_argument("--populations", type=_positive_int, default=1, help="logical user populations")
    run.add_argument("--eps", type=_float, default=1.0,
                     help="privacy budget epsilon (ignored by non-private algorithms)")
    run.add_argument("--delta", type=_float, default=0.01,
                     help="privacy parameter delta in (0, 1) (used by (eps, delta) mechanisms only)")
    run.add_argument("--seed", type=int, default=0, help="run seed: the world and all randomness derive from it")
    run.add_argument("--profile", choices=PROFILES, default="paper",
                     help="paper: the papers' text; authors-code: the public reference code's choices")
    run.add_argument("--trust", choices=sorted(TRUST_MODELS), default=DEFAULT_TRUST,
                     help=f"where the noise goes ({trust_help()})")
    run.add_argument("--trust-option", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                     help="an option of the trust model (repeatable; `describe NAME` lists them), e.g. "
                          "shufflers=2")
    run.add_argument("--federation", choices=sorted(FEDERATIONS), default=DEFAULT_FEDERATION,
                     help=f"which of a round's users take part ({federation_help()}); docs/federation.md")
    run.add_argument("--federation-option", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                     help="an option of the federation model (repeatable; `describe NAME` lists them), e.g. p=0.8, "
                          "p_by_population=[0.9,0.5], cycle=0.5, trace=participation.csv or drop=after")
    run.add_argument("--shufflers", type=_positive_int, default=None,
                     help="with --trust shuffle: --trust-option shufflers=S (S shufflers, each mixing its share of "
                          "a round; on the ray engine, S shuffler actors, --mode per-user)")
    run.add_argument("--small-groups", choices=SMALL_GROUPS, default=None,
                     help="with --trust shuffle: --trust-option small_groups=... (refuse, the default, or "
                          "no-amplification: see docs/trust-models.md)")
    run.add_argument("--param", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                     help="algorithm option (repeatable; see `describe`)")
    run.add_argument("--env-param", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                     help="env option (repeatable; see `describe`), e.g. d=10")
    run.add_argument("--engine", choices=["local", "ray"], default="local", help="engine")
    run.add_argument("--path", choices=PATHS, default="auto",
                     help="local engine at --round-size 1: sequential (the compiled one-user loop: the same "
                          "distribution of results, not the Ray engine's bits), rounds (the round loop: the Ray "
                          "engine's bits, ~30x slower) or auto (sequential where it runs, else rounds)")
    run.add_argument("--actors", type=_positive_int, default=2, help="population actors (ray engine)")
    run.add_argument("--shards", type=_positive_int, default=1, help="server shard actors (ray engine)")
    run.add_argument("--mode", choices=MODES, default="pre-aggregated",
                     help="ray engine: populations send their sums, or every user's message")
    run.add_argument("--group-size", type=int, default=None,
                     help="ray engine: population actors per group of a tree-shaped round (the driver calls one "
                          "leader per group; 0 or 1: flat; default: flat below 32 actors, ~sqrt(actors) above)")
    run.add_argument("--transport", choices=TRANSPORTS, default=None,
                     help="ray engine: the rounds' messages over authenticated sockets between the actors "
                          "(direct: faster per round; flat rounds, not with --trust shuffle) or as Ray calls; "
                          "default: direct where it can run (not for --group-size above 1 or --trust shuffle)")
    run.add_argument("--actor-cpus", type=_float, default=None,
                     help="ray engine: CPUs each population actor asks Ray for (fractions allowed; default: the "
                          "largest equal share, at most 1, with which the run's actors fit in the CPUs available)")
    run.add_argument("--shard-cpus", type=_float, default=None,
                     help="ray engine: CPUs each shard (and shuffler) asks for (default: as --actor-cpus)")
    run.add_argument("--placement", choices=list(PLACEMENTS), default=None,
                     help="ray engine: how the run's placement group lays its actors on the nodes (default: spread); "
                          "none: no group, actors ask for no CPUs and are reused by any later run")
    run.add_argument("--deadline-s", type=_float, default=None,
                     help="ray engine: close each round this many seconds after sending it; a population whose "
                          "messages are not in is late (--late); the record goes to OUT/deadline-record.json and "
                          "replays with --federation replay --federation-option record=PATH")
    run.add_argument("--late", choices=["fold", "drop"], default="fold",
                     help="with --deadline-s: fold a late population's messages into the round they arrive in, "
                          "or drop them")
    run.add_argument("--straggle-share", type=_float, default=0.0,
                     help="ray engine: this fraction of the population actors (seeded) are stragglers")
    run.add_argument("--straggle-s", type=_float, default=0.0,
                     help="ray engine: seconds a straggler's messages take to leave it, every round")
    run.add_argument("--out", type=Path, default=None,
                     help="write the per-round table (OUT/results.parquet) and the summary (OUT/summary.json) "
                          "here; checkpoints go to OUT/checkpoint")
    run.add_argument("--resume", type=Path, default=None, metavar="DIR",
                     help="continue the run whose --out was DIR from its last checkpoint (same options; a "
                          "finished run is not run again)")
    run.add_argument("--checkpoint-every-s", type=_float, default=20.0,
                     help="with --out: write a checkpoint at least this often (seconds; 0 = every round)")
    run.add_argument("--checkpoint-every-rounds", type=_positive_int, default=None,
                     help="with --out: also write a checkpoint every N rounds")
    run.add_argument("--round-timeout", type=_float, default=None,
                     help="ray engine: seconds before a round counts as failed and its frozen actors are "
                          "replaced (default: 10x the slowest recent round, at least 5 s)")
    run.add_argument("--quiet", action="store_true", help="no progress display")
    run.add_argument("--track", action="store_true", help="log the run to MLflow (one run, no parent)")
    run.add_argument("--tracking-uri", default=None,
                     help="with --track: MLflow store (default: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here)")
    run.add_argument("--experiment", default="ldpfed-run", help="with --track: MLflow experiment")
    listing = sub.add_parser("list", help="every algorithm with its paper, privacy model and envs; every env",
                             formatter_class=defaults)
    listing.add_argument("--markdown", action="store_true", help="as a Markdown table (the README's)")
    describe = sub.add_parser("describe", help="an algorithm's options, envs, privacy model and paper; or an env's "
                                               "options, kinds and algorithms; or a trust model's options",
                              formatter_class=defaults)
    describe.add_argument("algorithm", metavar="ALGORITHM|ENV|TRUST", help="a name from `python -m ldpfed list`")
    sweep = sub.add_parser("sweep", help="run a sweep (a preset or a sweep file) and log it to MLflow",
                           formatter_class=ExamplesHelp, epilog=SWEEP_EXAMPLES,
                           description="Run a sweep: algorithms x envs x eps x seeds, from a sweep file (TOML; the "
                                       "keys: ldpfed/sweep_spec.py)\nor a preset shipped with ldpfed; options override "
                                       "the file's keys. Results go to --out/<name> and MLflow.")
    sweep.add_argument("sweep", nargs="?", default="quick", metavar="FILE|PRESET",
                       help=f"a sweep file, or a preset: {_preset_names()}")
    sweeps.add_arguments(sweep)
    ui = sub.add_parser("ui", help="start the MLflow UI on 127.0.0.1 and print the link to the latest sweep",
                        formatter_class=ExamplesHelp, epilog=UI_EXAMPLES,
                        description="Start the MLflow UI on 127.0.0.1 (loopback only) for a local store and print "
                                    "the link to its latest sweep\n(or to the sweep of the results folder given). "
                                    "Ctrl-C stops it.")
    ui.add_argument("store", nargs="?", default=None, metavar="RESULTS_OR_DB",
                    help="a sweep's results folder (its sweep.json names its store), a folder of them (the newest), "
                         "an MLflow SQLite file or a tracking URI (default: MLFLOW_TRACKING_URI, else ./mlflow.db)")
    ui.add_argument("--port", type=_positive_int, default=5000, help="port on 127.0.0.1")
    warmup = sub.add_parser("warmup", help="compile every algorithm's and env's loops ahead, into the compile cache",
                            formatter_class=defaults,
                            description="Compile ahead: run a few users of each algorithm (every registered one by "
                                        "default) on its default env, at round size 1 and in rounds, then each env "
                                        "no algorithm's default covered, so the loops land in the compile cache "
                                        "($LDPFED_CACHE_DIR; docs/architecture.md) and later runs, in any process "
                                        "on this machine, load them instead of compiling. The loops depend on the "
                                        "dimensions: give --env-param (and --param) as your runs will.")
    warmup.add_argument("algorithms", nargs="*", metavar="ALGORITHM",
                        help="names from `python -m ldpfed list` (default: all, and every env)")
    warmup.add_argument("--env", default=None, help="this env for each algorithm (default: the algorithm's own)")
    warmup.add_argument("--param", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                        help="algorithm option (repeatable)")
    warmup.add_argument("--env-param", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                        help="env option (repeatable), e.g. d=10")
    warmup.add_argument("--users", type=_positive_int, default=64, help="users of each warm-up run")
    sync = sub.add_parser("sync", help="upload to MLflow what a sweep's local results hold and MLflow lacks "
                                       "(runs, metrics, artifacts, statuses); idempotent", formatter_class=defaults)
    sync.add_argument("results", type=Path, help="a sweep folder (with sweep.json), or a folder of them")
    sync.add_argument("--tracking-uri", default=None,
                      help="MLflow store (default: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db here)")
    sync.add_argument("--experiment", default=None, help="MLflow experiment (default: the sweep's own)")
    return parser


def trust_options(args) -> dict:
    """--trust-option KEY=VALUE pairs, with the shuffle model's older flags --shufflers and --small-groups as
    aliases of its options (the model validates them all: RunConfig)."""
    given = dict(args.trust_option)
    for key, value in (("shufflers", args.shufflers), ("small_groups", args.small_groups)):
        if value is not None:
            if key in given and given[key] != value:
                raise ConfigError(f"trust_options.{key}", given[key], f"given twice, differently (--{key.replace('_', '-')} "
                                                                      f"{value})")
            given[key] = value
    return given


def _option_name(field: str) -> str:
    if field.startswith("trust_options."):
        return f"--trust-option {field.split('.', 1)[1]}"
    if field.startswith("federation_options."):
        return f"--federation-option {field.split('.', 1)[1]}"
    if field.startswith("params."):
        return f"--param {field.split('.', 1)[1]}"
    if field.startswith("env_params."):
        return f"--env-param {field.split('.', 1)[1]}"
    return OPTION_OF_FIELD.get(field, field)


def cmd_list(markdown: bool = False) -> int:
    from ldpfed.algorithms import REGISTRY

    rows = [{**cls.describe(), "source": REGISTRY.source(name)} for name, cls in REGISTRY.items()]
    if markdown:
        print("| algorithm | privacy | paper | envs (default first) |\n|---|---|---|---|")
        for r in sorted(rows, key=lambda r: (r["paper"], r["algorithm"])):
            envs = [r["default_env"]] + [e for e in r["envs"] if e != r["default_env"]]
            print(f"| `{r['algorithm']}` | {r['privacy_model']} | {r['paper']} | {', '.join(envs)} |")
        return 0
    width = max(len(r["algorithm"]) for r in rows)
    for r in sorted(rows, key=lambda r: (r["paper"], r["algorithm"])):
        plugin = "" if r["source"] == "ldpfed" else f"  [plugin: {r['source']}]"
        print(f"{r['algorithm']:<{width}}  {r['privacy_model']:<7}  {r['paper']}{plugin}\n"
              f"{'':<{width}}  envs: {', '.join(r['envs'])} (default {r['default_env']})")
    print("\n" + "\n".join(_env_listing()))
    print("\ntrust models (--trust NAME; `describe NAME` for its options):")
    for name in sorted(TRUST_MODELS):
        source = TRUST_MODELS.source(name)
        plugin = "" if source == "ldpfed" else f"  [plugin: {source}]"
        print(f"  {name:<{width}}  {TRUST_MODELS[name].about}{plugin}")
    print("\nfederation models (--federation NAME; `describe NAME` for its options):")
    for name in sorted(FEDERATIONS):
        source = FEDERATIONS.source(name)
        plugin = "" if source == "ldpfed" else f"  [plugin: {source}]"
        print(f"  {name:<{width}}  {FEDERATIONS[name].about}{plugin}")
    return 0


def _env_listing() -> list[str]:
    """`list`'s env section: each env, where it comes from, its kinds and the algorithms that run on it."""
    from ldpfed.algorithms import REGISTRY
    from ldpfed.envs import ENVS

    lines = ["envs (python -m ldpfed describe ENV lists an env's options):"]
    width = max(len(name) for name in ENVS)
    for name, env in ENVS.items():
        plugin = "" if ENVS.source(name) == "ldpfed" else f"  [plugin: {ENVS.source(name)}]"
        kinds = f"  (also of kind {', '.join(env.kinds_of()[1:])})" if env.kinds_of()[1:] else ""
        runs = sorted(algo for algo, cls in REGISTRY.items() if cls.runs_on(env))
        lines.append(f"{name:<{width}}  {_first_line(env.__doc__)}{plugin}{kinds}\n"
                     f"{'':<{width}}  algorithms: {', '.join(runs) or 'none (no algorithm lists its kinds)'}")
    return lines


def _first_line(doc) -> str:
    lines = (doc or "").strip().splitlines()
    return lines[0].strip() if lines else ""


def _options(defaults: dict, by_profile: dict, indent: str) -> list[str]:
    """One line per option: name = default, and where a profile changes the default, its value."""
    if not defaults:
        return [f"{indent}(no options)"]
    width = max(len(k) for k in defaults)
    lines = []
    for key, value in defaults.items():
        changed = [f"{profile}: {values[key]!r}" for profile, values in by_profile.items() if key in values]
        lines.append(f"{indent}{key:<{width}} = {value!r}" + (f"   ({'; '.join(changed)})" if changed else ""))
    return lines


def _option_lines(cls) -> list[str]:
    """Per option: name = default (a profile's default where it differs), what values it accepts, what it does."""
    rows = cls.option_table()
    if not rows:
        return ["  (no options)"]
    width = max(len(row["name"]) for row in rows)
    lines = []
    for row in rows:
        changed = [f"{profile}: {value!r}" for profile, value in row["profiles"].items()]
        lines.append(f"  {row['name']:<{width}} = {row['default']!r}" + (f"   ({'; '.join(changed)})" if changed else "")
                     + (f"   [{row['accepts']}]" if row["kind"] != "any" else ""))
        if row["doc"]:
            lines.append(f"  {'':<{width}}   {row['doc']}")
    return lines


def _describe_trust(name: str) -> int:
    """A trust model: what it does, where it comes from, where the noise goes, what the server sees, its options."""
    cls = TRUST_MODELS[name]
    source = TRUST_MODELS.source(name)
    lines = [f"{name} (trust model): {cls.about or (cls.__doc__ or '').strip().splitlines()[0]}",
             f"provided by:    {source}" + (" (built in)" if source == "ldpfed" else " (plugin)"),
             f"noise added at: {cls.noise_at}",
             f"server sees:    {cls.server_view}",
             "options (--trust-option KEY=VALUE; a sweep file's [trust_options]):"]
    print("\n".join([*lines, *_option_lines(cls)]))
    return 0


def _describe_federation(name: str) -> int:
    """A federation model: what it does, where it comes from, its options."""
    cls = FEDERATIONS[name]
    source = FEDERATIONS.source(name)
    lines = [f"{name} (federation model): {cls.about or (cls.__doc__ or '').strip().splitlines()[0]}",
             f"provided by:    {source}" + (" (built in)" if source == "ldpfed" else " (plugin)"),
             "options (--federation-option KEY=VALUE; a sweep file's [federation_options]):"]
    print("\n".join([*lines, *_option_lines(cls)]))
    return 0


def cmd_describe_env(name: str) -> int:
    """`describe ENV`: the env's options (--env-param) with their defaults, what they accept and what they do, its
    kinds and the algorithms that run on it."""
    from ldpfed.algorithms import REGISTRY
    from ldpfed.envs import ENVS

    env = ENVS[name]
    source = ENVS.source(name)
    lines = [f"{name}: {_first_line(env.__doc__)}" if _first_line(env.__doc__) else name,
             f"provided by:    {source}" + (" (built in)" if source == "ldpfed" else " (plugin)"),
             f"kinds:          {', '.join(env.kinds_of())}",
             f"algorithms:     {', '.join(sorted(a for a, cls in REGISTRY.items() if cls.runs_on(env))) or 'none'}",
             f"varies:         {env.varies or 'nothing (Env.varied: the heterogeneous federation model runs it at spread 0 only)'}",
             "options (--env-param KEY=VALUE; default, and the authors-code profile's where it differs):",
             *_option_lines(env)]
    print("\n".join(lines))
    return 0


def cmd_describe(name: str) -> int:
    from ldpfed.algorithms import REGISTRY
    from ldpfed.envs import ENVS

    if name not in REGISTRY and name in ENVS:
        return cmd_describe_env(name)
    if name not in REGISTRY and name in TRUST_MODELS:
        return _describe_trust(name)
    if name in FEDERATIONS and name not in REGISTRY:
        return _describe_federation(name)
    if name not in REGISTRY:
        raise ConfigError("algorithm", name, f"unknown algorithm or env{did_you_mean(name, [*REGISTRY, *ENVS])}; "
                                             f"choose from {sorted(REGISTRY)} or the envs {sorted(ENVS)}")
    cls = REGISTRY[name]
    doc = (cls.__doc__ or "").strip().splitlines()
    lines = [f"{name}: {doc[0]}" if doc else name,
             f"paper:          {cls.paper}",
             f"provided by:    {REGISTRY.source(name)}" + (" (built in)" if REGISTRY.source(name) == "ldpfed" else
                                                          " (plugin)"),
             f"privacy model:  {cls.privacy_model}" + ("" if cls.privacy_model != "none" else
                                                       " (not private: --eps and --delta play no part)"),
             "options (--param KEY=VALUE; default, and the authors-code profile's where it differs):",
             *_option_lines(cls),
             f"envs (--env; default {cls.default_env}):"]
    setting = dict(cls.paper_setting)
    for env in cls.envs():
        env_cls = ENVS[env]
        paper = setting.get("env_params", {}) if env == cls.default_env else {}
        lines.append(f"  {env}" + (f"   (paper setting: {paper})" if paper else "") + "   --env-param KEY=VALUE "
                     f"(python -m ldpfed describe {env}: what each accepts):")
        lines += _options(dict(env_cls.defaults), dict(getattr(env_cls, "profile_defaults", {}) or {}), "    ")
    if setting:
        rest = {k: v for k, v in setting.items() if k != "env_params"}
        lines.append(f"paper setting (jobs/run_all.py): {rest}")
    print("\n".join(lines))
    return 0


def _warmup_plan(names: list, env: str | None) -> list[tuple[str, str]]:
    """(algorithm, env) pairs: each algorithm on `env` or its default env; with no names, every algorithm, then
    each env that no default covered, with the first algorithm that runs on it."""
    from ldpfed.algorithms import REGISTRY
    from ldpfed.envs import ENVS

    for name in names:
        if name not in REGISTRY:
            raise ConfigError("algorithm", name, f"unknown; choose from {sorted(REGISTRY)}")
    plan = [(name, env or REGISTRY[name].default_env) for name in names or sorted(REGISTRY)]
    if not names and env is None:
        covered = {e for _, e in plan}
        for kind in sorted(ENVS):
            runs_it = [name for name in sorted(REGISTRY) if REGISTRY[name].runs_on(kind) and name != "uniform"]
            if kind not in covered and runs_it:
                plan.append((runs_it[0], kind))
    return plan


def cmd_warmup(args) -> int:
    """Compile ahead (see the warmup parser's description); prints each pair's time and what it compiled."""
    import time

    from ldpfed.config import RunConfig
    from ldpfed.engine import run
    from ldpfed.util import jit

    directory = jit.cache_dir()
    print(f"compile cache: {directory if directory is not None else f'off (${jit.CACHE_ENV})'}")
    failed, started, compiled_before = 0, time.perf_counter(), jit.compile_seconds()
    for algorithm, env in _warmup_plan(list(args.algorithms), args.env):
        wall, compile_s, before = time.perf_counter(), jit.compile_seconds(), jit.loop_counts()
        try:
            for round_size in (1, max(2, args.users // 4)):      # the sequential engine's loop; the round loops
                run(RunConfig(algorithm=algorithm, env=env, users=args.users, round_size=round_size,
                              params=dict(args.param), env_params=dict(args.env_param)))
        except Exception as error:      # one that cannot run this way does not stop the others
            failed += 1
            print(f"{algorithm:<20} {env:<20} failed: {type(error).__name__}: {error}", flush=True)
            continue
        after = jit.loop_counts()
        print(f"{algorithm:<20} {env:<20} {time.perf_counter() - wall:6.1f} s "
              f"({jit.compile_seconds() - compile_s:.1f} s in numba's compiler): "
              f"{after['compiled'] - before['compiled']} loops compiled, "
              f"{after['loaded'] - before['loaded']} loaded from the cache", flush=True)
    print(f"warmup: {time.perf_counter() - started:.1f} s, {jit.compile_seconds() - compiled_before:.1f} s in numba's "
          f"compiler{f'; {failed} failed' if failed else ''}")
    return 1 if failed else 0


PATHS = ("auto", "sequential", "rounds")
# The Ray engine's rounds per second at one user a round, for the warning below: ~58 measured with 2 actors on a
# 2-core machine (docs/scaling.md models a round's cost); a round is a few Ray calls, whatever its size.
RAY_ROUNDS_PER_S = 60.0
SLOW_RUN_S = 120.0


def local_path(config, engine: str, path: str) -> bool:
    """engine.run's `fast`: whether the local engine may take the compiled sequential loop. --path sequential where
    that loop cannot run is an error before any work, naming why."""
    if path == "auto":
        return True
    if engine != "local":
        raise ConfigError("path", path, "picks the local engine's loop (the Ray engine runs rounds)")
    if path == "rounds":
        return False
    from ldpfed.engine.sequential import sequential_unsupported

    why = sequential_unsupported(config)
    if why is not None:
        raise ConfigError("path", path, f"the sequential loop cannot run this: {why}")
    return True


def warn_slow_rounds(config) -> None:
    """Before a Ray run of many small rounds starts: how long it will take, and what to use instead."""
    estimate = config.rounds / RAY_ROUNDS_PER_S
    if estimate < SLOW_RUN_S:
        return
    print(f"warning: {config.rounds:,} rounds of {config.round_size} user(s) on the Ray engine: about "
          f"{estimate / 60:,.0f} min at ~{RAY_ROUNDS_PER_S:.0f} rounds/s (a round costs a few Ray calls however "
          f"small). The local engine runs round size 1 in one compiled loop (--engine local, ~1e5 users/s or more); "
          f"on Ray, batch the users (--round-size {max(2, config.users // 1000)} gives about 1,000 rounds).",
          file=sys.stderr, flush=True)


def cmd_run(args) -> int:
    from ldpfed.config import RunConfig
    from ldpfed.util.progress import Progress

    config = RunConfig(algorithm=args.algorithm, env=args.env, users=args.users, round_size=args.round_size,
                       populations=args.populations, eps=args.eps, delta=args.delta, seed=args.seed,
                       params=dict(args.param), env_params=dict(args.env_param), profile=args.profile,
                       trust=args.trust, trust_options=trust_options(args), federation=args.federation,
                       federation_options=dict(args.federation_option))
    fast = local_path(config, args.engine, args.path)      # like every option error: before any work
    if args.engine == "ray":
        warn_slow_rounds(config)
    from ldpfed.engine import run
    from ldpfed.engine.checkpoint import Checkpointer, CheckpointError
    from ldpfed.util.signals import Terminated, exit_status, interruptible

    if args.resume is not None:
        if args.out is not None and args.out.resolve() != args.resume.resolve():
            raise ConfigError("out", str(args.out), f"--resume {args.resume} writes there; give one of them")
        if not args.resume.is_dir():
            raise ConfigError("resume", str(args.resume), "no such folder (the --out of the run to continue)")
        args.out = args.resume
        if (args.out / "results.parquet").exists() and (args.out / "summary.json").exists():
            print(f"{args.out}: this run is finished (results.parquet, summary.json); nothing to do")
            return 0
    checkpointer = None
    if args.out is not None:    # before any simulation: an unwritable --out fails now, not after the run
        try:
            args.out.mkdir(parents=True, exist_ok=True)
            checkpointer = Checkpointer(args.out / "checkpoint", every_rounds=args.checkpoint_every_rounds,
                                        every_s=args.checkpoint_every_s)
            checkpointer.check_writable()
        except (OSError, CheckpointError) as error:
            raise ConfigError("out", str(args.out), f"cannot write there ({error})") from None
    tracker = None
    if args.track:    # fail fast: the store is checked before anyone is simulated, not after the run
        from ldpfed.tracking import Tracker

        tracker = Tracker(experiment=args.experiment, tracking_uri=args.tracking_uri, out_dir=args.out)
    progress = None if args.quiet else Progress(config.users, label=config.algorithm)
    options = {"actors": args.actors, "shards": args.shards, "mode": args.mode} if args.engine == "ray" else {}
    if args.engine == "ray" and args.round_timeout is not None:
        options["round_timeout"] = args.round_timeout
    if args.engine == "ray" and args.group_size is not None:
        options["group_size"] = args.group_size
    if args.engine == "ray" and args.transport is not None:
        options["transport"] = args.transport
    if args.engine == "ray":
        options.update({name: getattr(args, name) for name in ("actor_cpus", "shard_cpus", "placement")
                        if getattr(args, name) is not None})
        if args.straggle_share or args.straggle_s:
            options.update(straggle_share=args.straggle_share, straggle_s=args.straggle_s)
    if args.deadline_s is not None:
        if args.engine != "ray":
            raise ConfigError("deadline_s", args.deadline_s, "closes rounds of the ray engine: give --engine ray")
        options.update(deadline_s=args.deadline_s, late=args.late, mode="pre-aggregated", transport="ray",
                       group_size=1)
        if args.out is not None:
            options["deadline_record"] = str(args.out / "deadline-record.json")
        checkpointer = None       # a deadline run is replayed from its record, not resumed
    try:
        with interruptible():
            result = run(config, engine=args.engine, progress=progress, checkpointer=checkpointer, fast=fast,
                         **options)
    except CheckpointError as error:
        raise ConfigError("resume", str(args.out), str(error)) from None
    except KeyboardInterrupt as error:
        why = "terminated (SIGTERM)" if isinstance(error, Terminated) else "interrupted"
        if checkpointer is not None and checkpointer.path.exists():
            print(f"\n{why}; checkpoint in {checkpointer.path}. Continue with the same options and "
                  f"--resume {args.out}", file=sys.stderr)
        else:
            print(f"\n{why}; nothing saved (give --out DIR to keep checkpoints)", file=sys.stderr)
        return exit_status(error)
    s = result.summary
    if args.out is not None:      # the local copy first: an MLflow failure below loses nothing
        from ldpfed.tracking import records

        records.write_parquet(args.out / "results.parquet", result.table)
        records.write_json(args.out / "summary.json", {**s, "ledger": result.ledger})
        if checkpointer is not None:          # finished: results.parquet says so; the checkpoint is spent
            checkpointer.path.unlink(missing_ok=True)
            try:
                checkpointer.directory.rmdir()
            except OSError:
                pass
    if tracker is not None:
        try:
            run_id = tracker.log_run(result)     # its files under the tracker's folder first, then MLflow
        except TrackingUnavailable:
            saved = [str(args.out)] if args.out is not None else []
            print(f"the run finished, but MLflow failed while logging it; its results are in "
                  f"{' and '.join(saved + [str(tracker.out_dir / 'runs')])}", file=sys.stderr)
            raise
    error = s.get("final_estimation_error")
    print(f"{config.algorithm} on {config.env}: T={config.users:,} B={config.round_size} eps={config.eps} "
          f"delta={config.delta} seed={config.seed} profile={config.profile}")
    print(f"final cumulative regret: {s['final_regret']:.2f}  ({s['final_regret'] / config.users:.4f} per user)")
    if error is not None:
        print(f"final estimation error: {error:.4f}")
    if s.get("round_size_caveat"):
        print(f"note: {config.algorithm}: {s['round_size_caveat']}")
    described = trust_model(config).describe(s, config)
    if described:
        print(described)
    if "total_users_served" in s:
        print(f"federation ({config.federation}): {s['total_users_served']:,.0f} of {config.users:,} users took part")
    if "total_late_folded" in s:
        print(f"late messages: {s['total_users_late']:,.0f} ({s['total_late_folded']:,.0f} folded in a later round, "
              f"{s.get('late_messages_never_folded', 0):,.0f} due after the last round, "
              f"{s['total_late_rejected']:,.0f} rejected)")
    if "total_users_lost" in s:
        print(f"lost messages: {s['total_users_lost']:,.0f} (their users acted; their messages never reached the server)")
    print(f"{s['users_per_s']:,.0f} users/s ({s['engine']}; numba's compile, {s.get('compile_s', 0.0):.2f} s, "
          f"not counted)")
    if tracker is not None:
        print(f"MLflow: run {run_id} in experiment {args.experiment!r} at {tracker.display_uri}")
        if tracker.ui_command():
            print(f"Open the UI:  {tracker.ui_command()}")
        print(f"This run:     {tracker.run_url(run_id)}")
    return 0


def main(argv=None) -> int:
    try:
        parser = build_parser()
    except (ConfigError, PluginError) as error:   # before any command runs: one line, status 2
        print(f"python -m ldpfed: error: {error}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            return cmd_list(args.markdown)
        if args.command == "describe":
            return cmd_describe(args.algorithm)
        if args.command == "sweep":
            from ldpfed.sweep_runner import Job, main as run_sweep

            job = Job(name="ldpfed sweep", command="python -m ldpfed sweep",
                      rerun="python -m ldpfed sweep sweep.toml")
            return run_sweep(parser, args, args.sweep, job)
        if args.command == "ui":
            from ldpfed.tracking.ui import serve

            return serve(args.store, args.port)
        if args.command == "warmup":
            return cmd_warmup(args)
        if args.command == "sync":
            from ldpfed.tracking.sync import sync

            try:
                reports = sync(args.results, tracking_uri=args.tracking_uri, experiment=args.experiment)
            except FileNotFoundError as error:
                parser.exit(2, f"{parser.prog}: error: {error}\n")
            return 1 if any(r.skipped for r in reports) else 0
        return cmd_run(args)
    except TrackingUnavailable as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    except PluginError as error:        # names the plugin (entry point or reference), its package and the field
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    except ConfigError as error:
        parser.exit(2, f"{parser.prog}: error: {_option_name(error.field)}: {error.value!r}: {error.reason}\n")
    except BrokenPipeError:             # `python -m ldpfed list | head`: the reader stopped reading
        sys.stderr.close()
        return 0

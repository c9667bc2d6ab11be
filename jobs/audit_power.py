"""The privacy audit's power: how often it flags a mechanism that draws less noise than its claim, against the
ratio of the noise drawn to the noise claimed, for every mechanism kind ldpfed ships and for a plugin's own
mechanism (ldpfed.mechanisms.audit.audit_mechanism, the audit the conformance kit runs on every mechanism of an LDP
algorithm; and the kit itself, check_algorithm's "privacy_audit", on a plugin algorithm).

A case at ratio r keeps the claim (guarantee and dp_event) of a correctly calibrated mechanism and draws from one
with r times its privacy loss: Gaussian and Laplace noise and tree nodes divided by r; randomized response and the
l2-ball, which have no noise scale, built for r eps. Every case is audited on `--seeds` seeds at the kit's confidence
(alpha = ldpfed.testing.AUDIT_ALPHA) and default budget; claims are the kit's defaults (eps = 1; delta = 0.01 for
the Gaussian kinds).

    python jobs/audit_power.py [--seeds 100] [--ratios 1,1.1,1.25,1.5,2,3] [--kinds gaussian,...]
                               [--plot docs/audit_power.png] [--csv FILE] [--kit-times]

Prints the table of detection rates (with one-sided 95% Clopper-Pearson bounds) and the seconds per audit;
--kit-times also times check_algorithm's "privacy_audit" on every LDP algorithm registered (each env it runs on,
its second run: compiled code warm). tests/test_audit_power.py asserts on the same cases.
"""
from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
from scipy import special

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ldpfed.mechanisms as M  # noqa: E402
from ldpfed.mechanisms import audit  # noqa: E402
from ldpfed.mechanisms.domains import Domain, gaussian_tail_z  # noqa: E402

EPS, DELTA = 1.0, 0.01          # the kit's defaults (check_algorithm)
T = 15                          # tree horizon: depth 4, the first element lands in 4 nodes
KINDS = ("gaussian", "symmetric-gaussian", "laplace", "l2-ball", "randomized-response", "tree-gaussian",
         "tree-laplace", "plugin", "plugin-kit")
RATIOS = (1.0, 1.1, 1.25, 1.5, 2.0, 3.0)


class PluginGaussian:
    """A plugin's own mechanism, written from scratch (no ldpfed class): its dp_event declares Gaussian noise of
    std `std` (the classic calibration of its guarantee) and it draws std / ratio."""

    def __init__(self, sensitivity, eps, delta, ratio=1.0):
        self.std = sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / eps
        self.ratio = float(ratio)
        self.guarantee = M.Guarantee("plugin-gaussian", "ldp", float(eps), float(delta), float(sensitivity), "l2")

    def privatize(self, x, rng):
        x = np.asarray(x, dtype=float)
        return x + (self.std / self.ratio) * rng.standard_normal(x.shape)

    def output_domain(self, shape, data_bound=None, **schedule):
        z = gaussian_tail_z(int(np.prod(shape, dtype=np.int64)))
        return Domain(tuple(shape), low=-np.asarray(data_bound), high=data_bound, noise=("gaussian", self.std, z),
                      source="plugin gaussian", **schedule)

    def dp_event(self):
        return {"noise": "gaussian", "noise_std": float(self.std), "nodes": 1}


def _weaker(make_claimed, make_actual, ratio):
    return audit.Declared(make_claimed(), make_actual(ratio))


def _tree(shape, ratio, noise):
    def build(scale_by):
        kwargs = dict(eps=EPS, sensitivity=1.0, noise=noise, delta=DELTA if noise == "gaussian" else 0.0)
        tree = M.TreeMechanism(T, shape, **kwargs)
        tree.node_scale /= scale_by              # privatize draws fresh nodes of this scale
        return tree

    return audit.Declared(build(1.0), build(ratio))


def mechanism_case(kind: str, ratio: float, seed: int, alpha: float, **options) -> audit.MechanismAudit:
    """The audit of one planted case (kind, ratio) on one seed."""
    if kind == "gaussian":
        def gaussian(r):
            mech = M.GaussianMechanism(1.0, EPS, DELTA)
            mech.sigma /= r
            return mech
        return audit.audit_mechanism(_weaker(lambda: gaussian(1.0), gaussian, ratio), np.zeros(3), alpha=alpha,
                                     seed=seed, **options)
    if kind == "symmetric-gaussian":
        def symmetric(r):
            mech = M.SymmetricGaussianMechanism(1.0, EPS, DELTA)
            mech.sigma /= r
            return mech
        return audit.audit_mechanism(_weaker(lambda: symmetric(1.0), symmetric, ratio), np.zeros((3, 3)),
                                     alpha=alpha, seed=seed, **options)
    if kind == "laplace":
        mech = _weaker(lambda: M.LaplaceMechanism(1.0, EPS), lambda r: M.LaplaceMechanism(1.0, EPS * r), ratio)
        return audit.audit_mechanism(mech, np.zeros(3), alpha=alpha, seed=seed, **options)
    if kind == "l2-ball":
        mech = _weaker(lambda: M.L2BallMechanism(1.0, EPS, 5), lambda r: M.L2BallMechanism(1.0, EPS * r, 5), ratio)
        return audit.audit_mechanism(mech, np.zeros(5), alpha=alpha, seed=seed, **options)
    if kind == "randomized-response":
        mech = _weaker(lambda: M.RandomizedResponse(EPS), lambda r: M.RandomizedResponse(EPS * r), ratio)
        return audit.audit_mechanism(mech, np.zeros(5), alpha=alpha, seed=seed, **options)
    if kind in ("tree-gaussian", "tree-laplace"):
        noise = kind.removeprefix("tree-")
        return audit.audit_stream(lambda shape: _tree(shape, ratio, noise), np.zeros((T, 1)), alpha=alpha,
                                  seed=seed, **options)
    if kind == "plugin":
        return audit.audit_mechanism(PluginGaussian(1.0, EPS, DELTA, ratio), np.zeros(3), alpha=alpha, seed=seed,
                                     **options)
    raise ValueError(f"unknown kind {kind!r}")


def plugin_algorithm(ratio: float):
    """A plugin algorithm (LDP, one private field) whose mechanism is PluginGaussian at this ratio: what the kit
    sees of a plugin. Each user sends its arm (public, round-robin) and its reward clipped to the public bound."""
    from ldpfed.algorithms import Algorithm

    class PluginAlgorithm(Algorithm):
        name = f"plugin-gaussian-{round(ratio * 100)}"
        privacy_model = "ldp"
        env_kinds = ("bernoulli",)
        default_env = "bernoulli"
        public_fields = frozenset({"arm"})

        def setup(self):
            self.c_r = float(self.world.reward_bound)
            self.mechanisms["reward"] = PluginGaussian(2 * self.c_r, self.eps, self.delta, ratio)

        def initial_state(self, rng):
            return {"arm": np.zeros(()), "reward": np.zeros(())}

        def update(self, state, sums, start, stop, rng):
            return {key: state[key] + sums.get(key, 0.0) for key in state}

        def act(self, model, contexts, users, rng):
            return np.asarray(users, dtype=np.int64) % self.K

        def message_spec(self):
            return {"arm": (), "reward": ()}

        def message_domains(self):
            return {"arm": Domain((), low=0, high=self.K - 1, integral=True, source="public arm"),
                    "reward": self.mechanisms["reward"].output_domain((), self.c_r)}

        def encode(self, model, contexts, actions, rewards, users, rng):
            reward = np.clip(np.asarray(rewards, dtype=float), -self.c_r, self.c_r)
            return {"arm": np.asarray(actions, dtype=np.int64),
                    "reward": self.mechanisms["reward"].privatize(reward, rng)}, {}

    return PluginAlgorithm


def kit_case(ratio: float, seed: int) -> bool:
    """Does check_algorithm's privacy audit flag the plugin algorithm at this ratio (its config seed = seed)?"""
    from ldpfed.testing import ConformanceError, check_algorithm

    try:
        check_algorithm(plugin_algorithm(ratio), eps=EPS, delta=DELTA, seed=seed, ray=False,
                        checks=["privacy_audit"])
    except ConformanceError as error:
        if error.check != "privacy_audit":
            raise
        return True
    return False


def flagged(kind: str, ratio: float, seed: int, alpha: float) -> bool:
    if kind == "plugin-kit":
        return kit_case(ratio, seed)
    return mechanism_case(kind, ratio, seed, alpha).flagged


def cp_bounds(k: int, n: int, level=0.95) -> tuple[float, float]:
    """One-sided (level) Clopper-Pearson lower and upper bounds on a rate seen k times in n."""
    lo = 0.0 if k == 0 else float(special.betaincinv(k, n - k + 1, 1 - level))
    hi = 1.0 if k == n else float(special.betaincinv(k + 1, n - k, level))
    return lo, hi


def main(argv=None):
    from ldpfed.testing import AUDIT_ALPHA

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--ratios", default=",".join(f"{r:g}" for r in RATIOS))
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--plot", default=None, help="write the power curves to this PNG")
    parser.add_argument("--csv", default=None, help="write the table to this CSV")
    parser.add_argument("--kit-times", action="store_true", help="time the kit's privacy audit on every LDP algorithm")
    args = parser.parse_args(argv)
    ratios = [float(r) for r in args.ratios.split(",")]
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = set(kinds) - set(KINDS)
    if unknown:
        parser.error(f"unknown kinds {sorted(unknown)}; choose from {list(KINDS)}")
    started = datetime.datetime.now().astimezone()
    print(f"# audit power: {args.seeds} seeds, alpha = {AUDIT_ALPHA:g}, design point 1/{audit.POWER_RATIO:g} at "
          f"power {audit.POWER:g}, budget {audit.MIN_N:,}-{audit.MAX_N:,} samples per input")
    print(f"# {started:%Y-%m-%d %H:%M %Z}, {platform.node()}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cpus, python {platform.python_version()}, numpy {np.__version__}")
    rows = []
    for kind in kinds:
        for ratio in ratios:
            t0 = time.perf_counter()
            hits = sum(flagged(kind, ratio, seed, AUDIT_ALPHA) for seed in range(args.seeds))
            seconds = (time.perf_counter() - t0) / args.seeds
            lo, hi = cp_bounds(hits, args.seeds)
            rows.append((kind, ratio, hits, args.seeds, lo, hi, seconds))
            print(f"{kind:20s} noise 1/{ratio:<5g} flagged {hits:4d}/{args.seeds} = {hits / args.seeds:.3f} "
                  f"(95% bounds {lo:.3f}-{hi:.3f}), {seconds:.2f} s per audit", flush=True)
    if kinds:
        print()
        print("| mechanism | " + " | ".join(f"noise 1/{r:g}" for r in ratios) + " | s per audit |")
        print("|---|" + "---:|" * (len(ratios) + 1))
    for kind in kinds:
        mine = [row for row in rows if row[0] == kind]
        print(f"| {kind} | " + " | ".join(f"{row[2]}/{row[3]}" for row in mine)
              + f" | {max(row[6] for row in mine):.2f} |")
    if args.csv:
        import csv

        with open(args.csv, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["kind", "ratio", "flagged", "seeds", "lower95", "upper95", "seconds"])
            writer.writerows(rows)
    if args.plot and kinds:
        plot(rows, kinds, args.plot, args.seeds, AUDIT_ALPHA)
    if args.kit_times:
        kit_times()
    print(f"# finished after {(datetime.datetime.now().astimezone() - started).total_seconds():.0f} s")


def kit_times():
    """Seconds of check_algorithm(name, env, checks=["privacy_audit"]) for every LDP algorithm and env, warm."""
    from ldpfed.algorithms import REGISTRY
    from ldpfed.testing import check_algorithm

    print("\n| algorithm | env | privacy_audit s |")
    print("|---|---|---:|")
    worst = 0.0
    for name in sorted(n for n in REGISTRY if REGISTRY[n].privacy_model == "ldp"):
        for env in REGISTRY[name].envs():
            check_algorithm(name, env, ray=False, checks=["privacy_audit"])           # compiles
            t0 = time.perf_counter()
            check_algorithm(name, env, ray=False, checks=["privacy_audit"])
            seconds = time.perf_counter() - t0
            worst = max(worst, seconds)
            print(f"| {name} | {env} | {seconds:.2f} |", flush=True)
    print(f"# the kit's privacy audit: at most {worst:.2f} s per algorithm and env")


def plot(rows, kinds, path, seeds, alpha):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for kind in kinds:
        mine = [row for row in rows if row[0] == kind]
        ax.plot([row[1] for row in mine], [row[2] / row[3] for row in mine], marker="o", label=kind)
    ax.axhline(audit.POWER, color="grey", linestyle="--", linewidth=0.8)
    ax.axvline(audit.POWER_RATIO, color="grey", linestyle=":", linewidth=0.8)
    ax.set_xscale("log")
    ratios = sorted({row[1] for row in rows})
    ax.set_xticks(ratios)
    ax.set_xticklabels([f"1/{r:g}" for r in ratios])
    ax.minorticks_off()
    ax.set_xlabel("noise drawn / noise claimed (log scale)")
    ax.set_ylabel(f"detection rate ({seeds} seeds)")
    ax.set_title(f"privacy audit power (alpha = {alpha:g}, eps = {EPS:g})")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"# plot: {path}")


if __name__ == "__main__":
    main()

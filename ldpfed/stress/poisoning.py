"""Poisoning within the domain: how far a fraction of attacking users moves a run, every message accepted.

A fraction f of the users (a fixed random set, nested as f grows) send valid-looking messages chosen to pull the
estimate one way (`ldpfed.stress.attacks.IN_DOMAIN_ATTACKS`: ldp-sgd: every l2-ball output the same point of the sphere;
ldp-ols: u at the Gaussian tail bound of every coordinate, one sign; sw-klucb-cf: feedback 1 exactly when the
pulled arm is the worst arm). Every message goes through a shard's per-user domain check (in process) and must be
ACCEPTED: LDP protocols are manipulable within the domain. Reported per f: how far the final estimate moved from
the honest run's (same seeds), its error, the cumulative regret and its ratio to the honest run.
"""
from __future__ import annotations

import numpy as np

from ldpfed.stress.attacks import poisoned_run

# The papers' settings (seed 000: d = 2, K = 10; seed 004: K = 5, 4 breakpoints). sw-klucb-cf runs rounds of 10
# users: with rounds of 100 its window (348 users at T = 1e5) holds only a few rounds, arms with no pull in the window
# get the largest index, and the arms are played in turn whatever the feedback says (nothing to poison).
IN_DOMAIN = {"ldp-sgd": {"env_params": {"d": 2, "K": 10}}, "ldp-ols": {"env_params": {"d": 2, "K": 10}},
             "sw-klucb-cf": {"env_params": {"K": 5, "breakpoints": 4}, "round_size": 10}}


def run_in_domain(algorithms=tuple(IN_DOMAIN), fractions=(0.001, 0.003, 0.01, 0.03, 0.1), users=100_000,
                  round_size=100, seeds=(0, 1, 2), log=print, trust="local", boost=1.0):
    """Per algorithm and fraction f: runs with f of the users poisoning within the domain (the same seeds as the
    honest runs, f = 0), every message checked and accepted by a shard (per-user mode, in process); figures are
    means over the seeds. trust: the run's trust model (under "secagg" the attack adds `boost` times the largest
    pull a central shard lets through to the attacker's masked message: ldpfed.stress.attacks.masked_shift). Returns (ok, rows), ok iff no poisoned message was rejected (they are all in the domain)."""
    rows, ok = [], True
    for algorithm in algorithms:
        setting = dict(IN_DOMAIN.get(algorithm, {}))
        size = setting.pop("round_size", round_size)
        honest = {}
        for f in (0.0, *fractions):
            runs = []
            for seed in seeds:
                run = poisoned_run(algorithm, f, users, size, seed, boost=boost, trust=trust, **setting)
                if not run["ok"]:
                    log(f"FAIL: {algorithm} f={f} seed {seed}: round {run['round']} rejected: {run['reasons']}")
                ok = ok and run["ok"]
                if f == 0.0:
                    honest[seed] = run
                runs.append(run)
            rows.append(_row(algorithm, f, users, seeds, runs, honest))
            _log_row(log, rows[-1], users, seeds)
    return ok, rows


def _row(algorithm, f, users, seeds, runs, honest) -> dict:
    has_estimate = runs[0]["estimate"] is not None
    mean = lambda key: float(np.mean([run[key] for run in runs]))   # noqa: E731
    return {"algorithm": algorithm, "fraction": f, "attackers": runs[0]["attackers"], "users": users,
            "round_size": runs[0]["round_size"],
            "seeds": len(seeds), "regret": mean("regret"),
            "regret_ratio": mean("regret") / float(np.mean([honest[s]["regret"] for s in seeds])),
            "estimation_error": mean("error") if has_estimate else None,
            "estimate_shift": float(np.mean([np.linalg.norm(run["estimate"] - honest[s]["estimate"])
                                             for run, s in zip(runs, seeds)])) if has_estimate else None,
            "rejected": sum(run["rejected"] for run in runs)}


def _log_row(log, row, users, seeds) -> None:
    log(f"{row['algorithm']} f={100 * row['fraction']:g}% ({row['attackers']} of {users} users, {len(seeds)} seeds): "
        f"regret {row['regret']:,.1f} (x{row['regret_ratio']:.2f})" + (
            "" if row["estimate_shift"] is None else
            f", estimate moved {row['estimate_shift']:.3f}, error {row['estimation_error']:.3f}") +
        f"; poisoned messages rejected: {row['rejected']}")


def plot_in_domain(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for algorithm in dict.fromkeys(r["algorithm"] for r in rows):
        mine = [r for r in rows if r["algorithm"] == algorithm and r["fraction"] > 0]
        f = [100 * r["fraction"] for r in mine]
        axes[0].plot(f, [r["regret_ratio"] for r in mine], marker="o", label=algorithm)
        if mine[0]["estimate_shift"] is not None:
            axes[1].plot(f, [r["estimate_shift"] for r in mine], marker="o", label=algorithm)
    axes[0].set(xscale="log", xlabel="poisoning users (%)", ylabel="regret / honest regret",
                title="regret under in-domain poisoning")
    axes[1].set(xscale="log", xlabel="poisoning users (%)", ylabel="||estimate - honest estimate||",
                title="estimate moved")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

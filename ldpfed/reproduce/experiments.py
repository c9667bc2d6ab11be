"""Running a paper's experiments, or the price of batching: the simulations (one MLflow sweep each), then their
tables (claims, slopes, support, batching) and plots under the sweep's local folder."""
from __future__ import annotations

import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd

from ldpfed.reproduce.claims import claim_rows
from ldpfed.reproduce.papers import (BATCH_ALGORITHMS, BATCH_OTHERS, BATCH_SIZES, PAPERS, jobs_for, make_config,
                                     row_of, simulate)
from ldpfed.reproduce.stats import batching_markdown, markdown, slope_table
from ldpfed.tracking import metric_curves, plots


def quartile_plot(runs: pd.DataFrame, x: str, xlabel: str, title: str, path: Path,
                  ylabel: str = "final cumulative regret (median, 25-75%)") -> Path:
    """Median final regret against `x` per algorithm, with 25-75% bars, on log-log axes."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    for algorithm, group in runs.groupby("algorithm"):
        stats = group.groupby(x)["final_regret"].quantile([0.25, 0.5, 0.75]).unstack()
        ax.errorbar(stats.index.to_numpy(dtype=float), stats[0.5],
                    yerr=[stats[0.5] - stats[0.25], stats[0.75] - stats[0.5]], marker="o", capsize=3, label=algorithm)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(runs: pd.DataFrame, curves: dict, folder: Path, title: str) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    main = runs[runs["part"] == "main"].copy()
    written = []
    if len(main):
        main["env"] = main["label"] + " [" + main["profile"] + "]"
        path = plots.regret_curves(curves, main, folder / "regret_curves.png", f"Cumulative regret: {title}")
        written += [p for p in [path] if p]
        path = plots.final_vs_eps(main[main["algorithm"] != "uniform"], "final_regret",
                                  folder / "final_regret_vs_eps.png", f"Final regret against eps: {title}",
                                  "final cumulative regret")
        written += [p for p in [path] if p]
    slope = runs[runs["part"] == "slope"]
    if len(slope):
        quartile_plot(slope, "users", "T (users)", f"Regret against T (eps = 1): {title}", folder / "slopes.png")
        written.append(folder / "slopes.png")
    return written


def reproduce_paper(paper_id: str, preset: dict, tracker, command: str, quick: bool = False, workers: int = 1,
                    papers: Path | None = None) -> Path:
    """Run a paper's simulations (one MLflow sweep), then write its claims table, slopes, support grid and plots
    (papers: where the papers' text is, to check the claims' quotes). Returns the local results folder."""
    paper = PAPERS[paper_id]
    jobs = jobs_for(paper, preset)
    total = sum(j["config"].users for j in jobs)
    print(f"paper {paper_id}: {len(jobs)} simulations, {total:,} users", flush=True)
    rows, curves, started = [], {}, time.perf_counter()
    params = {"paper": paper_id, "quick": quick, **{k: v for k, v in preset.items()}}
    with tracker.sweep(f"paper-{paper_id}", params=params, tags={"job": "reproduce", "paper": paper_id}) as sweep:
        def collect(job, result, cpu, extra):
            row = sweep.log_result(result)
            curve = metric_curves(result).get("cumulative_regret")
            if curve is not None:
                curves[row["key"]] = curve
            rows.append({"key": row["key"], **row_of(job, result, cpu, extra)})
            done = len(rows)
            if done % 10 == 0 or done == len(jobs):
                print(f"  {done}/{len(jobs)} runs, {time.perf_counter() - started:,.0f} s", flush=True)

        if workers > 1:
            with ProcessPoolExecutor(workers) as pool:
                for out in pool.map(simulate, jobs):
                    collect(*out)
        else:
            for job in jobs:
                collect(*simulate(job))
        local_dir = sweep.local_dir
    runs = pd.DataFrame(rows)
    runs.to_csv(local_dir / "runs.csv", index=False)
    slopes = slope_table(runs)
    claims = claim_rows(paper_id, runs, slopes, papers)
    cpu = runs["cpu_s"].sum()
    header = (f"### Paper {paper_id}: {paper['title']}\n\n"
              f"`{command}`: "
              f"T = {', '.join(f'{t:,}' for t in sorted(runs[runs['part'] == 'main']['users'].unique()))} users, "
              f"round sizes {', '.join(str(b) for b in sorted(runs['round_size'].unique()))} (1: compiled sequential "
              f"engine; 10: algorithms it does not run; 1,000: uniform play), {preset['seeds']} seeds (main), "
              f"slopes with {preset['slope_seeds']} seeds; "
              f"{len(runs)} simulations, {cpu / 60:,.2f} CPU-minutes (machine shared).\n\n")
    text = header + markdown(claims, ["claim", "measured", "reproduced", "why not"]) + "\n"
    (local_dir / "claims.md").write_text(text)
    if len(slopes):
        slope_md = markdown(slopes.to_dict("records"), ["algorithm", "env", "T", "seeds", "slope_of_medians",
                                                        "per_seed_slopes", "medians"])
        (local_dir / "slopes.md").write_text(slope_md + "\n")
        text += "\nLog-log slopes of the final regret over T (eps = 1):\n\n" + slope_md + "\n"
    support = runs[runs["part"] == "support"]
    if len(support):
        grid = support.groupby(["users", "eps"]).agg(
            seeds=("seed", "nunique"), contains_truth=("support_contains", "mean"),
            exact=("support_exact", "mean"), true_found=("support_true_found", "mean"),
            size=("support_size", "mean"), regret=("final_regret", "median")).reset_index()
        support_md = markdown(grid.to_dict("records"), list(grid.columns))
        (local_dir / "support.md").write_text(support_md + "\n")
        text += "\nprivate-lasso support selection (fraction of seeds; final support):\n\n" + support_md + "\n"
    for path in write_plots(runs, curves, local_dir / "plots", f"paper {paper_id}"):
        if tracker.enabled and sweep.parent_run_id:
            tracker.client.log_artifact(sweep.parent_run_id, str(path), "plots")
    if tracker.enabled and sweep.parent_run_id:
        for name in ("claims.md", "slopes.md", "support.md", "runs.csv"):
            if (local_dir / name).exists():
                tracker.client.log_artifact(sweep.parent_run_id, str(local_dir / name))
    print(text, flush=True)
    return local_dir


def price_of_batching(tracker, T: int, T_others: int, seeds: int, command: str, only=None) -> Path:
    """The price of batching: seed 000/002's contextual algorithms at T users (the other families at T_others; 0:
    not them) at every round size of BATCH_SIZES, eps = 1; writes batching.md and its plot. only: the names of the
    algorithms to run (None: all), for rerunning the rows of an algorithm whose bits moved."""
    groups = [(BATCH_ALGORITHMS, T)] + ([(BATCH_OTHERS, T_others)] if T_others else [])
    if only is not None:
        groups = [([a for a in algorithms if a[0] in only], users) for algorithms, users in groups]
    jobs = [{"part": "batching", "label": env, "name": algo, "config": make_config(
        algo, env, env_params, users, B, 1.0, 0.01, seed, "paper", fallback=False)}
        for algorithms, users in groups for algo, env, env_params in algorithms
        for B in BATCH_SIZES if B <= users for seed in range(seeds)]
    print(f"batching: {len(jobs)} simulations (T = {T:,}; others T = {T_others:,})", flush=True)
    rows, started = [], time.perf_counter()
    with tracker.sweep("batching", params={"users": T, "seeds": seeds, "round_sizes": list(BATCH_SIZES)},
                       tags={"job": "reproduce", "part": "batching"}) as sweep:
        for job in jobs:
            job, result, cpu, extra = simulate(job)
            row = sweep.log_result(result)
            rows.append({"key": row["key"], **row_of(job, result, cpu, extra)})
            if len(rows) % 10 == 0:
                print(f"  {len(rows)}/{len(jobs)} runs, {time.perf_counter() - started:,.0f} s", flush=True)
        local_dir = sweep.local_dir
    runs = pd.DataFrame(rows)
    runs.to_csv(local_dir / "runs.csv", index=False)
    md = batching_markdown(runs, command, seeds)
    (local_dir / "batching.md").write_text(md)
    # every algorithm's regrets divided by its own B = 1 median: the families' scales differ by 100x
    b1_median = runs[runs["round_size"] == 1].groupby("algorithm")["final_regret"].median()
    relative = runs.assign(final_regret=runs["final_regret"].astype(float) / runs["algorithm"].map(b1_median))
    quartile_plot(relative, "round_size", "round size B (users per round)",
                  f"Price of batching, eps = 1, {seeds} seeds (T: see batching.md)", local_dir / "plots" / "batching.png",
                  ylabel="final regret / its median at B = 1 (median, 25-75%)")
    if tracker.enabled and sweep.parent_run_id:
        tracker.client.log_artifact(sweep.parent_run_id, str(local_dir / "plots" / "batching.png"), "plots")
        tracker.client.log_artifact(sweep.parent_run_id, str(local_dir / "batching.md"))
    print(md, flush=True)
    return local_dir

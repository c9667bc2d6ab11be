"""Sweep plots (matplotlib, Agg backend, PNG).

* regret_curves: cumulative regret against users processed, one panel per (env, eps), one line per algorithm:
  the median over seeds, with a band from the 25% to the 75% quantile of the seeds.
* final_vs_eps: a final quantity (regret, estimation error) against eps, one panel per env, one line per
  algorithm: median over seeds with 25-75% quantile error bars; log eps axis when eps spans a factor >= 4, log
  value axis when the values are positive and span more than a factor 20.

Inputs are light: `curves` maps a run to its down-sampled (users, cumulative regret) arrays and `summary` is the
combined summary table, so a sweep of any length plots from bounded memory.
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg", force=False)
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import EngFormatter, NullLocator  # noqa: E402

GRID_POINTS = 400


def colors(algorithms) -> dict:
    """One color per algorithm, the same in every plot of a sweep (pass the sweep's sorted algorithm names).
    Uniform play, the reference every learner is read against, is always black; up to 40 others stay distinct."""
    algorithms = sorted(algorithms)
    learners = [name for name in algorithms if name != "uniform"]
    if len(learners) <= 10:
        palette = list(plt.get_cmap("tab10").colors)
    else:
        palette = list(plt.get_cmap("tab20").colors) + list(plt.get_cmap("tab20b").colors)
    chosen = {name: palette[i % len(palette)] for i, name in enumerate(learners)}
    if "uniform" in algorithms:
        chosen["uniform"] = (0.0, 0.0, 0.0, 1.0)
    return chosen


def _grid(count: int, width: float = 5.2, height: float = 3.8):
    cols = min(3, count)
    rows = math.ceil(count / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows + 0.9), squeeze=False)
    for ax in axes.flat[count:]:
        ax.set_visible(False)
    return fig, axes.flat


def _legend(fig, handles, labels, note: str):
    if handles:
        legend = fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 5), frameon=False,
                            bbox_to_anchor=(0.5, 0.0), fontsize=9, title=note, title_fontsize=8)
        legend.get_title().set_color("0.35")


def _numbers(axis, values) -> None:
    """Engineering suffixes (12.5k, 3M) for large numbers only; small ones keep matplotlib's plain ticks."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if len(values) and np.abs(values).max() >= 1e4:
        axis.set_major_formatter(EngFormatter(sep=""))


def _save(fig, path: Path, legend_rows: int) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    height = fig.get_size_inches()[1]
    fig.tight_layout(rect=(0, (0.45 + 0.25 * legend_rows) / height, 1, 1 - 0.25 / height))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def regret_curves(curves: dict, runs: pd.DataFrame, path: Path, title: str, palette: dict | None = None) -> Path | None:
    """`runs` has one row per run (key, algorithm, env, eps, seed); `curves[key]` = (users, cumulative regret)."""
    runs = runs[runs["key"].isin(list(curves))]
    if runs.empty:
        return None
    algorithms = sorted(runs["algorithm"].unique())
    palette = palette or colors(algorithms)
    panels = sorted(runs.groupby(["env", "eps"]).groups)
    fig, axes = _grid(len(panels))
    handles, labels = {}, {}
    seed_counts = set()
    for ax, (env, eps) in zip(axes, panels):
        panel = runs[(runs["env"] == env) & (runs["eps"] == eps)]
        for algorithm in algorithms:
            keys = panel.loc[panel["algorithm"] == algorithm, "key"].tolist()
            if not keys:
                continue
            seed_counts.add(len(keys))
            top = min(float(curves[k][0][-1]) for k in keys)
            low = max(float(curves[k][0][0]) for k in keys)
            grid = np.linspace(low, top, GRID_POINTS) if top > low else np.array([top])
            stack = np.vstack([np.interp(grid, curves[k][0], curves[k][1]) for k in keys])
            median = np.median(stack, axis=0)
            line, = ax.plot(grid, median, color=palette[algorithm], lw=1.8)
            if len(keys) > 1:
                q25, q75 = np.quantile(stack, [0.25, 0.75], axis=0)
                ax.fill_between(grid, q25, q75, color=palette[algorithm], alpha=0.22, lw=0)
            handles[algorithm], labels[algorithm] = line, algorithm
        ax.set_title(f"{env}, eps = {eps:g}", fontsize=10)
        ax.set_xlabel("users processed")
        ax.set_ylabel("cumulative regret")
        _numbers(ax.xaxis, [curves[k][0][-1] for k in panel["key"]])
        _numbers(ax.yaxis, [curves[k][1].max() for k in panel["key"]])
        ax.grid(True, alpha=0.3)
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
    seeds = "/".join(str(n) for n in sorted(seed_counts))
    fig.suptitle(title, fontsize=12)
    order = [a for a in algorithms if a in handles]
    _legend(fig, [handles[a] for a in order], order,
            f"line: median over {seeds} seed(s); band: 25-75% quantiles over seeds")
    return _save(fig, path, math.ceil(len(order) / 5))


def final_vs_eps(summary: pd.DataFrame, column: str, path: Path, title: str, ylabel: str,
                 palette: dict | None = None) -> Path | None:
    """Median over seeds of `column` against eps, per algorithm, one panel per env."""
    if column not in summary.columns:
        return None
    data = summary[["algorithm", "env", "eps", "seed", column]].copy()
    data[column] = pd.to_numeric(data[column], errors="coerce")
    data = data[np.isfinite(data[column].to_numpy(dtype=float))]
    if data.empty:
        return None
    algorithms = sorted(data["algorithm"].unique())
    palette = palette or colors(algorithms)
    envs = sorted(data["env"].unique())
    fig, axes = _grid(len(envs))
    handles = {}
    for ax, env in zip(axes, envs):
        panel = data[data["env"] == env]
        for algorithm in algorithms:
            rows = panel[panel["algorithm"] == algorithm]
            if rows.empty:
                continue
            stats = rows.groupby("eps")[column].agg(
                median="median", q25=lambda s: s.quantile(0.25), q75=lambda s: s.quantile(0.75)).sort_index()
            eps = stats.index.to_numpy(dtype=float)
            err = np.vstack([stats["median"] - stats["q25"], stats["q75"] - stats["median"]])
            bars = ax.errorbar(eps, stats["median"], yerr=err, color=palette[algorithm], marker="o", ms=5,
                               lw=1.6, capsize=3)
            handles[algorithm] = bars
        eps_all = panel["eps"].to_numpy(dtype=float)
        if eps_all.min() > 0 and eps_all.max() / eps_all.min() >= 4:
            ax.set_xscale("log")
        values = panel[column].to_numpy(dtype=float)
        if values.min() > 0 and values.max() / values.min() > 20:
            ax.set_yscale("log")
        else:
            _numbers(ax.yaxis, values)
        ax.set_title(env, fontsize=10)
        ax.set_xlabel("eps (privacy budget)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="major", alpha=0.3)
        ticks = np.unique(eps_all)
        if len(ticks) <= 8:
            ax.set_xticks(ticks)
            ax.set_xticklabels([f"{t:g}" for t in ticks])
            ax.xaxis.set_minor_locator(NullLocator())
    fig.suptitle(title, fontsize=12)
    order = [a for a in algorithms if a in handles]
    _legend(fig, [handles[a] for a in order], order, "marker: median over seeds; bars: 25-75% quantiles")
    return _save(fig, path, math.ceil(len(order) / 5))


def sweep_plots(summary: pd.DataFrame, curves: dict, folder: Path, name: str) -> list[Path]:
    """Every plot of a sweep into `folder`, one color per algorithm across them; a plot that fails is skipped
    with a warning (a plot must never cost the results)."""
    import warnings

    folder = Path(folder)
    if summary.empty:
        return []
    palette = colors(summary["algorithm"].dropna().astype(str).unique())
    jobs = [
        lambda: regret_curves(curves, summary, folder / "regret_curves.png", f"Cumulative regret, sweep {name}",
                              palette),
        lambda: final_vs_eps(summary, "final_regret", folder / "final_regret_vs_eps.png",
                             f"Final regret against eps, sweep {name}", "final cumulative regret", palette),
        lambda: final_vs_eps(summary, "final_estimation_error", folder / "final_estimation_error_vs_eps.png",
                             f"Final estimation error against eps, sweep {name}", "final estimation error", palette),
    ]
    written = []
    for job in jobs:
        try:
            path = job()
        except Exception as exc:  # noqa: BLE001
            warnings.warn(f"ldpfed.tracking: a plot of sweep {name!r} failed: {exc!r}", RuntimeWarning)
            continue
        if path is not None:
            written.append(path)
    return written


def replot(sweep_dir: Path, points: int = 2000) -> list[Path]:
    """Redraw the plots of a sweep from its local folder (summary/summary.parquet and runs/*/table.parquet),
    e.g. after a job died before its sweep finished: `python -c "from ldpfed.tracking.plots import replot;
    replot('results/run_all/quick')"`."""
    sweep_dir = Path(sweep_dir)
    summary = pd.read_parquet(sweep_dir / "summary" / "summary.parquet")
    curves = {}
    for key, local in zip(summary["key"], summary.get("local_dir", pd.Series([None] * len(summary)))):
        if local is None or pd.isna(local):
            continue
        table = pd.read_parquet(sweep_dir / str(local) / "table.parquet", columns=["users", "cumulative_regret"])
        index = np.unique(np.round(np.linspace(0, len(table) - 1, min(points, len(table)))).astype(int))
        curves[key] = (table["users"].to_numpy()[index], table["cumulative_regret"].to_numpy()[index])
    return sweep_plots(summary, curves, sweep_dir / "plots", sweep_dir.name)

"""Sweep plots (matplotlib, Agg backend, PNG), drawn so every algorithm can be read.

* regret_curves: cumulative regret against users processed, one panel per (env, eps), one line per private
  algorithm (the median over seeds, a band from the 25% to the 75% quantile), and the non-private algorithms of
  the env (which do not depend on eps: one run per seed) in every eps panel of it as reference lines.
* final_vs_eps: a final quantity (regret, estimation error) against eps, one panel per env: private algorithms
  as median markers with 25-75% bars, non-private ones as horizontal reference lines with a band.

How they read: a legend in every panel naming only that panel's lines; uniform play black, other non-private
algorithms dashed, all references drawn beneath the private algorithms; colours distinct within a panel (tab10
over the env's algorithms, so an algorithm keeps its colour in every panel of its env); a log value axis when the
panel's values span more than a factor LOG_SPAN, else a linear one starting at 0 (a quantity near 1 is then not
magnified into noise); x from 0 users.

Inputs are light: `curves` maps a run to its down-sampled (users, cumulative regret) arrays and `summary` is the
combined summary table (eps is empty for non-private runs), so a sweep of any length plots from bounded memory.
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
LOG_SPAN = 20.0          # log value axis when max / min of the panel's positive values exceeds this
UNIFORM_COLOR = (0.0, 0.0, 0.0, 1.0)
REFERENCE_Z, LEARNER_Z = 1, 3


def _private(rows: pd.DataFrame) -> pd.Series:
    """Rows of private runs: their eps is a number (non-private runs have none)."""
    return pd.to_numeric(rows["eps"], errors="coerce").notna()


def colors(algorithms) -> dict:
    """Distinct colours for the algorithms of one env (pass them all, sorted the same way in every plot):
    uniform play black, up to 10 others from tab10, up to 40 from tab20 + tab20b."""
    algorithms = sorted(set(algorithms))
    learners = [name for name in algorithms if name != "uniform"]
    palette = list(plt.get_cmap("tab10").colors)
    if len(learners) > len(palette):
        palette = list(plt.get_cmap("tab20").colors) + list(plt.get_cmap("tab20b").colors)
    chosen = {name: palette[i % len(palette)] for i, name in enumerate(learners)}
    if "uniform" in algorithms:
        chosen["uniform"] = UNIFORM_COLOR
    return chosen


def _style(algorithm: str, private: bool, palette: dict) -> dict:
    if private:
        return {"color": palette[algorithm], "lw": 1.9, "ls": "-", "zorder": LEARNER_Z}
    return {"color": palette[algorithm], "lw": 1.5, "ls": "--", "zorder": REFERENCE_Z}


def _grid(count: int, width: float = 5.4, height: float = 4.0):
    cols = min(3, count)
    rows = math.ceil(count / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows + 0.6), squeeze=False)
    for ax in axes.flat[count:]:
        ax.set_visible(False)
    return fig, axes.flat


def _numbers(axis, values) -> None:
    """Engineering suffixes (12.5k, 3M) for large numbers only; small ones keep matplotlib's plain ticks."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if len(values) and np.abs(values).max() >= 1e4:
        axis.set_major_formatter(EngFormatter(sep=""))


def _value_axis(ax, values, floor_candidates=None) -> None:
    """Log scale when the panel's positive values span more than LOG_SPAN (bottom just below the smallest of
    `floor_candidates`, default `values`), else linear from 0 for non-negative data."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if not len(values):
        return
    positive = values[values > 0]
    if len(positive) and values.min() >= 0 and positive.max() / positive.min() > LOG_SPAN:
        ax.set_yscale("log")
        floor = np.asarray(floor_candidates if floor_candidates is not None else positive, dtype=float)
        floor = floor[np.isfinite(floor) & (floor > 0)]
        bottom = (floor.min() if len(floor) else positive.min()) / 1.5
        ax.set_ylim(bottom=bottom, top=positive.max() * 1.5)
    else:
        _numbers(ax.yaxis, values)
        if values.min() >= 0:
            ax.set_ylim(bottom=0, top=max(values.max() * 1.08, 1e-12))


def _panel_legend(ax, note: str | None = None) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    # uniform first, then the other non-private references, then the private algorithms
    order = sorted(range(len(labels)), key=lambda i: (not labels[i].startswith("uniform"),
                                                      not labels[i].endswith("(non-private)"), labels[i]))
    legend = ax.legend([handles[i] for i in order], [labels[i] for i in order], fontsize=7, loc="best",
                       framealpha=0.85, handlelength=2.4, title=note, title_fontsize=6)
    legend.set_zorder(10)


def _title(fig, title: str) -> None:
    """The figure's title, a fixed distance from its top edge (`_save`'s margins leave it room)."""
    fig.suptitle(title, fontsize=12, y=1 - 0.12 / fig.get_size_inches()[1], va="top")


def _save(fig, path: Path, note: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.text(0.5, 0.005, note, ha="center", va="bottom", fontsize=8, color="0.35")
    # Fixed margins in inches (tick labels, axis labels, titles, the note and the title), not tight_layout: it
    # measures every tick label of every panel, which took about half of a sweep's plotting time
    width, height = fig.get_size_inches()
    rows, cols = fig.axes[0].get_subplotspec().get_gridspec().get_geometry()
    left, right, bottom, top, gap_x, gap_y = 0.85, 0.2, 0.55 + 0.25, 0.45 + 0.3, 0.95, 0.85
    cell_w = (width - left - right - gap_x * (cols - 1)) / cols
    cell_h = (height - bottom - top - gap_y * (rows - 1)) / rows
    fig.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height,
                        wspace=gap_x / cell_w, hspace=gap_y / cell_h)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _median_curve(curves: dict, keys: list):
    top = min(float(curves[k][0][-1]) for k in keys)
    low = max(float(curves[k][0][0]) for k in keys)
    grid = np.linspace(low, top, GRID_POINTS) if top > low else np.array([top])
    stack = np.vstack([np.interp(grid, curves[k][0], curves[k][1]) for k in keys])
    return grid, stack


def regret_curves(curves: dict, runs: pd.DataFrame, path: Path, title: str) -> Path | None:
    """`runs` has one row per run (key, algorithm, env, eps, seed); `curves[key]` = (users, cumulative regret)."""
    runs = runs[runs["key"].isin(list(curves))].copy()
    if runs.empty:
        return None
    runs["private"] = _private(runs)
    runs["eps"] = pd.to_numeric(runs["eps"], errors="coerce")
    panels = []
    for env in sorted(runs["env"].unique()):
        eps_values = sorted(runs.loc[(runs["env"] == env) & runs["private"], "eps"].unique())
        panels += [(env, eps) for eps in eps_values] or [(env, None)]
    fig, axes = _grid(len(panels))
    seed_counts = set()
    for ax, (env, eps) in zip(axes, panels):
        on_env = runs[runs["env"] == env]
        palette = colors(on_env["algorithm"])
        panel = on_env[~on_env["private"] | (on_env["eps"] == eps)]
        finals, firsts = [], []
        for (algorithm, private), rows in panel.groupby(["algorithm", "private"], sort=True):
            keys = rows["key"].tolist()
            seed_counts.add(len(keys))
            grid, stack = _median_curve(curves, keys)
            median = np.median(stack, axis=0)
            style = _style(algorithm, private, palette)
            label = algorithm if private else f"{algorithm} (non-private)"
            ax.plot(grid, median, label=label, **style)
            if len(keys) > 1:
                q25, q75 = np.quantile(stack, [0.25, 0.75], axis=0)
                ax.fill_between(grid, q25, q75, color=style["color"], alpha=0.18 if private else 0.10, lw=0,
                                zorder=style["zorder"] - 0.5)
            finals.append(median[-1])
            tenth = median[grid >= grid[0] + 0.1 * (grid[-1] - grid[0])]    # where the curves have got going
            firsts.append(tenth[0] if len(tenth) else median[-1])
        ax.set_title(f"{env}, eps = {eps:g}" if eps is not None else f"{env} (non-private only)", fontsize=10)
        ax.set_xlabel("users processed")
        ax.set_ylabel("cumulative regret")
        _numbers(ax.xaxis, [curves[k][0][-1] for k in panel["key"]])
        _value_axis(ax, finals + firsts, floor_candidates=firsts)
        ax.grid(True, which="major", alpha=0.3)
        ax.set_xlim(left=0)
        _panel_legend(ax)
    seeds = "/".join(str(n) for n in sorted(seed_counts))
    _title(fig, title)
    return _save(fig, path, f"line: median over {seeds} seed(s); band: 25-75% quantiles over seeds; dashed: "
                            "non-private references (eps plays no part in them)")


def final_vs_eps(summary: pd.DataFrame, column: str, path: Path, title: str, ylabel: str) -> Path | None:
    """Median over seeds of `column` against eps, per algorithm, one panel per env."""
    if column not in summary.columns:
        return None
    data = summary[["algorithm", "env", "eps", "seed", column]].copy()
    data[column] = pd.to_numeric(data[column], errors="coerce")
    data = data[np.isfinite(data[column].to_numpy(dtype=float))]
    data["private"] = _private(data)
    data["eps"] = pd.to_numeric(data["eps"], errors="coerce")
    envs = sorted(data.loc[data["private"], "env"].unique())     # no eps axis without a private algorithm
    if data.empty or not envs:
        return None
    fig, axes = _grid(len(envs))
    for ax, env in zip(axes, envs):
        panel = data[data["env"] == env]
        palette = colors(panel["algorithm"])
        eps_all = panel.loc[panel["private"], "eps"].to_numpy(dtype=float)
        span = (eps_all.min(), eps_all.max())
        shown = []
        for (algorithm, private), rows in panel.groupby(["algorithm", "private"], sort=True):
            style = _style(algorithm, private, palette)
            if not private:
                values = rows[column]
                median, q25, q75 = values.median(), values.quantile(0.25), values.quantile(0.75)
                ax.hlines(median, *span, label=f"{algorithm} (non-private)", **style)
                ax.fill_between(span, q25, q75, color=style["color"], alpha=0.10, lw=0, zorder=REFERENCE_Z - 0.5)
                shown += [median, q25, q75]
                continue
            stats = rows.groupby("eps")[column].agg(
                median="median", q25=lambda s: s.quantile(0.25), q75=lambda s: s.quantile(0.75)).sort_index()
            eps = stats.index.to_numpy(dtype=float)
            err = np.vstack([stats["median"] - stats["q25"], stats["q75"] - stats["median"]])
            ax.errorbar(eps, stats["median"], yerr=err, marker="o", ms=5, capsize=3, label=algorithm,
                        color=style["color"], lw=style["lw"], zorder=style["zorder"])
            shown += list(stats["median"]) + list(stats["q25"]) + list(stats["q75"])
        if span[0] > 0 and span[1] / span[0] >= 4:
            ax.set_xscale("log")
        _value_axis(ax, shown)
        ax.set_title(env, fontsize=10)
        ax.set_xlabel("eps (privacy budget)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="major", alpha=0.3)
        ticks = np.unique(eps_all)
        if len(ticks) <= 8:
            ax.set_xticks(ticks)
            ax.set_xticklabels([f"{t:g}" for t in ticks])
            ax.xaxis.set_minor_locator(NullLocator())
        if span[1] > span[0]:
            pad = (np.log(span[1] / span[0]) if ax.get_xscale() == "log" else span[1] - span[0]) * 0.06
            ax.set_xlim(*((span[0] / np.exp(pad), span[1] * np.exp(pad)) if ax.get_xscale() == "log"
                          else (span[0] - pad, span[1] + pad)))
        _panel_legend(ax)
    _title(fig, title)
    return _save(fig, path, "marker: median over seeds; bars: 25-75% quantiles; dashed line and band: "
                            "non-private references (median, 25-75%)")


def sweep_plots(summary: pd.DataFrame, curves: dict, folder: Path, name: str) -> list[Path]:
    """Every plot of a sweep into `folder`; a plot that fails is skipped with a warning (a plot must never cost
    the results)."""
    import warnings

    folder = Path(folder)
    if summary.empty:
        return []
    if "status" in summary.columns:
        summary = summary[summary["status"] == "FINISHED"]
    jobs = [
        lambda: regret_curves(curves, summary, folder / "regret_curves.png", f"Cumulative regret, sweep {name}"),
        lambda: final_vs_eps(summary, "final_regret", folder / "final_regret_vs_eps.png",
                             f"Final regret against eps, sweep {name}", "final cumulative regret"),
        lambda: final_vs_eps(summary, "final_estimation_error", folder / "final_estimation_error_vs_eps.png",
                             f"Final estimation error against eps, sweep {name}", "final estimation error"),
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


def replot(sweep_dir: Path, points: int = 2000, log=None) -> list[Path]:
    """Redraw the plots of a sweep from its local folder (summary/summary.parquet and runs/*/table.parquet),
    e.g. after a job died before its sweep finished: `python -c "from ldpfed.tracking.plots import replot;
    replot('results/run_all/quick')"`. A run whose table cannot be read is left out of the plots and reported
    (`log`, default: a warning), never fatal; its row is marked FAILED so no figure counts it."""
    import warnings

    sweep_dir = Path(sweep_dir)
    summary = pd.read_parquet(sweep_dir / "summary" / "summary.parquet")
    curves = {}
    for row, (key, local) in enumerate(zip(summary["key"], summary.get("local_dir", pd.Series([None] * len(summary))))):
        if local is None or pd.isna(local):
            continue
        path = sweep_dir / str(local) / "table.parquet"
        try:
            table = pd.read_parquet(path, columns=["users", "cumulative_regret"])
        except Exception as error:  # noqa: BLE001 - a corrupt or missing file: skip that run, say so
            message = f"replot: skipped {path}: {type(error).__name__}: {str(error).splitlines()[0][:200]}"
            (log or (lambda text: warnings.warn(text, RuntimeWarning, stacklevel=3)))(message)
            if "status" in summary.columns:
                summary.loc[summary.index[row], "status"] = "FAILED"
            continue
        index = np.unique(np.round(np.linspace(0, len(table) - 1, min(points, len(table)))).astype(int))
        curves[key] = (table["users"].to_numpy()[index], table["cumulative_regret"].to_numpy()[index])
    return sweep_plots(summary, curves, sweep_dir / "plots", sweep_dir.name)

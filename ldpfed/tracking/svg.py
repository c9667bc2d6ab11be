"""One run's regret curve as a small SVG (regret.svg in the run's folder, an artifact of its MLflow run, which the
UI's artifact view shows as an image): cumulative regret against users, with the run's name and final regret.

Written as text, not with matplotlib: a sweep writes one per run, and a matplotlib figure costs tens of
milliseconds where this costs well under one.
"""
from __future__ import annotations

import html
import math

import numpy as np

WIDTH, HEIGHT = 480, 300
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 40, 40        # the plot area's margins, in pixels


def nice_ticks(high: float, count: int = 4) -> list[float]:
    """Round tick values from 0 to at least `high` (about `count` of them)."""
    if not (high > 0 and math.isfinite(high)):
        return [0.0, 1.0]
    raw = high / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    return [i * step for i in range(int(math.ceil(high / step - 1e-9)) + 1)]


def label(value: float) -> str:
    """A tick label: 12k, 1.5M, 250, 0.5."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:g}{suffix}"
    return f"{value:g}"


def regret_svg(users, regret, title: str) -> str:
    """The SVG text of a cumulative-regret curve (`users` and `regret`: equal-length arrays, users increasing, as
    many points as the line is to have)."""
    users, regret = np.asarray(users, dtype=float), np.asarray(regret, dtype=float)
    keep = np.isfinite(users) & np.isfinite(regret)
    users, regret = users[keep], regret[keep]
    xs = nice_ticks(float(users.max()) if len(users) else 1.0)
    ys = nice_ticks(float(regret.max()) if len(regret) else 1.0)
    width, height = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(value):
        return LEFT + width * value / xs[-1]

    def y(value):
        return TOP + height * (1 - value / ys[-1])

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="11">',
             f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
             f'<text x="{LEFT}" y="18" font-size="12" font-weight="bold">{html.escape(title)}</text>']
    for value in xs:
        parts.append(f'<line x1="{x(value):.1f}" y1="{TOP}" x2="{x(value):.1f}" y2="{TOP + height}" stroke="#eee"/>')
        parts.append(f'<text x="{x(value):.1f}" y="{TOP + height + 14}" text-anchor="middle">{label(value)}</text>')
    for value in ys:
        parts.append(f'<line x1="{LEFT}" y1="{y(value):.1f}" x2="{LEFT + width}" y2="{y(value):.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y(value) + 4:.1f}" text-anchor="end">{label(value)}</text>')
    parts.append(f'<text x="{LEFT + width / 2}" y="{HEIGHT - 6}" text-anchor="middle">users</text>')
    parts.append(f'<text x="14" y="{TOP + height / 2}" text-anchor="middle" '
                 f'transform="rotate(-90 14 {TOP + height / 2})">cumulative regret</text>')
    points = " ".join(f"{x(u):.1f},{y(r):.1f}" for u, r in zip(users, regret))
    parts.append(f'<polyline points="{points}" fill="none" stroke="#1f77b4" stroke-width="1.8"/>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"

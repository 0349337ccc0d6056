"""Draw the Grafana dashboard's panels from Prometheus answers, as one HTML page.

Grafana itself cannot run where the tests run (docs/observability.md, "Dashboard"), so
this is a stand-in that keeps only what the dashboard defines: the panels' titles,
positions (``gridPos``), units, queries and legends. Every line is what Prometheus
answered to the panel's own query; only the drawing is this module's. Pure: the caller
queries Prometheus and takes the screenshot (e2e/test_dashboard_picture.py).
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

ROW_PX = 26  # height of one gridPos unit
COLORS = ("#7eb26d", "#eab839", "#6ed0e0", "#ef843c", "#e24d42", "#1f78c1", "#ba43a9", "#705da0")

Series = tuple[str, list[tuple[float, float]]]  # (legend, [(unix time, value)])


def fill(expr: str, rate_interval: str) -> str:
    """The query as Grafana sends it with "All" selected (the variables' allValue)."""
    return (
        expr.replace("$namespace", ".*")
        .replace("$pod", ".*")
        .replace("$__rate_interval", rate_interval)
    )


def legend(fmt: str | None, metric: Mapping[str, str], fallback: str) -> str:
    """Grafana's ``legendFormat``: ``{{label}}`` replaced by the series' label."""
    if not fmt:
        return fallback
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt).strip()


def series_of(result: Sequence[Mapping[str, Any]], fmt: str | None) -> list[Series]:
    """A ``query_range`` matrix as legend and finite points."""
    out = []
    for item in result:
        points = [(float(t), float(v)) for t, v in item["values"] if math.isfinite(float(v))]
        if points:
            name = legend(fmt, item["metric"], ", ".join(sorted(item["metric"].values())))
            out.append((name, points))
    return out


def human(value: float, unit: str | None) -> str:
    """A value in the panel's unit, shortened as Grafana does."""
    if unit in ("bytes", "Bps"):
        size, suffix = value, "B"
        for step in ("KiB", "MiB", "GiB"):
            if abs(size) < 1024:
                break
            size, suffix = size / 1024, step
        return f"{size:.1f} {suffix}" + ("/s" if unit == "Bps" else "")
    if unit == "s":
        return f"{value * 1000:.1f} ms" if abs(value) < 1 else f"{value:.2f} s"
    if unit == "ops":
        return f"{value:.1f} ops/s"
    return f"{value:.3g}"


def _stat(panel: Mapping[str, Any], series: list[Series]) -> str:
    last = series[0][1][-1][1] if series else float("nan")
    text = human(last, _unit(panel)) if series else "No data"
    return f'<div class="stat">{html.escape(text)}</div>'


def _timeseries(panel: Mapping[str, Any], series: list[Series], height: int) -> str:
    if not series:
        return '<div class="nodata">No data</div>'
    unit = _unit(panel)
    times = [t for _, pts in series for t, _ in pts]
    values = [v for _, pts in series for _, v in pts]
    t0, t1 = min(times), max(times)
    lo, hi = min(0.0, min(values)), max(values)
    hi = hi if hi > lo else lo + 1
    w, h, left = 1000, max(60, height), 110
    lines = []
    for i, (_, pts) in enumerate(series):
        xy = " ".join(
            f"{left + (t - t0) / max(t1 - t0, 1) * (w - left - 5):.1f},"
            f"{h - 4 - (v - lo) / (hi - lo) * (h - 12):.1f}"
            for t, v in pts
        )
        color = COLORS[i % len(COLORS)]
        lines.append(f'<polyline points="{xy}" fill="none" stroke="{color}" stroke-width="2"/>')
    axis = (
        f'<text x="{left - 8}" y="14" text-anchor="end">{html.escape(human(hi, unit))}</text>'
        f'<text x="{left - 8}" y="{h - 4}" text-anchor="end">{html.escape(human(lo, unit))}</text>'
        f'<line x1="{left}" y1="{h - 4}" x2="{w}" y2="{h - 4}" stroke="#555"/>'
    )
    keys = "".join(
        f'<span><i style="background:{COLORS[i % len(COLORS)]}"></i>{html.escape(name)}</span>'
        for i, (name, _) in enumerate(series[:8])
    )
    more = f"<span>+{len(series) - 8} more</span>" if len(series) > 8 else ""
    return (
        f'<svg viewBox="0 0 {w} {h}" preserveAspectRatio="none" style="height:{h}px">'
        f'{axis}{"".join(lines)}</svg><div class="legend">{keys}{more}</div>'
    )


def _unit(panel: Mapping[str, Any]) -> str | None:
    return ((panel.get("fieldConfig") or {}).get("defaults") or {}).get("unit")


def page(dashboard: Mapping[str, Any], answers: Mapping[str, list[Series]], caption: str) -> str:
    """The whole dashboard as HTML; ``answers`` maps a panel's title to its series."""
    cells = []
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        place = (
            f"grid-column:{pos['x'] + 1}/span {pos['w']};grid-row:{pos['y'] + 1}/span {pos['h']}"
        )
        title = html.escape(panel["title"])
        if panel["type"] == "row":
            cells.append(f'<div class="row" style="{place}">{title}</div>')
            continue
        series = answers.get(panel["title"], [])
        body_px = pos["h"] * ROW_PX - 58
        body = (
            _stat(panel, series) if panel["type"] == "stat" else _timeseries(panel, series, body_px)
        )
        cells.append(f'<div class="panel" style="{place}"><h3>{title}</h3>{body}</div>')
    style = (
        "body{margin:0;padding:10px;background:#111217;color:#ccccdc;font:12px sans-serif}"
        f".grid{{display:grid;grid-template-columns:repeat(24,1fr);grid-auto-rows:{ROW_PX}px;"
        "gap:6px}.panel{background:#181b1f;border:1px solid #2c3235;padding:6px 8px;"
        "overflow:hidden}.panel h3{margin:0 0 4px;font-size:13px;color:#d8d9da}"
        ".row{font-size:15px;font-weight:bold;padding-top:4px}.stat{font-size:34px;"
        "color:#73bf69;text-align:center;padding-top:6px}.nodata{color:#888;padding:20px}"
        "svg{width:100%;display:block}svg text{fill:#999;font-size:12px}"
        ".legend span{margin-right:10px;white-space:nowrap}.legend i{display:inline-block;"
        "width:10px;height:3px;margin:0 4px 3px 0}.caption{margin:0 0 8px;color:#999}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><style>{style}</style></head>"
        f"<body><p class='caption'>{html.escape(caption)}</p>"
        f"<div class='grid'>{''.join(cells)}</div></body></html>"
    )

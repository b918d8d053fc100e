"""The report's charts have honest axes and legends, and its one-page HTML summary renders in headless Chromium.

No Spark: the tables are what build_report computes (same columns), written by hand; the charts and both summaries
come from the report's own code. Chromium is Debian's package (scripts/apt-packages.txt).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from delayed_delivery.pipelines import charts
from delayed_delivery.pipelines.report import TABLE_COLUMNS, _charts
from delayed_delivery.pipelines.report.summary import markdown, page
from tests.fixtures.services import unavailable

HOSTILE = "<script>alert(1)</script>[bold]|x"
T0 = datetime(2026, 11, 24, 14, 0)


def _tables() -> dict[str, list[dict[str, Any]]]:
    """Tables as build_report returns them: the demo's shape, with a hostile endpoint name."""
    tables: dict[str, list[dict[str, Any]]] = {name: [] for name in TABLE_COLUMNS}
    lateness = {"messages": 9, "p50_s": 0.4, "p95_s": 1.1, "p99_s": 1.3, "max_s": 1.3}
    tables["lateness_by_endpoint"] = [{"endpoint": HOSTILE, **lateness}, {"endpoint": "orders", **lateness}]
    tables["lateness_by_band"] = [{"band": b, **lateness} for b in ("≤15 min", "1 d–30 d", "over 30 d")]
    tables["duplicates"] = [{"endpoint": "orders", "delivered_messages": 9, "messages_with_duplicates": 0,
                             "duplicate_deliveries": 0}]  # fmt: skip
    tables["hops"] = [{"hops": 0, "messages": 7}, {"hops": 2, "messages": 3}, {"hops": 5, "messages": 1}]
    tables["hops_by_band"] = [{"band": "over 30 d", "messages": 4, "mean_hops": 2.8, "p50_hops": 2, "max_hops": 5}]
    tables["error_queue"] = [{"endpoint": HOSTILE, "reason": "DestinationNotFoundError('<b>')", "forwards": 2}]
    tables["throughput"] = [{"minute": T0, "dispatched": 3}, {"minute": T0 + timedelta(minutes=4), "dispatched": 5}]
    tables["cost_by_band"] = [
        {"band": "≤15 min", "messages": 5, "mean_delay_s": 60.0, "mean_hops": 0.0, "measured_requests_per_message": 1.0,
         "measured_usd_per_message": 4e-7, "nservicebus_formula_requests_per_message": 0.0,
         "nservicebus_formula_usd_per_message": 0.0},
        {"band": "over 30 d", "messages": 4, "mean_delay_s": 4e6, "mean_hops": 2.8,
         "measured_requests_per_message": 6.6, "measured_usd_per_message": 3e-6,
         "nservicebus_formula_requests_per_message": 8888.0, "nservicebus_formula_usd_per_message": 4.4e-3},
    ]  # fmt: skip
    return tables


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The axes of every chart the report draws, by file name (kept before the figure is closed)."""
    axes: dict[str, Any] = {}
    save = charts._save

    def keep(fig: Any, plt: Any, path: str) -> str:
        fig.canvas.draw()  # ticks and labels as they are drawn
        axes[Path(path).name] = fig.axes[0]
        return save(fig, plt, path)

    monkeypatch.setattr(charts, "_save", keep)
    return axes


def _labels(axis: Any) -> list[str]:
    """The tick labels shown (within the axis' limits)."""
    low, high = sorted(axis.get_view_interval())
    shown = zip(axis.get_ticklabels(), axis.get_ticklocs(), strict=True)
    return [t.get_text() for t, at in shown if t.get_text() and low <= at <= high]


def test_counts_have_whole_number_ticks_and_per_minute_data_is_bars(tmp_path: Path, drawn: dict[str, Any]) -> None:
    _charts(tmp_path, _tables())
    throughput = drawn["throughput.png"]
    assert len(throughput.patches) == 5, "one bar per minute from the first to the last, empty minutes at zero"
    assert [p.get_height() for p in throughput.patches] == [3, 0, 0, 0, 5]
    assert not throughput.lines, "no line drawn between two points"
    for name in ("throughput.png", "hops.png"):
        ticks = _labels(drawn[name].yaxis)
        assert ticks and all(re.fullmatch(r"[0-9,]+", t.replace("\N{MINUS SIGN}", "-")) for t in ticks), (name, ticks)
        assert drawn[name].get_ylim()[0] == 0
    assert all(re.fullmatch(r"[0-9]+", t) for t in _labels(drawn["hops.png"].xaxis))


def test_a_log_axis_shows_no_powers_and_the_legend_names_only_what_is_drawn(
    tmp_path: Path, drawn: dict[str, Any]
) -> None:
    tables = _tables()
    tables["hops"] = [{"hops": 0, "messages": 2}, {"hops": 47, "messages": 1}, {"hops": 3200, "messages": 1}]
    _charts(tmp_path, tables)
    hops = drawn["hops.png"]
    assert hops.get_xscale() == "symlog"
    assert all("10^" not in t and "$" not in t for t in _labels(hops.xaxis)), _labels(hops.xaxis)
    cost = drawn["cost_by_band.png"]
    assert cost.get_yscale() == "log"
    assert [t.get_text() for t in cost.get_legend().get_texts()] == ["measured", "NServiceBus formula"]
    tables["cost_by_band"] = [{**r, "nservicebus_formula_usd_per_message": 0.0} for r in tables["cost_by_band"]]
    _charts(tmp_path, tables)
    cost = drawn["cost_by_band.png"]
    assert [t.get_text() for t in cost.get_legend().get_texts()] == ["measured"], "a series never drawn is not named"
    assert "no NServiceBus formula above zero" in cost.get_title()


def test_the_summaries_escape_what_the_logs_say(tmp_path: Path) -> None:
    tables = _tables()
    made = _charts(tmp_path, tables)
    html = page(tables, (120, 100, 9), ["Clouds named in these logs: aws, azure."], made)
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;[bold]|x" in html
    assert html.count('src="data:image/png;base64,') == len(made) == 4, "the charts are inside the page"
    text = markdown(tables, (120, 100, 9), [], made)
    assert "\\|x" in text and "![throughput](throughput.png)" in text


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    unavailable("chromium is not installed (Debian: apt-get install chromium; scripts/apt-packages.txt)")
    raise AssertionError


def test_the_html_summary_renders_in_headless_chromium(tmp_path: Path) -> None:
    from PIL import Image

    tables = _tables()
    made = _charts(tmp_path, tables)
    html = tmp_path / "summary.html"
    html.write_text(page(tables, (120, 100, 9), ["Clouds named in these logs: aws, azure."], made), encoding="utf-8")
    shot = tmp_path / "screenshot.png"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars", "--window-size=1280,2400"]  # fmt: skip
    done = subprocess.run(
        [_chromium(), *flags, f"--screenshot={shot}", html.as_uri()], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 2400)
    colours = image.getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 200, "charts (antialiased, coloured) rendered, not a blank or text-only page"
    blue = sum(n for n, (r, g, b) in colours if b > 130 and r < 110 and b - r > 60)  # the bars' blue
    assert blue > 5_000, f"{blue} bar pixels"
    dom = subprocess.run(
        [_chromium(), *flags, "--dump-dom", html.as_uri()], capture_output=True, text=True, timeout=120
    ).stdout
    assert dom.count("<img") == 4 and dom.count("<table") == 6 and "Delayed delivery report" in dom

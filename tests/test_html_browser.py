"""The HTML pages in a real headless Chromium: the screenshot shows figures, not a blank page.

Chromium comes from the OS packages (`apt-get install -y chromium`, done by .ci/run);
the test skips only when it is absent.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from cgtool.reports.figures import EAGER_COLOUR
from cgtool.reports.render import render_path

FIXTURES = Path(__file__).parent / "data" / "reports"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")


def _screenshot(page: Path, tmp_path: Path) -> np.ndarray:
    png = tmp_path / f"{page.stem}.png"
    subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={png}",
         "--window-size=1280,2000", page.resolve().as_uri()],
        check=True, capture_output=True, timeout=120,
    )
    assert png.is_file() and png.stat().st_size > 10_000
    return (imread(png)[..., :3] * 255).astype(np.uint8)


def _pixels_near(pixels: np.ndarray, colour: str) -> int:
    rgb = np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)])
    return int((np.abs(pixels.astype(np.int32) - rgb).sum(axis=-1) < 30).sum())


def _distinct_colours(pixels: np.ndarray) -> int:
    return len(np.unique(pixels.reshape(-1, 3), axis=0))


def test_report_page_screenshot_shows_figures_and_tables(tmp_path):
    render_path(FIXTURES / "h100-llama-3.1-8b", tmp_path / "out")
    pixels = _screenshot(tmp_path / "out" / "report.html", tmp_path)
    assert pixels.shape[:2] == (2000, 1280)
    # Anti-aliased plot lines in several colours give thousands of shades; a blank or
    # broken page (missing images, unstyled text) gives a few dozen.
    assert _distinct_colours(pixels) > 1000
    figure_band = pixels[300:1000]  # the decode figures sit below the title and summary cards
    assert (figure_band != figure_band[0, 0]).any(axis=-1).mean() > 0.3
    # The eager-latency line's red appears nowhere else on the page: the PNGs were drawn.
    assert _pixels_near(pixels, EAGER_COLOUR) > 300


def test_plan_page_screenshot_is_not_blank(tmp_path):
    render_path(FIXTURES / "plan-llama-3.1-8b", tmp_path / "out")
    pixels = _screenshot(tmp_path / "out" / "plan.html", tmp_path)
    assert _distinct_colours(pixels) > 100
    top = pixels[:600]
    assert (top != top[0, 0]).any(axis=-1).mean() > 0.1  # title, cards and flags are drawn

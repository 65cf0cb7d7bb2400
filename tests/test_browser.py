"""The HTML report in a real browser: Debian's chromium, headless, no network.

Checks that the page's script ran (a marker element it adds), that the status grid is
there with its rows, that the console logged no errors, and that a screenshot renders."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conformance.reporting import render
from conformance.reporting.build import build
from conformance.reporting.inputs import load_run

FIX = Path(__file__).parent / "fixtures"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--enable-logging=stderr", "--v=0"]


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        p = shutil.which(name)
        if p:
            return p
    why = "chromium not installed (`make test` installs Debian's chromium; or apt-get install -y chromium)"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI=true: {why}; the report's browser test must run in CI")
    pytest.skip(why)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    out = tmp_path_factory.mktemp("rep")
    rep = build([load_run(FIX / "run_a")], [load_run(FIX / "base")], with_repro=True)
    render.write(rep, out)
    return out / "report.html", rep


def _run(args, tmp_path):
    cmd = [_chromium(), *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90)


@pytest.mark.browser
def test_report_page_loads_and_shows_grid(page, tmp_path):
    html, rep = page
    r = _run(["--dump-dom", html.as_uri()], tmp_path)
    dom = r.stdout
    assert 'data-ready="1"' in dom, r.stderr[-2000:]
    m = re.search(r'id="rc-ready"[^>]*data-grid-rows="(\d+)"[^>]*data-failing-cells="(\d+)"', dom) or re.search(
        r'data-grid-rows="(\d+)" data-failing-cells="(\d+)"', dom)
    assert m, dom[-2000:]
    # the page's own count of failing cells equals the report's (and the fixture has some)
    failing = sum(1 for g in rep["grid"] if g["status"] == "fail")
    assert failing and int(m.group(1)) == len(rep["pipelines"]) and int(m.group(2)) == failing, (m.groups(), failing)
    console = [l for l in r.stderr.splitlines() if "CONSOLE" in l or "Uncaught" in l]
    assert not [l for l in console if re.search(r"error|uncaught|refused|failed", l, re.I)], console
    assert not re.search(r"net::ERR_", r.stderr), "the page tried to load something"


@pytest.mark.browser
def test_report_page_screenshot(page, tmp_path):
    html, _ = page
    shot = tmp_path / "shot.png"
    r = _run(["--hide-scrollbars", "--window-size=1280,1400", f"--screenshot={shot}", html.as_uri()], tmp_path)
    assert shot.exists() and shot.stat().st_size > 20000, r.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

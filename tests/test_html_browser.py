"""The HTML reports opened in a real headless Chromium (Debian's ``chromium``, installed by
``bash dev/setup.sh test``), driven over the DevTools protocol: no console errors, no request
leaves the page (it works offline), every chart is drawn, and a screenshot is kept in
``artifacts/`` (gitignored).

The test fails when Chromium is missing; ``PIPEPROF_SKIP_BROWSER=1`` skips it on purpose, and
``PIPEPROF_CHROMIUM`` names another binary.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from golden_reports import FIXED, LOADER, LOOP, golden_report

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-allow-origins=*",
    "--remote-debugging-port=0",
    "--window-size=900,1200",
]
LOOP_CHARTS = {
    "step-breakdown",
    "step-timeline",
    "regions",
    "utilisation",
    "stage-icicle",
    "workers",
    "shares",
}


def chromium() -> str:
    if os.environ.get("PIPEPROF_SKIP_BROWSER"):
        pytest.skip("PIPEPROF_SKIP_BROWSER is set")
    found = os.environ.get("PIPEPROF_CHROMIUM") or shutil.which("chromium")
    if not found or not Path(found).exists():
        pytest.fail(
            "chromium is not installed: run `bash dev/setup.sh test` (it installs "
            "Debian's chromium), or set PIPEPROF_SKIP_BROWSER=1 to skip this test"
        )
    return found


class Browser:
    """Headless Chromium and one page, spoken to over the DevTools protocol."""

    def __init__(self, binary: str, profile: Path) -> None:
        import websocket  # websocket-client, a test dependency

        self.proc = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 90
        while not (port_file.exists() and port_file.read_text().strip()):
            assert self.proc.poll() is None, f"chromium exited with {self.proc.returncode}"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port"
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        pages: list[dict[str, Any]] = []
        while not pages:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as r:
                pages = [t for t in json.load(r) if t["type"] == "page"]
            assert pages or time.monotonic() < deadline, "chromium opened no page"
            time.sleep(0.1)
        self.ws = websocket.create_connection(
            pages[0]["webSocketDebuggerUrl"], timeout=60, suppress_origin=True
        )
        self.next_id = 0
        self.events: list[dict[str, Any]] = []
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable")

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                assert "error" not in msg, msg
                return dict(msg.get("result", {}))
            self.events.append(msg)

    def wait_for(self, method: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(e.get("method") == method for e in self.events):
            assert time.monotonic() < deadline, f"no {method} within {timeout_s} s"
            self.events.append(json.loads(self.ws.recv()))

    def open(self, url: str) -> None:
        self.events.clear()
        self.send("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    def errors(self) -> list[str]:
        out = []
        for e in self.events:
            method, p = e.get("method"), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                out.append(str(p["exceptionDetails"]))
            elif method == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert"):
                out.append(str(p["args"]))
            elif method == "Log.entryAdded" and p["entry"]["level"] == "error":
                out.append(p["entry"]["text"])
        return out

    def requests(self) -> list[str]:
        return [
            e["params"]["request"]["url"]
            for e in self.events
            if e.get("method") == "Network.requestWillBeSent"
        ]

    def screenshot(self, path: Path) -> Path:
        shot = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    b = Browser(chromium(), tmp_path_factory.mktemp("chromium-profile"))
    yield b
    b.close()


CHARTS_JS = """JSON.stringify([...document.querySelectorAll('svg.chart')].map(s => {
  const r = s.getBoundingClientRect();
  return {name: s.classList[1], width: r.width, height: r.height,
          marks: s.querySelectorAll('rect, polyline').length};
}))"""


def check_page(browser: Browser, html: str, name: str, tmp_path: Path) -> dict[str, Any]:
    page = tmp_path / f"{name}.html"
    page.write_text(html, encoding="utf-8")
    url = page.as_uri()
    browser.open(url)
    assert browser.errors() == []
    assert all(u == url or u.startswith("data:") for u in browser.requests()), browser.requests()
    charts = {c["name"]: c for c in json.loads(browser.evaluate(CHARTS_JS))}
    for c in charts.values():
        assert c["width"] > 100 and c["height"] > 20 and c["marks"] > 0, c
    assert browser.evaluate("document.documentElement.scrollWidth") <= 900  # nothing overflows
    shot = browser.screenshot(ARTIFACTS / f"html-report-{name}.png")
    print(f"screenshot: {shot}")
    assert shot.stat().st_size > 10_000
    return charts


def test_loop_report_in_chromium(browser, tmp_path):
    report = golden_report(LOOP)
    charts = check_page(browser, report.render("html"), "loop", tmp_path)
    assert set(charts) == LOOP_CHARTS
    text = browser.evaluate("document.body.innerText")
    assert report.verdict["headline"] in text and report.verdict["stage"] in text
    series = browser.evaluate("document.querySelectorAll('svg.utilisation polyline').length")
    assert series >= 2  # GPU and CPU lines drawn


def test_saved_loader_report_in_chromium(browser, tmp_path):
    report = golden_report(LOADER)
    path = report.write_html(tmp_path / "written.html")
    charts = check_page(browser, path.read_text(encoding="utf-8"), "loader", tmp_path)
    assert set(charts) == {"step-timeline", "stage-icicle", "workers", "shares"}
    icicle = browser.evaluate("document.querySelectorAll('svg.stage-icicle [data-stage]').length")
    assert icicle == len(report["stages"])


def test_comparison_in_chromium(browser, tmp_path):
    html = golden_report(LOOP).compare(golden_report(FIXED)).render("html")
    charts = check_page(browser, html, "compare", tmp_path)
    assert set(charts) == {"step-breakdown", "compare-stages"}

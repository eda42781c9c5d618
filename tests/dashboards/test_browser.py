"""The dashboard in headless Chromium (Debian's, driven by Playwright): scatter, matrix, task -> attempt
trace, live progress, replays. Any page error or console error fails the test; screenshots are kept as
artifacts (under $LUMOTREE_ARTIFACTS when set, else the test's tmp folder)."""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lumotree.dashboards.app import DashboardConfig, create_app
from lumotree.db.store import AttemptResult, Store
from lumotree.db.synthetic import SyntheticSweep, fill_synthetic_sweep

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(), reason="Chromium not installed (scripts/install-browser.sh)"
    ),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Store, dict[str, int]]]:
    import uvicorn

    store = Store(f"sqlite:///{tmp_path_factory.mktemp('db') / 'dash.db'}")
    ids = {
        "done": fill_synthetic_sweep(
            store, SyntheticSweep(name="finished", tasks=3, attempts=2, requests_per_attempt=3)
        ),
        "live": fill_synthetic_sweep(
            store,
            SyntheticSweep(name="live", tasks=1, attempts=1, requests_per_attempt=1, leave_pending=2, seed=3),
        ),
    }
    replay = store.create_replay("corpus.jsonl", {"runs": 2})
    for arm, rate in (("ar", 10.0), ("mtp", 25.0), ("lumotree", 27.0)):
        for run in range(2):
            store.record_replay_result(
                replay,
                arm,
                run,
                completion_tokens=1000,
                decode_seconds=1000 / (rate + run),
                pooled_tok_s=rate + run,
                acceptance_length=None if arm == "ar" else 3.5,
                per_position=[] if arm == "ar" else [0.9, 0.7, 0.5],
            )
    ids["replay"] = replay
    port = _free_port()
    app = create_app(DashboardConfig(poll_seconds=0.5), store=store)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "dashboard did not start"
    yield f"http://127.0.0.1:{port}", store, ids
    server.should_exit = True
    thread.join(timeout=10)
    store.close()


@pytest.fixture
def page(tmp_path: Path) -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        p = browser.new_page(viewport={"width": 1400, "height": 1000})
        p.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
        p.on(
            "console",
            lambda msg: errors.append(f"console.error: {msg.text}") if msg.type == "error" else None,
        )
        p.on("response", lambda r: errors.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
        yield p
        browser.close()
    assert errors == [], errors


@pytest.fixture
def shots(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    root = Path(os.environ.get("LUMOTREE_ARTIFACTS", tmp_path)) / "screenshots" / request.node.name
    root.mkdir(parents=True, exist_ok=True)
    return root


def test_sweep_scatter_then_task_then_attempt_trace(served, page, shots: Path) -> None:  # type: ignore[no-untyped-def]
    base, _, ids = served
    page.goto(base + "/")
    page.click(f'a[href="/sweeps/{ids["done"]}"]')
    page.wait_for_url(f"**/sweeps/{ids['done']}")
    # One point per arm in the plotly scatter: in the figure's data and as rendered SVG markers.
    page.wait_for_selector("#scatter .scatterlayer .points path")
    assert page.evaluate("document.getElementById('scatter').data[0].x.length") == 4
    assert page.locator("#scatter .scatterlayer .points path").count() == 4
    assert page.locator("#scatter .scatterlayer .textpoint").all_text_contents() == [
        "ar",
        "mtp",
        "eagle",
        "lumotree",
    ]
    assert page.locator("#arms tbody tr").count() == 4
    assert page.locator("#matrix a.cell").count() == 24
    page.screenshot(path=str(shots / "sweep.png"), full_page=True)

    page.locator("#matrix td.task a").first.click()
    page.wait_for_selector("#task-attempts")
    assert page.locator("#task-attempts a.attempt-link").count() == 8
    page.screenshot(path=str(shots / "task.png"), full_page=True)

    page.locator("#task-attempts a.attempt-link").nth(2).click()  # an MTP attempt: it has drafts
    page.wait_for_selector("#trace")
    assert page.locator("#trace li.event.message").count() == 3
    assert page.locator("#trace li.event.command pre.command").first.inner_text() == "$ ls -la"
    assert page.locator("#requests tbody tr").count() == 3
    page.wait_for_selector("#acceptance .barlayer path")
    assert page.locator("#acceptance .barlayer .point").count() == 5  # five draft positions
    assert page.locator("#tok-s .barlayer .point").count() == 3
    page.screenshot(path=str(shots / "attempt.png"), full_page=True)


def test_live_progress_updates_without_reload(served, page, shots: Path) -> None:  # type: ignore[no-untyped-def]
    base, store, ids = served
    page.goto(f"{base}/sweeps/{ids['live']}")
    counts = page.locator("#progress .counts")
    assert counts.inner_text().startswith("2 / 4 done")
    claim = store.claim_attempt(ids["live"], "browser-test")
    assert claim is not None
    store.finish_attempt(
        claim.attempt_id,
        "browser-test",
        AttemptResult(resolved=True, completion_tokens=10, decode_seconds=1.0, decode_tok_s=10.0),
    )
    page.wait_for_function(
        "document.querySelector('#progress .counts').textContent.startsWith('3 / 4 done')", timeout=15_000
    )
    page.wait_for_selector(f"#a{claim.attempt_id}.cell.resolved", timeout=15_000)  # the matrix cell follows
    page.screenshot(path=str(shots / "live.png"), full_page=True)


def test_replay_page(served, page, shots: Path) -> None:  # type: ignore[no-untyped-def]
    base, _, ids = served
    page.goto(base + "/replays")
    page.click(f'a[href="/replays/{ids["replay"]}"]')
    page.wait_for_selector("#replay-rates .barlayer .point")
    assert page.locator("#replay-rates .barlayer .point").count() == 3
    assert page.locator("#replay-positions .scatterlayer .trace").count() == 2  # AR has no drafts
    assert page.locator("#replay-results tbody tr").count() == 6
    page.screenshot(path=str(shots / "replay.png"), full_page=True)


def test_browser_binary_is_debians() -> None:
    assert shutil.which("chromium") == CHROMIUM

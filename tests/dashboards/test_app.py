"""The dashboard's pages and JSON endpoints over a real database filled through the Store."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from lumotree.dashboards.app import create_app, plotly_js_path
from lumotree.dashboards.stats import wilson_interval
from lumotree.db.store import AttemptResult, RequestRecord, Store
from lumotree.db.synthetic import SyntheticSweep, fill_synthetic_sweep


@pytest.fixture
def filled(store: Store) -> tuple[Store, int, int]:
    done = fill_synthetic_sweep(
        store, SyntheticSweep(name="done", tasks=3, attempts=2, requests_per_attempt=2)
    )
    running = fill_synthetic_sweep(
        store,
        SyntheticSweep(name="live", tasks=2, attempts=1, requests_per_attempt=1, leave_pending=3, seed=1),
    )
    return store, done, running


def test_sweep_json_has_arm_stats_wilson_and_scatter(filled: tuple[Store, int, int]) -> None:
    store, done, _ = filled
    client = TestClient(create_app(store=store))
    data = client.get(f"/api/sweeps/{done}").json()
    assert data["sweep"]["name"] == "done" and data["progress"]["done"] == 24 == data["progress"]["total"]
    assert [a["name"] for a in data["arms"]] == ["ar", "mtp", "eagle", "lumotree"]
    matrix = client.get(f"/api/sweeps/{done}/matrix").json()
    cells = [[c for row in matrix["rows"] for c in row["cells"][j]] for j in range(4)]
    resolved_in_matrix = [sum(c[3] is True for c in column) for column in cells]
    assert resolved_in_matrix == [a["resolved"] for a in data["arms"]]
    for arm in data["arms"]:
        ci = wilson_interval(arm["resolved"], arm["done"])
        assert arm["done"] == 6
        assert (arm["solve_low"], arm["solve_high"]) == pytest.approx((ci.low, ci.high))
        assert arm["tok_s_min"] <= arm["decode_tok_s"] <= arm["tok_s_max"]
    # AR has no speculation; the others follow vLLM's acceptance definitions.
    assert data["arms"][0]["acceptance_length"] is None
    mtp = data["arms"][1]
    assert mtp["acceptance_length"] == pytest.approx(1 + mtp["accepted_tokens"] / mtp["drafts"])
    sc = data["scatter"]
    assert sc["name"] == ["ar", "mtp", "eagle", "lumotree"] and len(sc["x"]) == len(sc["y"]) == 4
    assert all(m >= 0 and p >= 0 for m, p in zip(sc["y_minus"], sc["y_plus"], strict=True))


def test_matrix_covers_every_attempt_once(filled: tuple[Store, int, int]) -> None:
    store, done, running = filled
    client = TestClient(create_app(store=store))
    for sweep, total in ((done, 24), (running, 8)):
        m = client.get(f"/api/sweeps/{sweep}/matrix").json()
        ids = [c[0] for row in m["rows"] for cells in row["cells"] for c in cells]
        assert len(ids) == len(set(ids)) == total
        assert all(len(row["cells"]) == len(m["arm_ids"]) == 4 for row in m["rows"])
    live = client.get(f"/api/sweeps/{running}").json()
    assert live["sweep"]["status"] == "running" and live["progress"]["pending"] == 3


def test_pages_render_and_link(filled: tuple[Store, int, int]) -> None:
    store, done, _ = filled
    client = TestClient(create_app(store=store))
    index = client.get("/")
    assert index.status_code == 200 and f'href="/sweeps/{done}"' in index.text
    page = client.get(f"/sweeps/{done}")
    assert page.status_code == 200 and "Server-Timing" in page.headers
    assert 'src="/static/plotly.min.js"' in page.text and "cdn" not in page.text.lower()
    task_links = re.findall(r'href="(/sweeps/\d+/tasks/\d+)"', page.text)
    assert len(task_links) == 3
    task = client.get(task_links[0])
    attempt_links = re.findall(r'href="(/attempts/\d+)"', task.text)
    assert task.status_code == 200 and len(attempt_links) == 8  # 4 arms x 2 attempts
    attempt = client.get(attempt_links[0])
    assert attempt.status_code == 200 and "ls -la" in attempt.text and 'id="trace"' in attempt.text
    assert client.get("/replays").status_code == 200
    assert client.get("/attempts/999999").status_code == 404
    assert client.get("/api/sweeps/999999").json() == {"detail": "sweep not found"}


def test_attempt_json_histogram_and_html_escaping(store: Store) -> None:
    sweep = store.create_sweep("esc", {})
    arm = store.upsert_arm(sweep, "mtp")
    task = store.upsert_task("s", "t<1>")
    store.plan_attempts(sweep, [arm], [task], 1)
    claim = store.claim_attempt(sweep, "w")
    assert claim is not None
    for i, per_pos in enumerate(([4, 3, 1], [2, 2, 0])):
        store.record_request(
            claim.attempt_id,
            RequestRecord(
                index=i,
                completion_tokens=20,
                drafts=4,
                draft_tokens=12,
                accepted_tokens=sum(per_pos),
                accepted_per_position=per_pos,
                decode_seconds=2.0,
            ),
        )
    store.record_event(
        claim.attempt_id, "message", {"role": "assistant", "content": "<script>alert(1)</script>"}
    )
    store.finish_attempt(
        claim.attempt_id, "w", AttemptResult(resolved=False, drafts=8, draft_tokens=24, accepted_tokens=12)
    )
    client = TestClient(create_app(store=store))
    data = client.get(f"/api/attempts/{claim.attempt_id}").json()
    hist = data["acceptance_histogram"]
    assert hist == {"position": [1, 2, 3], "accepted": [6, 5, 1], "rate": [6 / 8, 5 / 8, 1 / 8], "drafts": 8}
    assert [r["decode_tok_s"] for r in data["request_rows"]] == [10.0, 10.0]
    assert "prompt_token_ids" not in data["request_rows"][0]
    html = client.get(f"/attempts/{claim.attempt_id}").text
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_replay_pages(store: Store) -> None:
    replay = store.create_replay("corpus.jsonl", {"runs": 2})
    for run, (tokens, seconds) in enumerate(((100, 4.0), (100, 5.0))):
        store.record_replay_result(
            replay,
            "mtp",
            run,
            completion_tokens=tokens,
            decode_seconds=seconds,
            pooled_tok_s=tokens / seconds,
            acceptance_length=3.0,
            per_position=[0.8, 0.5],
        )
    client = TestClient(create_app(store=store))
    data = client.get(f"/api/replays/{replay}").json()
    (summary,) = data["summary"]
    assert summary["pooled_tok_s"] == pytest.approx(200 / 9) and summary["min_tok_s"] == 20.0
    assert summary["max_tok_s"] == 25.0 and summary["per_position"] == [0.8, 0.5]
    assert client.get(f"/replays/{replay}").status_code == 200
    assert client.get("/api/replays").json()["replays"][0]["corpus"] == "corpus.jsonl"


def test_plotly_is_served_from_the_package(store: Store) -> None:
    client = TestClient(create_app(store=store))
    js = client.get("/static/plotly.min.js")
    assert js.status_code == 200 and js.content == plotly_js_path().read_bytes()
    assert client.get("/static/app/dashboard.js").status_code == 200
    assert client.get("/healthz").json() == {"status": "ok"}

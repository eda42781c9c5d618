"""Replay corpora (from a recorded sweep, JSONL round trip, clear errors) and the replay arithmetic."""

from __future__ import annotations

from pathlib import Path

import pytest

from lumotree.agents.protocols import DecodeStats
from lumotree.db.store import AttemptResult, RequestRecord, Store
from lumotree.platform.replay import (
    CorpusRequest,
    RunResult,
    corpus_from_sweep,
    export_corpus,
    import_corpus,
    summarize_replay,
)


def test_corpus_from_sweep_and_jsonl_round_trip(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'runs.db'}")
    sweep = store.create_sweep("s", {})
    arms = [store.upsert_arm(sweep, n) for n in ("ar", "ext")]
    task = store.upsert_task("suite", "t-1", {})
    store.plan_attempts(sweep, arms, [task], attempts=1)
    owner = "test"
    for _ in arms:
        claim = store.claim_attempt(sweep, owner)
        assert claim is not None
        for i in range(2):
            # The external arm's requests carry no token ids: they cannot be replayed and are skipped.
            ids = [1, 2, 3 + i] if claim.arm_name == "ar" else []
            store.record_request(
                claim.attempt_id,
                RequestRecord(index=i, prompt_token_ids=ids, sampling_params={"temperature": 0.6}),
            )
        store.finish_attempt(claim.attempt_id, owner, AttemptResult(resolved=False, requests=2))
    corpus = corpus_from_sweep(store, sweep)
    assert [c.prompt_token_ids for c in corpus] == [[1, 2, 3], [1, 2, 4]]
    assert corpus[0].sampling == {"temperature": 0.6} and corpus[1].id.endswith("request:1")
    assert corpus_from_sweep(store, sweep, arm="ext") == []
    assert len(corpus_from_sweep(store, sweep, limit=1)) == 1
    path = tmp_path / "corpus.jsonl"
    assert export_corpus(corpus, path) == 2
    assert import_corpus(path) == corpus


def test_corpus_errors_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "a", "prompt_token_ids": [1]}\n{"id": "b"}\n')
    with pytest.raises(ValueError, match="line 2"):
        import_corpus(path)
    with pytest.raises(AssertionError):
        CorpusRequest("empty", [])


def test_summary_pools_tokens_over_seconds_not_rates() -> None:
    def run(arm: str, i: int, tokens: int, seconds: float, drafts: int = 0, accepted: int = 0) -> RunResult:
        stats = DecodeStats(
            tokens=tokens,
            steps=tokens - accepted,
            decode_seconds=seconds,
            drafts=drafts,
            draft_tokens=drafts * 3,
            accepted_tokens=accepted,
            accepted_per_position=[accepted - accepted // 3, accepted // 3] if drafts else [],
        )
        return RunResult(arm, i, stats, requests=2, wall_seconds=seconds)

    results = [
        run("ar", 0, 100, 10.0),
        run("ar", 1, 100, 30.0),
        run("mtp", 0, 120, 6.0, 40, 60),
        run("mtp", 1, 120, 6.0, 40, 60),
    ]
    summary = summarize_replay(results)
    ar, mtp = summary["arms"]["ar"], summary["arms"]["mtp"]
    assert ar["pooled_tok_s"] == pytest.approx(200 / 40)  # not the mean of 10 and 3.33
    assert (ar["tok_s_min"], ar["tok_s_max"]) == pytest.approx((100 / 30, 10.0))
    assert ar["acceptance_length"] is None
    assert mtp["acceptance_length"] == pytest.approx(1 + 120 / 80)
    assert mtp["per_position"] == pytest.approx([80 / 80, 40 / 80])
    assert summary["ratios"]["mtp/ar"] == pytest.approx(20 / 5)

"""The Store's write path: planning, claims, leases, finishing, retries, requests and events."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest
from sqlalchemy import select

from lumotree.db import models as m
from lumotree.db.store import AttemptResult, RequestRecord, Store


def _sweep(
    store: Store, arms: int = 2, tasks: int = 3, attempts: int = 2
) -> tuple[int, list[int], list[int]]:
    sweep = store.create_sweep("t", {"attempts": attempts})
    arm_ids = [store.upsert_arm(sweep, f"arm{i}", model="tiny", git_commit="abc") for i in range(arms)]
    task_ids = [store.upsert_task("suite", f"inst-{i}", {"repo": "r"}) for i in range(tasks)]
    assert store.plan_attempts(sweep, arm_ids, task_ids, attempts) == arms * tasks * attempts
    return sweep, arm_ids, task_ids


def test_plan_and_upserts_are_idempotent(store: Store) -> None:
    sweep, arm_ids, task_ids = _sweep(store)
    assert store.plan_attempts(sweep, arm_ids, task_ids, 2) == 0
    # Growing the sweep plans only the new cells.
    assert store.plan_attempts(sweep, arm_ids, task_ids, 3) == len(arm_ids) * len(task_ids)
    assert store.upsert_arm(sweep, "arm0", model="other", config={"k": 5}) == arm_ids[0]
    assert store.upsert_task("suite", "inst-0") == task_ids[0]
    with store.session() as s:
        arm = s.get(m.Arm, arm_ids[0])
        assert arm is not None and arm.model == "other" and arm.config == {"k": 5}
        assert s.get(m.Task, task_ids[0]).data == {"repo": "r"}  # data=None keeps the stored instance
    assert store.progress(sweep)["pending"] == 18
    assert store.find_sweep("t") == sweep


def test_claims_cover_every_cell_once_then_none(store: Store) -> None:
    sweep, _, _ = _sweep(store)
    claims = []
    while (claim := store.claim_attempt(sweep, "w")) is not None:
        claims.append(claim)
    assert len(claims) == 12 and len({c.attempt_id for c in claims}) == 12
    cells = {(c.arm_id, c.task_id, c.attempt_index) for c in claims}
    assert len(cells) == 12
    # First attempts of every cell come before second attempts.
    assert [c.attempt_index for c in claims] == [0] * 6 + [1] * 6
    assert all(c.tries == 1 and c.owner == "w" and c.suite == "suite" for c in claims)
    assert store.progress(sweep)["running"] == 12


def test_concurrent_claims_never_share_an_attempt(store: Store) -> None:
    sweep, _, _ = _sweep(store, arms=3, tasks=4, attempts=2)
    got: dict[str, list[int]] = {}
    errors: list[BaseException] = []
    # Count the candidate lookups: a claimer that loses the compare-and-set looks again. Concurrent
    # claimers must not collide on one row (CI once saw a claimer lose 20 rounds in a row on PostgreSQL).
    lookups = []
    find = store._candidate

    def counted(*args: object) -> int | None:
        lookups.append(1)
        return find(*args)  # type: ignore[arg-type]

    store._candidate = counted  # type: ignore[method-assign]

    def worker(name: str) -> None:
        try:
            got[name] = []
            while (claim := store.claim_attempt(sweep, name)) is not None:
                got[name].append(claim.attempt_id)
                assert store.finish_attempt(claim.attempt_id, name, AttemptResult(resolved=False))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    ids = [i for ids in got.values() for i in ids]
    assert len(ids) == 24 and len(set(ids)) == 24
    assert store.progress(sweep)["done"] == 24
    assert len(lookups) == 24 + len(threads), "claimers raced for the same attempt"


def test_expired_lease_is_reclaimed_and_stale_owner_is_fenced(store: Store) -> None:
    sweep, _, _ = _sweep(store, arms=1, tasks=1, attempts=1)
    # The lease must outlive the writes below even on a loaded 2-core machine, then expire for real.
    dead = store.claim_attempt(sweep, "dead", lease_seconds=1.5)
    assert dead is not None
    store.record_request(dead.attempt_id, RequestRecord(index=0, completion_tokens=5))
    store.record_event(dead.attempt_id, "message", {"role": "assistant", "content": "half"})
    assert store.claim_attempt(sweep, "alive") is None  # lease still live
    time.sleep(1.6)
    alive = store.claim_attempt(sweep, "alive")
    assert alive is not None and alive.attempt_id == dead.attempt_id and alive.tries == 2
    # The dead try's partial trace is gone; the stale owner can no longer write a result or renew.
    with store.session() as s:
        assert s.scalars(select(m.Request).where(m.Request.attempt_id == alive.attempt_id)).all() == []
        assert s.scalars(select(m.AgentEvent).where(m.AgentEvent.attempt_id == alive.attempt_id)).all() == []
    assert not store.finish_attempt(dead.attempt_id, "dead", AttemptResult(resolved=True))
    assert not store.renew_lease(dead.attempt_id, "dead")
    assert store.renew_lease(alive.attempt_id, "alive", 60)
    assert store.finish_attempt(
        alive.attempt_id, "alive", AttemptResult(resolved=False, exit_status="submitted")
    )
    # Finishing twice is harmless; the stale owner's late result still loses.
    assert store.finish_attempt(alive.attempt_id, "alive", AttemptResult(resolved=False))
    assert not store.finish_attempt(alive.attempt_id, "dead", AttemptResult(resolved=True))
    with store.session() as s:
        att = s.get(m.Attempt, alive.attempt_id)
        assert att is not None and att.status == m.DONE and att.resolved is False and att.owner == "alive"


def test_errors_retry_up_to_max_tries(store: Store) -> None:
    sweep, _, _ = _sweep(store, arms=1, tasks=1, attempts=1)
    for attempt in range(1, 4):
        claim = store.claim_attempt(sweep, "w", max_tries=3)
        assert claim is not None and claim.tries == attempt
        assert store.fail_attempt(claim.attempt_id, "w", f"boom {attempt}")
    assert store.claim_attempt(sweep, "w", max_tries=3) is None
    assert store.progress(sweep)["error"] == 1
    claim = store.claim_attempt(sweep, "w", max_tries=4)
    assert claim is not None and claim.tries == 4


def test_release_and_start_specific_cell(store: Store) -> None:
    sweep, arm_ids, task_ids = _sweep(store, arms=2, tasks=1, attempts=1)
    claim = store.start_attempt(sweep, arm_ids[1], task_ids[0], 0, "w")
    assert claim is not None and claim.arm_id == arm_ids[1] and claim.arm_name == "arm1"
    assert store.start_attempt(sweep, arm_ids[1], task_ids[0], 0, "other") is None
    assert store.release_attempt(claim.attempt_id, "w")
    again = store.claim_attempt(sweep, "x", arm_ids=[arm_ids[1]])
    assert again is not None and again.attempt_id == claim.attempt_id and again.tries == 1
    with pytest.raises(KeyError):
        store.start_attempt(sweep, arm_ids[0], task_ids[0], 7, "w")


def test_finish_stores_result_and_vllm_acceptance(store: Store) -> None:
    sweep, _, _ = _sweep(store, arms=1, tasks=1, attempts=1)
    claim = store.claim_attempt(sweep, "w")
    assert claim is not None
    result = AttemptResult(
        resolved=True,
        exit_status="submitted",
        patch="diff --git a/x b/x\n",
        requests=3,
        prompt_tokens=300,
        completion_tokens=120,
        decode_tok_s=24.0,
        decode_seconds=5.0,
        drafts=20,
        draft_tokens=100,
        accepted_tokens=64,
        wall_seconds=9.5,
        agent_seconds=8.0,
        eval_seconds=1.5,
        extra={"fail_to_pass": [1, 1]},
    )
    assert store.finish_attempt(claim.attempt_id, "w", result)
    with store.session() as s:
        att = s.get(m.Attempt, claim.attempt_id)
        assert att is not None
        assert (att.acceptance_rate, att.acceptance_length) == (
            pytest.approx(0.64),
            pytest.approx(1 + 64 / 20),
        )
        assert att.patch == "diff --git a/x b/x\n" and att.extra == {"fail_to_pass": [1, 1]}
        assert att.finished is not None and att.finished.tzinfo is not None
        assert abs(att.finished - dt.datetime.now(dt.timezone.utc)) < dt.timedelta(minutes=5)
    assert store.progress(sweep) == {
        "pending": 0,
        "running": 0,
        "done": 1,
        "error": 0,
        "total": 1,
        "resolved": 1,
    }


def test_requests_and_events_round_trip_and_upsert(store: Store) -> None:
    sweep, _, _ = _sweep(store, arms=1, tasks=1, attempts=1)
    claim = store.claim_attempt(sweep, "w")
    assert claim is not None
    rec = RequestRecord(
        index=0,
        prompt_tokens=7,
        completion_tokens=9,
        steps=3,
        drafts=3,
        draft_tokens=15,
        accepted_tokens=6,
        accepted_per_position=[3, 2, 1, 0, 0],
        spans={"draft": 0.1, "verify": 0.2},
        timings={"ttft": 0.01},
        decode_seconds=0.4,
        prompt_token_ids=[1, 2, 3, 248000],
        sampling_params={"temperature": 0.6, "top_k": 20, "stop": ["</s>"]},
        text="héllo ```bash\nls\n```",
        finish_reason="stop",
    )
    first = store.record_request(claim.attempt_id, rec)
    rec.completion_tokens = 10
    assert store.record_request(claim.attempt_id, rec) == first  # same index: replaced, not duplicated
    assert store.record_event(claim.attempt_id, "message", {"role": "system", "content": "s"}) == 0
    assert store.record_event(claim.attempt_id, "command", {"command": "ls", "output": "a\nb"}) == 1
    assert store.record_event(claim.attempt_id, "message", {"role": "user", "content": "u2"}, seq=1) == 1
    with store.session() as s:
        reqs = s.scalars(select(m.Request).where(m.Request.attempt_id == claim.attempt_id)).all()
        assert len(reqs) == 1
        r = reqs[0]
        assert r.completion_tokens == 10 and r.prompt_token_ids == [1, 2, 3, 248000]
        assert r.sampling_params == {"temperature": 0.6, "top_k": 20, "stop": ["</s>"]}
        assert r.accepted_per_position == [3, 2, 1, 0, 0] and r.text.startswith("héllo")
        events = s.scalars(
            select(m.AgentEvent).where(m.AgentEvent.attempt_id == claim.attempt_id).order_by(m.AgentEvent.seq)
        ).all()
        assert [(e.seq, e.kind, e.payload["content"]) for e in events] == [
            (0, "message", "s"),
            (1, "message", "u2"),
        ]


def test_invariants_reject_bad_counters() -> None:
    with pytest.raises(AssertionError):
        AttemptResult(draft_tokens=5, accepted_tokens=6)
    with pytest.raises(AssertionError):
        RequestRecord(index=-1)


def test_replay_results_upsert(store: Store) -> None:
    replay = store.create_replay("corpus.jsonl", {"runs": 2})
    rid = store.record_replay_result(replay, "mtp", 0, pooled_tok_s=25.0, per_position=[0.9, 0.7])
    assert store.record_replay_result(replay, "mtp", 0, pooled_tok_s=26.0) == rid
    store.record_replay_result(replay, "ar", 0, pooled_tok_s=10.0)
    with store.session() as s:
        run = s.get(m.ReplayRun, replay)
        assert run is not None
        assert [(r.arm, r.pooled_tok_s, r.per_position) for r in run.results] == [
            ("ar", 10.0, []),
            ("mtp", 26.0, [0.9, 0.7]),
        ]
    with pytest.raises(AssertionError):
        store.record_replay_result(replay, "ar", 1, not_a_field=1)

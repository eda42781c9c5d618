"""Decode counters scraped from the engine's real Prometheus text, and counter differences."""

from __future__ import annotations

from lumotree.agents.clients import OpenAIModel, counter_delta, scrape_counters


def test_scrape_engine_metrics_and_delta() -> None:
    from lumotree.serving.metrics import EngineCounters, prometheus_text

    c = EngineCounters(generation_tokens=50, decode_steps=20, decode_seconds=2.5, drafts=18, draft_tokens=90)
    c.accepted_tokens = 30
    for depth in (3, 2, 1, 3):
        c.add_accepted_depths(depth)
    before = scrape_counters(prometheus_text(c, "lumo-tiny", "mtp", 0, 0))
    assert before["drafts"] == 18 and before["draft_tokens"] == 90 and before["accepted_tokens"] == 30
    assert before["tokens"] == 50 and before["steps"] == 20 and before["decode_seconds"] == 2.5
    assert before["accepted_per_position"] == [4, 3, 2]
    c.generation_tokens += 7
    c.drafts += 2
    c.decode_seconds += 0.5
    c.add_accepted_depths(4)
    after = scrape_counters(prometheus_text(c, "lumo-tiny", "mtp", 0, 0))
    delta = counter_delta(before, after)
    assert delta["tokens"] == 7 and delta["drafts"] == 2 and abs(delta["decode_seconds"] - 0.5) < 1e-9
    assert delta["accepted_per_position"] == [1, 1, 1, 1]
    stats = OpenAIModel._stats(before, after, completion=7, decode_wall=9.0)
    assert stats.tokens == 7 and abs(stats.decode_seconds - 0.5) < 1e-9  # the server's time, not the client's
    assert OpenAIModel._stats(None, None, completion=7, decode_wall=9.0).decode_seconds == 9.0

"""The end-of-sweep summary per arm: solve rate with its Wilson interval and Fisher's p against the first arm,
requests, tokens, pooled decode rate, acceptance and minutes (the paper's agent-study table + statistics)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from lumotree.db import queries
from lumotree.db.store import Store
from lumotree.platform.stats import fisher_resolved, wilson_interval


def summarize(store: Store, sweep_id: int) -> list[dict[str, Any]]:
    """One JSON-ready row per arm, in the sweep's arm order (the first arm is the p-values' reference)."""
    with store.session() as s:
        arms = queries.arm_stats(s, sweep_id)
    rows: list[dict[str, Any]] = []
    for arm in arms:
        done, resolved = int(arm["done"]), int(arm["resolved"])
        interval = wilson_interval(resolved, done)
        rows.append(
            {
                "arm": arm["name"],
                "attempts": int(arm["attempts"]),
                "done": done,
                "errors": int(arm["error"]),
                "resolved": resolved,
                "solve_rate": interval.estimate,
                "wilson_low": interval.low,
                "wilson_high": interval.high,
                "requests": int(arm["requests"]),
                "prompt_tokens": int(arm["prompt_tokens"]),
                "completion_tokens": int(arm["completion_tokens"]),
                "decode_tok_s": arm["decode_tok_s"],
                "tok_s_min": arm["tok_s_min"],
                "tok_s_max": arm["tok_s_max"],
                "acceptance_length": arm["acceptance_length"],
                "acceptance_rate": arm["acceptance_rate"],
                "minutes": float(arm["wall_seconds"]) / 60.0,
            }
        )
    if rows:
        ref = rows[0]
        for row in rows:
            row["fisher_p_vs_first"] = fisher_resolved(
                row["resolved"], row["done"], ref["resolved"], ref["done"]
            )
    return rows


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def summary_table(rows: list[dict[str, Any]], title: str = "") -> Table:
    ref = rows[0]["arm"] if rows else ""
    table = Table(title=title, title_justify="left")
    for header, justify in [
        ("arm", "left"),
        ("done", "right"),
        ("resolved", "right"),
        ("rate [95% CI]", "right"),
        (f"p vs {ref}", "right"),
        ("requests", "right"),
        ("tokens", "right"),
        ("tok/s", "right"),
        ("range", "right"),
        ("accept", "right"),
        ("min", "right"),
    ]:
        table.add_column(header, justify=justify)  # type: ignore[arg-type]
    for r in rows:
        table.add_row(
            r["arm"],
            f"{r['done']}/{r['attempts']}" + (f" ({r['errors']} err)" if r["errors"] else ""),
            str(r["resolved"]),
            f"{r['solve_rate']:.2f} [{r['wilson_low']:.2f}, {r['wilson_high']:.2f}]",
            "-" if r["arm"] == ref else f"{r['fisher_p_vs_first']:.3f}",
            str(r["requests"]),
            f"{r['completion_tokens']:,}",
            _num(r["decode_tok_s"], ".2f"),
            f"{_num(r['tok_s_min'], '.1f')}-{_num(r['tok_s_max'], '.1f')}",
            _num(r["acceptance_length"], ".2f"),
            f"{r['minutes']:.1f}",
        )
    return table

"""Audit reports: named checks with value, bound and verdict, tables, and the run's provenance.

One report per audit, written as ``audit_<name>.json`` plus a Markdown rendering (``audit_<name>.md``) and
printed as rich tables. ``passed`` is the conjunction of every check, which decides the exit status.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Check:
    """One verdict: ``value`` compared with ``bound`` (their meaning is in ``detail``)."""

    name: str
    passed: bool
    value: Any = None
    bound: Any = None
    detail: str = ""


@dataclass
class AuditReport:
    """Everything one audit found."""

    audit: str
    """gdn, model or sampler."""
    config: dict[str, Any]
    """The audit's configuration (shapes, counts, seeds) as run."""
    checks: list[Check] = field(default_factory=list)
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Named tables (rows of equal keys), e.g. per schedule or per fault."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Provenance: machine, device, commit, versions, seconds."""

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    def check(self, name: str, passed: bool, value: Any = None, bound: Any = None, detail: str = "") -> bool:
        self.checks.append(Check(name, bool(passed), _plain(value), _plain(bound), detail))
        return bool(passed)

    def to_dict(self) -> dict[str, Any]:
        return _plain(
            {
                "audit": self.audit,
                "passed": self.passed,
                "config": self.config,
                "checks": [asdict(c) for c in self.checks],
                "tables": self.tables,
                "meta": self.meta,
            }
        )

    def write(self, out_dir: str | Path) -> list[Path]:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        js, md = out / f"audit_{self.audit}.json", out / f"audit_{self.audit}.md"
        js.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        md.write_text(self.markdown())
        return [js, md]

    def markdown(self) -> str:
        lines = [f"### audit {self.audit}: {'PASS' if self.passed else 'FAIL'}", ""]
        lines += _md_table(
            [
                {
                    "check": c.name,
                    "result": "pass" if c.passed else "FAIL",
                    "value": _fmt(c.value),
                    "bound": _fmt(c.bound),
                    "detail": c.detail,
                }
                for c in self.checks
            ]
        )
        for name, rows in self.tables.items():
            lines += ["", f"**{name}**", ""] + _md_table([{k: _fmt(v) for k, v in r.items()} for r in rows])
        lines += ["", "Run: " + ", ".join(f"{k} {_fmt(v)}" for k, v in self.meta.items()), ""]
        return "\n".join(lines)

    def render(self, console: Any) -> None:
        """Print the checks and tables with rich."""
        from rich.table import Table

        t = Table(title=f"audit {self.audit}: {'PASS' if self.passed else 'FAIL'}")
        for col in ("check", "result", "value", "bound", "detail"):
            t.add_column(col, overflow="fold")
        for c in self.checks:
            t.add_row(
                c.name,
                "[green]pass[/green]" if c.passed else "[red]FAIL[/red]",
                _fmt(c.value),
                _fmt(c.bound),
                c.detail,
            )
        console.print(t)
        for name, rows in self.tables.items():
            if not rows:
                continue
            tt = Table(title=name)
            for col in rows[0]:
                tt.add_column(str(col), overflow="fold")
            for r in rows:
                tt.add_row(*(_fmt(r.get(col)) for col in rows[0]))
            console.print(tt)


def _md_table(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    cols = list(rows[0])
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(str(r.get(c, "")).replace("|", "/") for c in cols) + " |" for r in rows]
    return out


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        if x == 0 or 1e-3 <= abs(x) < 1e5:
            return f"{x:.4g}"
        return f"{x:.3e}"
    if isinstance(x, list | tuple):
        return ", ".join(_fmt(v) for v in x)
    return "" if x is None else str(x)


def _plain(x: Any) -> Any:
    """JSON-safe copy: tensors and numpy scalars become Python numbers, tuples lists."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    if hasattr(x, "tolist"):
        return x.tolist()
    if isinstance(x, float) and x != x:
        return None
    return x

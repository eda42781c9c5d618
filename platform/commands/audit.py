"""``lumotree audit gdn|model|sampler|all``: the numerical audits, each writing a JSON and a Markdown
report and exiting non-zero when any check fails."""

from __future__ import annotations

import os
import time
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer


class Which(str, Enum):
    gdn = "gdn"
    model = "model"
    sampler = "sampler"
    all = "all"


# --quick: what CI runs (all three in well under 3 minutes on 2 CPU cores).
QUICK = {
    "gdn": {"cases": 8},
    "model": {"prefixes": 2, "cycles": 3, "fault_cycles": 2},
    "sampler": {"walks": 16384, "fault_walks": 8192, "min_visits": 1000, "vocab_cap": 64},
}


def register(app: typer.Typer) -> None:
    @app.command()
    def audit(
        which: Annotated[Which, typer.Argument(help="gdn, model, sampler or all.")],
        model: Annotated[str, typer.Option(help="Checkpoint directory or a built-in name (tiny).")] = "tiny",
        device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
        quick: Annotated[bool, typer.Option("--quick", help="Small CI-sized runs.")] = False,
        shapes: Annotated[str, typer.Option(help="GDN audit shapes: small or 27b.")] = "small",
        gdn_kernel: Annotated[
            str, typer.Option(help="GDN tree kernel: auto (what the model dispatches to), triton or ref.")
        ] = "auto",
        walks: Annotated[int | None, typer.Option(help="Sampler walks per step (default 200000).")] = None,
        vocab_cap: Annotated[
            int | None, typer.Option(help="Sampler: logit columns kept per step (0 = all; default 256).")
        ] = None,
        dtype: Annotated[str | None, typer.Option(help="Model dtype (default: the checkpoint's).")] = None,
        seed: Annotated[int, typer.Option(help="Seed of trees, inputs, prefixes and walks.")] = 0,
        as_json: Annotated[
            bool, typer.Option("--json", help="Print the reports as one JSON object.")
        ] = False,
        out: Annotated[Path, typer.Option(help="Directory for audit_<name>.json and .md.")] = Path("audits"),
    ) -> None:
        """Prove that the fast path computes what plain decoding computes (GDN scan, model, sampler)."""
        import json

        from rich.console import Console

        err = Console(stderr=True)
        if device == "cpu" and gdn_kernel == "triton":
            os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the Triton kernels are decorated
        import torch

        if device == "cpu":
            # The audits run many small ops; one thread avoids oversubscription on shared CPUs.
            torch.set_num_threads(1)
        if device.startswith("cuda") and not torch.cuda.is_available():
            err.print("[red]error:[/red] --device cuda but no CUDA device is visible")
            raise typer.Exit(2)
        from lumotree.platform.provenance import provenance

        names = ["gdn", "model", "sampler"] if which == Which.all else [which.value]
        reports = []
        loaded = None
        for name in names:
            started = time.time()
            try:
                if name in ("model", "sampler") and loaded is None:
                    from lumotree.platform.audits.capture import load

                    with err.status(f"loading {model}"):
                        loaded = load(model, device, dtype)
                rep = _run(
                    name, loaded, model, device, quick, shapes, gdn_kernel, walks, vocab_cap, dtype, seed, err
                )
            except (FileNotFoundError, ValueError, OSError) as e:
                err.print(f"[red]error:[/red] {e}")
                raise typer.Exit(2) from None
            rep.meta = provenance(device, started) | {
                "quick": quick,
                "model": model if name != "gdn" else None,
            }
            rep.write(out)
            if not as_json:
                rep.render(err)
            reports.append(rep)
        if as_json:
            print(json.dumps({r.audit: r.to_dict() for r in reports}))
        failed = [r.audit for r in reports if not r.passed]
        if failed:
            err.print(f"[red]audit failed:[/red] {', '.join(failed)} (reports in {out})")
            raise typer.Exit(1)
        err.print(f"[green]all checks passed[/green] ({', '.join(names)}; reports in {out})")


def _run(name, loaded, model, device, quick, shapes, gdn_kernel, walks, vocab_cap, dtype, seed, err):  # type: ignore[no-untyped-def]
    from rich.progress import Progress

    q = QUICK[name] if quick else {}
    with Progress(console=err, transient=True) as prog:
        if name == "gdn":
            from lumotree.platform.audits.gdn import GdnAuditConfig, run_gdn_audit

            cfg = GdnAuditConfig(shapes=shapes, device=device, kernel=gdn_kernel, seed=seed, **q)
            task = prog.add_task("gdn audit", total=2 * cfg.cases)
            return run_gdn_audit(cfg, lambda n: prog.advance(task, n))
        if name == "model":
            from lumotree.platform.audits.model import ModelAuditConfig, run_model_audit

            mcfg = ModelAuditConfig(model=model, device=device, dtype=dtype, seed=seed, **q)
            task = prog.add_task("model audit", total=3 * mcfg.prefixes * mcfg.cycles + 10)
            return run_model_audit(mcfg, loaded, lambda n: prog.advance(task, n))
        from lumotree.platform.audits.sampler import STEPS, SamplerAuditConfig, run_sampler_audit

        extra = dict(q)
        if walks is not None:
            extra.update(walks=walks, fault_walks=walks)
        if vocab_cap is not None:
            extra["vocab_cap"] = vocab_cap
        scfg = SamplerAuditConfig(model=model, device=device, seed=seed, **extra)
        task = prog.add_task("sampler audit", total=len(STEPS) * (1 + len(scfg.faults)))
        return run_sampler_audit(scfg, loaded, lambda n: prog.advance(task, n))

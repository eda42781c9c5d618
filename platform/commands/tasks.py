"""``lumotree tasks list|build|validate``: task suites, their offline-built images, and their validation."""

from __future__ import annotations

import json
import sys
import time
from typing import Annotated, Any

import typer

# The options every tasks command takes.
SuiteOpt = Annotated[str, typer.Option(help="Task suite (astropy-synth, swebench-astropy, ...).")]
LimitOpt = Annotated[int | None, typer.Option(min=1, help="Only the suite's first N instances.")]
DatasetOpt = Annotated[
    str | None, typer.Option(help="Instance file (JSONL, JSON or parquet) for suites that read one.")
]
SeedOpt = Annotated[int | None, typer.Option(help="Generation seed (synthesized suites).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def _suite(name: str, dataset: str | None, seed: int | None, quiet: bool) -> Any:
    from rich.console import Console

    from lumotree.tasks.api import InstanceError, get_suite

    err = Console(stderr=True)
    log = None if quiet else (lambda msg: err.print(f"[dim]{msg}[/dim]"))
    try:
        return get_suite(name, dataset=dataset, seed=seed, log=log)
    except (KeyError, InstanceError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None


def _instances(suite: Any, limit: int | None) -> list[Any]:
    from rich.console import Console

    from lumotree.tasks.api import InstanceError

    try:
        return suite.instances(limit=limit)
    except (InstanceError, RuntimeError) as exc:
        Console(stderr=True).print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None


def register(app: typer.Typer) -> None:
    tasks_app = typer.Typer(no_args_is_help=True, help="Task suites: list instances, build images, validate.")

    @tasks_app.command("list")
    def list_(
        suite: SuiteOpt = "astropy-synth",
        limit: LimitOpt = None,
        dataset: DatasetOpt = None,
        seed: SeedOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        """List a suite's instances (generating them first if a synthesized suite has none cached)."""
        s = _suite(suite, dataset, seed, as_json)
        rows = [
            {
                "instance_id": i.instance_id,
                "version": i.version,
                "fail_to_pass": len(i.FAIL_TO_PASS),
                "pass_to_pass": len(i.PASS_TO_PASS),
                "test_files": i.test_files(),
            }
            for i in _instances(s, limit)
        ]
        if as_json:
            print(json.dumps({"suite": suite, "instances": rows}, indent=1))
            return
        from rich.console import Console
        from rich.table import Table

        table = Table(
            "instance_id", "version", "F2P", "P2P", "test files", title=f"{suite}: {len(rows)} instances"
        )
        for r in rows:
            table.add_row(
                r["instance_id"],
                r["version"],
                str(r["fail_to_pass"]),
                str(r["pass_to_pass"]),
                " ".join(r["test_files"]),
            )
        Console().print(table)

    @tasks_app.command()
    def build(
        suite: SuiteOpt = "astropy-synth",
        limit: LimitOpt = None,
        dataset: DatasetOpt = None,
        seed: SeedOpt = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Build (or find, by content hash) the images of a suite's instances."""
        s = _suite(suite, dataset, seed, as_json)
        insts = _instances(s, limit)
        images: dict[str, str] = {}
        failed: dict[str, str] = {}
        t0 = time.monotonic()
        from rich.progress import Progress

        with Progress(disable=as_json, transient=True) as progress:
            task = progress.add_task("building images", total=len(insts))
            for inst in insts:
                try:
                    images[inst.instance_id] = s.image_for(inst, build=True)
                except Exception as exc:  # noqa: BLE001 - report every failure, keep building the rest
                    failed[inst.instance_id] = f"{type(exc).__name__}: {exc}"[:2000]
                progress.advance(task)
        out = {"suite": suite, "images": images, "failed": failed, "seconds": round(time.monotonic() - t0, 1)}
        if as_json:
            print(json.dumps(out, indent=1))
        else:
            from rich.console import Console

            con = Console()
            con.print(f"{len(images)} images ready, {len(failed)} failed, in {out['seconds']} s")
            for iid, why in failed.items():
                con.print(f"[red]{iid}[/red]: {why}")
        if failed:
            raise typer.Exit(1)

    @tasks_app.command()
    def validate(
        suite: SuiteOpt = "astropy-synth",
        limit: LimitOpt = None,
        dataset: DatasetOpt = None,
        seed: SeedOpt = None,
        as_json: JsonOpt = False,
        output: str | None = typer.Option(None, help="Also write the JSON report to this file."),
    ) -> None:
        """Run the gold patch and the empty patch per instance: valid = gold resolves, empty does not."""
        from rich.console import Console
        from rich.progress import Progress

        from lumotree.tasks.validate import validate as run_validate

        s = _suite(suite, dataset, seed, as_json)
        insts = _instances(s, limit)
        err = Console(stderr=True)
        with Progress(console=err, transient=True) as progress:
            task = progress.add_task(f"validating {len(insts)} instances", total=len(insts))

            def step(row: Any) -> None:
                mark = "[green]valid[/green]" if row.valid else f"[red]invalid[/red] {row.reason}"
                if not as_json:
                    err.print(f"{row.instance_id}: {mark}")
                progress.advance(task)

            report = run_validate(s, insts, progress=step)
        text = json.dumps(report, indent=1)
        if output:
            from pathlib import Path

            Path(output).write_text(text + "\n")
        if as_json:
            print(text)
        else:
            Console().print(f"{report['valid_count']}/{len(insts)} instances valid")
        sys.stdout.flush()
        if report["valid_count"] < len(insts):
            raise typer.Exit(1)

    app.add_typer(tasks_app, name="tasks")

"""``lumotree sweep``: run a coding-agent sweep across arms and print the per-arm summary."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import typer

from lumotree.platform.db_options import db_option


def parse_arm_urls(values: list[str]) -> list[dict[str, Any]]:
    out = []
    for value in values:
        name, sep, url = value.partition("=")
        if not sep or not name or not url:
            raise typer.BadParameter(f"expected NAME=URL, got {value!r}", param_hint="--arm-url")
        out.append({"name": name, "kind": "url", "url": url})
    return out


def parse_arm_scripts(values: list[str]) -> list[dict[str, Any]]:
    out = []
    for value in values:
        name, sep, path = value.partition("=")
        if not sep:
            raise typer.BadParameter(f"expected NAME=FILE, got {value!r}", param_hint="--arm-script")
        data = json.loads(Path(path).read_text())
        replies, delay = (
            (data, 0.0) if isinstance(data, list) else (data["replies"], data.get("delay_s", 0.0))
        )
        out.append({"name": name, "kind": "scripted", "script": replies, "delay_s": delay})
    return out


def register(app: typer.Typer) -> None:
    @app.command()
    def sweep(
        arms: str = typer.Option("ar,mtp,eagle,lumotree", help="Engine arms, comma separated ('' for none)."),
        suite: str = typer.Option("astropy-synth", help="Task suite."),
        attempts: int = typer.Option(2, min=1, help="Attempts per arm and task."),
        limit: int | None = typer.Option(None, min=1, help="Use only the suite's first N tasks."),
        db: str | None = db_option(),
        ray_address: str | None = typer.Option(
            None, help="Join this Ray cluster instead of starting a local one."
        ),
        model: str = typer.Option("tiny", help="Model path, or 'tiny' for the built-in model."),
        name: str | None = typer.Option(None, help="Sweep name (default: suite and arms)."),
        resume: str | None = typer.Option(
            None, help="Resume the sweep with this id (or name); its config is reused."
        ),
        arm_url: list[str] = typer.Option([], help="Add an OpenAI-compatible server as an arm: NAME=URL."),
        arm_script: list[str] = typer.Option(
            [], hidden=True, help="Test only: a scripted arm NAME=FILE.json."
        ),
        device: str | None = typer.Option(
            None, help="Engine device, cuda or cpu (default: cuda when available)."
        ),
        mtp_k: int | None = typer.Option(None, help="Draft length of the mtp arm (1/3/5/7)."),
        draft_vocab: int | None = typer.Option(
            None, min=0, help="Speculative arms draft among the first N token ids only (0 = all)."
        ),
        sandboxes: int = typer.Option(2, min=1, help="Attempts running at once."),
        arm_concurrency: int = typer.Option(1, min=1, help="Attempts running at once per arm."),
        max_tries: int = typer.Option(3, min=1, help="Tries per attempt after infrastructure failures."),
        lease_seconds: float = typer.Option(60.0, help="Lease of a running attempt (renewed while it runs)."),
        step_limit: int = typer.Option(30, min=1, help="Model calls per attempt."),
        max_tokens: int = typer.Option(1024, min=1, help="Completion tokens per model call."),
        command_timeout: float = typer.Option(60.0, help="Seconds per agent command."),
        wall_limit: float = typer.Option(1800.0, help="Wall seconds per attempt."),
        as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON instead of a table."),
    ) -> None:
        """Run arms x tasks x attempts with the bash agent; resumable; ends with a summary per arm."""
        from lumotree.agents.config import AgentConfig, SamplingConfig
        from lumotree.db.store import Store
        from lumotree.platform.sweep_config import ArmSpec, SweepConfig

        store = Store(db)  # None: lumotree.db.engine.default_url()
        if resume is not None:
            sweep_id = int(resume) if resume.isdigit() else store.find_sweep(resume)
            row = store.get_sweep(sweep_id) if sweep_id is not None else None
            if row is None:
                raise typer.BadParameter(f"no sweep {resume!r} in the database", param_hint="--resume")
            config = SweepConfig.model_validate(row.config)
        else:
            options: dict[str, Any] = {
                k: v
                for k, v in {"device": device, "mtp_k": mtp_k, "draft_vocab": draft_vocab}.items()
                if v is not None
            }
            specs = [
                {"name": a, "model": model, "options": options}
                for a in (x.strip() for x in arms.split(","))
                if a
            ]
            specs += parse_arm_urls(arm_url) + parse_arm_scripts(arm_script)
            agent = AgentConfig(
                step_limit=step_limit,
                command_timeout_s=command_timeout,
                wall_limit_s=wall_limit,
                sampling=SamplingConfig(max_tokens=max_tokens),
            )
            try:
                config = SweepConfig(
                    name=name or f"{suite} x {','.join(str(s['name']) for s in specs)}",
                    suite=suite,
                    arms=[ArmSpec.model_validate(s) for s in specs],
                    attempts=attempts,
                    limit=limit,
                    sandboxes=sandboxes,
                    arm_concurrency=arm_concurrency,
                    max_tries=max_tries,
                    lease_s=lease_seconds,
                    agent=agent,
                )
            except (ValueError, AssertionError) as exc:
                raise typer.BadParameter(str(exc)) from None
            sweep_id = None
        code = run_sweep_command(store, config, sweep_id, ray_address, as_json)
        raise typer.Exit(code)


def run_sweep_command(
    store: Any, config: Any, sweep_id: int | None, ray_address: str | None, as_json: bool
) -> int:
    """Start arms, plan, run with live progress, print the summary; returns the exit code."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from lumotree.agents.clients import ActorModel, OpenAIModel
    from lumotree.db import queries
    from lumotree.platform.orchestrator import Orchestrator
    from lumotree.platform.sweep_summary import summarize, summary_table
    from lumotree.platform.task_backends import make_backend

    console = Console(stderr=as_json)
    if not console.is_terminal:  # logs and CI: wide enough for the summary table
        console.width = max(console.width, 130)
    backend = make_backend(config.suite)
    models: dict[str, Any] = {}
    arm_info: dict[str, dict[str, Any]] = {}
    if any(a.hosted for a in config.arms):
        import ray

        from lumotree.platform.actors import ArmStartError, check_specs, start_arm_actors
        from lumotree.platform.ray_runtime import init_ray

        try:
            check_specs(config.arms)  # before Ray starts: a missing model is reported in a second
        except ArmStartError as exc:
            console.print(f"[red]{exc}[/]")
            return 2
        init_ray(ray_address)
        with console.status(f"starting {sum(a.hosted for a in config.arms)} arm actor(s)"):
            try:
                handles = start_arm_actors(config.arms)
            except ArmStartError as exc:
                console.print(f"[red]{exc}[/]")
                return 2
            for spec_name, info in zip(
                handles, ray.get([h.info.remote() for h in handles.values()]), strict=True
            ):
                arm_info[spec_name] = {"host": info}
        timeout = config.agent.wall_limit_s  # a hung arm fails the attempt instead of holding it forever
        models.update({n: ActorModel(h, timeout_s=timeout) for n, h in handles.items()})
    for spec in config.arms:
        if spec.kind == "url":
            models[spec.name] = OpenAIModel(spec.url)
    orch = Orchestrator(store, config, backend, models)
    sweep_id = orch.plan(sweep_id, arm_info)
    console.print(f"sweep [bold]{sweep_id}[/] ({config.name}) in {store.engine.url.render_as_string()}")
    with console.status("preparing task images"):
        orch.prepare_tasks()

    runner = threading.Thread(target=orch.run, args=(sweep_id,), daemon=True)
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, console=console, transient=False) as progress:
        bars = {a.name: progress.add_task(a.name, total=config.attempts) for a in config.arms}
        logged: dict[str, int] = {}
        runner.start()
        try:
            while True:
                alive = runner.is_alive()
                with store.session() as s:
                    for arm in queries.arm_stats(s, sweep_id):
                        if arm["name"] in bars:
                            progress.update(
                                bars[arm["name"]],
                                total=arm["attempts"],
                                completed=arm["done"],
                                description=f"{arm['name']:<10} resolved {arm['resolved']:>3}"
                                + (f"  running {arm['running']}" if arm["running"] else ""),
                            )
                            if not console.is_terminal:
                                _log_progress(console, logged, arm)
                if not alive:
                    break
                time.sleep(1.0)
        except KeyboardInterrupt:
            orch.interrupt()
            console.print(f"interrupted: resume with [bold]lumotree sweep --resume {sweep_id}[/]")
            return 130
    rows = summarize(store, sweep_id)
    if as_json:
        print(json.dumps({"sweep_id": sweep_id, "arms": rows, "failures": orch.failures}, indent=2))
    else:
        console.print(summary_table(rows, title=f"sweep {sweep_id}: {config.name}"))
    for failure in orch.failures:
        console.print(f"[yellow]retried/failed:[/] {failure}")
    progress_counts = store.progress(sweep_id)
    incomplete = progress_counts["total"] - progress_counts["done"]
    if incomplete:
        console.print(f"[red]{incomplete} attempt(s) did not finish[/]; rerun with --resume {sweep_id}")
        return 1
    return 0


def _log_progress(console: Any, logged: dict[str, int], arm: dict[str, Any]) -> None:
    """A log file (no terminal) gets a plain line per finished attempt instead of live bars."""
    if logged.get(arm["name"], 0) != arm["done"]:
        logged[arm["name"]] = arm["done"]
        name, done, total, resolved = arm["name"], arm["done"], arm["attempts"], arm["resolved"]
        console.print(f"{name}: {done}/{total} attempts done, {resolved} resolved")

"""``lumotree replay``: re-issue a sweep's recorded requests (or a JSONL corpus) to every arm and compare
rates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from lumotree.platform.db_options import db_option


def register(app: typer.Typer) -> None:
    @app.command()
    def replay(
        from_sweep: int | None = typer.Option(None, help="Replay the recorded requests of this sweep."),
        corpus: Path | None = typer.Option(None, help="Replay a JSONL corpus (see --export-corpus)."),
        source_arm: str | None = typer.Option(
            None, help="With --from-sweep: only requests recorded by this arm."
        ),
        limit: int | None = typer.Option(None, min=1, help="Use only the first N requests."),
        export_corpus: Path | None = typer.Option(None, help="Write the corpus as JSONL to this file."),
        export_only: bool = typer.Option(False, help="Write --export-corpus and stop."),
        arms: str = typer.Option("ar,mtp,eagle,lumotree", help="Arms to replay on, comma separated."),
        runs: int = typer.Option(3, min=1, help="Passes over the corpus per arm (interleaved by run)."),
        warmup: int = typer.Option(
            1, min=0, help="Untimed passes per arm before the timed runs (compile, capture graphs); 0: none."
        ),
        max_tokens: int = typer.Option(1024, min=1, help="Completion tokens per request."),
        ignore_eos: bool = typer.Option(False, help="Always generate max_tokens (equal work per arm)."),
        seed: int = typer.Option(0, help="Seed of request i is seed + i, the same for every arm."),
        model: str = typer.Option("tiny", help="Model path, or 'tiny' for the built-in model."),
        device: str | None = typer.Option(
            None, help="Engine device, cuda or cpu (default: cuda when available)."
        ),
        mtp_k: int | None = typer.Option(None, help="Draft length of the mtp arm."),
        draft_vocab: int | None = typer.Option(
            None, min=0, help="Speculative arms draft among the first N token ids only (0 = all)."
        ),
        use_ray: bool = typer.Option(
            True, "--ray/--no-ray", help="Host arms in Ray actors, or in this process."
        ),
        ray_address: str | None = typer.Option(
            None, help="Join this Ray cluster instead of starting a local one."
        ),
        db: str | None = db_option(),
        out: Path | None = typer.Option(
            None, help="Write the JSON report here (default: runs/replay-<id>.json)."
        ),
        as_json: bool = typer.Option(False, "--json", help="Print the JSON report instead of a table."),
    ) -> None:
        """Decode the same recorded prompts on every arm: pooled tok/s, per-run range, acceptance, phases."""
        from rich.console import Console

        from lumotree.db.store import Store
        from lumotree.platform.replay import corpus_from_sweep, import_corpus
        from lumotree.platform.replay import export_corpus as write_corpus

        console = Console(stderr=True)
        if (from_sweep is None) == (corpus is None):
            raise typer.BadParameter("give exactly one of --from-sweep ID and --corpus FILE")
        store = Store(db)  # None: lumotree.db.engine.default_url()
        if corpus is not None:
            try:
                requests = import_corpus(corpus)[:limit]
            except (OSError, ValueError) as exc:
                raise typer.BadParameter(str(exc), param_hint="--corpus") from None
            corpus_name = corpus.name
        else:
            assert from_sweep is not None
            requests = corpus_from_sweep(store, from_sweep, arm=source_arm, limit=limit)
            corpus_name = f"sweep:{from_sweep}"
        if not requests:
            console.print("[red]the corpus is empty[/] (no finished attempts with recorded prompt token ids)")
            raise typer.Exit(1)
        if export_corpus is not None:
            n = write_corpus(requests, export_corpus)
            console.print(f"wrote {n} requests to {export_corpus}")
            if export_only:
                return
        arm_names = [a.strip() for a in arms.split(",") if a.strip()]
        options: dict[str, Any] = {
            k: v
            for k, v in {"device": device, "mtp_k": mtp_k, "draft_vocab": draft_vocab}.items()
            if v is not None
        }
        settings = {
            "arms": arm_names,
            "runs": runs,
            "warmup": warmup,
            "max_tokens": max_tokens,
            "ignore_eos": ignore_eos,
            "seed": seed,
            "model": model,
            "options": options,
            "ray": use_ray,
            "requests": len(requests),
        }
        report = run_replay_command(store, requests, corpus_name, from_sweep, settings, ray_address, console)
        path = out or Path("runs") / f"replay-{report['replay_id']}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2))
        if as_json:
            print(json.dumps(report, indent=2))
        else:
            Console().print(replay_table(report))
            console.print(f"report: {path}")


def run_replay_command(
    store: Any,
    requests: list[Any],
    corpus_name: str,
    sweep_id: int | None,
    settings: dict[str, Any],
    ray_address: str | None,
    console: Any,
) -> dict[str, Any]:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskID,
        TextColumn,
        TimeElapsedColumn,
    )

    from lumotree.platform.actors import ArmHost
    from lumotree.platform.provenance import git_commit
    from lumotree.platform.replay import ActorTarget, ReplayTarget, run_replay, summarize_replay
    from lumotree.platform.sweep_config import ArmSpec

    specs = [ArmSpec(name=a, model=settings["model"], options=settings["options"]) for a in settings["arms"]]
    targets: dict[str, ReplayTarget] = {}
    with console.status(f"loading {len(specs)} arm(s)"):
        if settings["ray"]:
            from lumotree.platform.actors import start_arm_actors
            from lumotree.platform.ray_runtime import init_ray

            init_ray(ray_address)
            targets = {n: ActorTarget(h) for n, h in start_arm_actors(specs).items()}
        else:
            targets = {s.name: ArmHost(s) for s in specs}
    warmup = settings["warmup"]
    total = len(requests) * settings["runs"]
    warm_total = len(requests) * warmup
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]

    def counter(kind: str, passes: int, per_arm: int) -> Any:
        """Progress callback of one kind of pass: advances the arm's bar; a log file (no terminal) gets a
        plain line per tenth of each arm's work instead of a live bar."""
        done = dict.fromkeys(targets, 0)

        def advance(arm: str, index: int, i: int) -> None:
            progress.advance(bar_sets[kind][arm])
            done[arm] += 1
            if not console.is_terminal and (done[arm] % max(1, per_arm // 10) == 0 or done[arm] == per_arm):
                what = (
                    f"run {index + 1}/{passes}"
                    if kind == "timed"
                    else f"warm-up {index + 1}/{passes} (untimed)"
                )
                console.print(f"{arm}: {what}, {done[arm]}/{per_arm} requests")

        return advance

    with Progress(*columns, console=console) as progress:
        # Warm-up bars first (their passes run before any timed one); none when warm-up is off.
        bar_sets: dict[str, dict[str, TaskID]] = {"warm-up": {}, "timed": {}}
        if warmup:
            bar_sets["warm-up"] = {
                n: progress.add_task(f"{n} warm-up (untimed)", total=warm_total) for n in targets
            }
        bar_sets["timed"] = {n: progress.add_task(n, total=total) for n in targets}
        results = run_replay(
            requests,
            targets,
            runs=settings["runs"],
            warmup=warmup,
            max_tokens=settings["max_tokens"],
            ignore_eos=settings["ignore_eos"],
            seed=settings["seed"],
            on_request=counter("timed", settings["runs"], total),
            on_warmup=counter("warm-up", warmup, warm_total),
        )
    summary = summarize_replay(results)
    config = {**settings, "git_commit": git_commit()}
    replay_id = store.create_replay(corpus_name, config, sweep_id=sweep_id)
    for r in results:
        store.record_replay_result(replay_id, r.arm, r.run_index, **r.as_row())
    return {
        "replay_id": replay_id,
        "corpus": corpus_name,
        "config": config,
        **summary,
        "runs": [{"arm": r.arm, "run_index": r.run_index, **r.as_row()} for r in results],
    }


def replay_table(report: dict[str, Any]) -> Any:
    from rich.table import Table

    table = Table(title=f"replay {report['replay_id']} of {report['corpus']}", title_justify="left")
    for col in (
        "arm",
        "tok/s pooled",
        "run range",
        "tokens",
        "tok/step",
        "ms/step",
        "accept len",
        "per position",
    ):
        table.add_column(col, justify="left" if col == "arm" else "right")
    fmt = lambda v, f: "-" if v is None else format(v, f)
    for name, a in report["arms"].items():
        table.add_row(
            name,
            f"{a['pooled_tok_s']:.2f}",
            f"{a['tok_s_min']:.2f}-{a['tok_s_max']:.2f}",
            f"{a['completion_tokens']:,}",
            fmt(a["tokens_per_step"], ".2f"),
            fmt(a["ms_per_step"], ".1f"),
            fmt(a["acceptance_length"], ".2f"),
            " ".join(f"{p:.2f}" for p in a["per_position"][:8]) or "-",
        )
    return table

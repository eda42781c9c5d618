"""``lumotree train tokenizer|model|eagle|all``: train the built-in model lumo-tiny into an output folder."""

from __future__ import annotations

from enum import Enum

import typer


class Stage(str, Enum):
    tokenizer = "tokenizer"
    model = "model"
    eagle = "eagle"
    all = "all"


class Device(str, Enum):
    cpu = "cpu"
    cuda = "cuda"


def register(app: typer.Typer) -> None:
    @app.command()
    def train(
        stage: Stage = typer.Argument(
            ..., help="tokenizer, model (trunk + MTP), eagle (head on frozen trunk) or all"
        ),
        out: str = typer.Option(
            ..., "--out", help="output folder; the shippable model lands in OUT/lumo-tiny"
        ),
        device: Device = typer.Option(Device.cpu, "--device", help="cpu or cuda (bf16 autocast)"),
        steps: int = typer.Option(0, "--steps", help="model steps; 0 = train for --minutes"),
        minutes: float = typer.Option(5.0, "--minutes", help="wall-time budget of model + EAGLE training"),
        seed: int = typer.Option(0, "--seed"),
        batch_size: int | None = typer.Option(None, "--batch-size", help="sequences per step (default 64)"),
        seq_len: int | None = typer.Option(None, "--seq-len", help="tokens per sequence (default 512)"),
        corpus_mb: float | None = typer.Option(
            None, "--corpus-mb", help="source bytes taken (default 48 MB)"
        ),
        tiny: bool = typer.Option(False, "--tiny", help="test-sized model and corpus (seconds on CPU)"),
    ) -> None:
        """Train lumo-tiny: tokenizer, trunk with its MTP layer, EAGLE head; export (HF layout) + card."""
        from rich.console import Console

        from lumotree.serving.train.cli import COMMANDS, make_config
        from lumotree.serving.train.pipeline import run

        console = Console()
        cfg = make_config(out, device.value, steps, minutes, seed, batch_size, seq_len, corpus_mb, tiny)
        try:
            run(cfg, COMMANDS[stage.value], echo=lambda s: console.print(s, markup=False, highlight=False))
        except (RuntimeError, FileNotFoundError, AssertionError) as e:
            console.print(f"[red]train failed:[/red] {e}")
            raise typer.Exit(1) from None

"""``lumotree serve``: the OpenAI-compatible HTTP server over one model and one arm."""

from __future__ import annotations

from typing import Annotated

import typer

from lumotree.platform.engine_options import (
    ArmOpt,
    DeviceOpt,
    DraftVocabOpt,
    DtypeOpt,
    MaxLenOpt,
    ModelOpt,
    MtpKOpt,
    TreeOpt,
    engine_config,
)


def register(app: typer.Typer) -> None:
    @app.command()
    def serve(
        model: ModelOpt = "tiny",
        arm: ArmOpt = "ar",
        host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
        port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
        max_seqs: Annotated[int, typer.Option(help="Requests decoded together (continuous batching).")] = 16,
        mtp_k: MtpKOpt = 5,
        tree: TreeOpt = "hydra27",
        draft_vocab: DraftVocabOpt = 0,
        device: DeviceOpt = None,
        dtype: DtypeOpt = None,
        max_model_len: MaxLenOpt = 4096,
    ) -> None:
        """Serve /v1/completions, /v1/chat/completions, /v1/models, /health and /metrics."""
        from rich.console import Console

        err = Console(stderr=True)
        try:
            from lumotree.serving.server import serve as run_server

            config = engine_config(
                model, arm, mtp_k, tree, device, dtype, max_model_len, max_seqs, draft_vocab
            )
            run_server(config, host=host, port=port)
        except (ValueError, FileNotFoundError, OSError) as e:
            err.print(f"[red]error:[/red] {e}")
            raise typer.Exit(2) from None

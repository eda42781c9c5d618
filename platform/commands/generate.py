"""``lumotree generate``: one prompt through one arm, text or one JSON object on stdout."""

from __future__ import annotations

import json
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
    def generate(
        prompt: Annotated[str, typer.Option(help="Prompt text.")],
        model: ModelOpt = "tiny",
        arm: ArmOpt = "ar",
        max_tokens: Annotated[int, typer.Option(help="Most tokens to generate.")] = 64,
        temperature: Annotated[float, typer.Option(help="0 = greedy.")] = 0.0,
        top_p: Annotated[float, typer.Option(help="Nucleus mass in (0, 1].")] = 1.0,
        top_k: Annotated[int, typer.Option(help="-1 or 0 = off.")] = -1,
        min_p: Annotated[float, typer.Option(help="0 = off.")] = 0.0,
        presence_penalty: Annotated[float, typer.Option(help="In [-2, 2].")] = 0.0,
        seed: Annotated[int | None, typer.Option(help="Random seed (same seed, same tokens).")] = None,
        chat: Annotated[bool, typer.Option(help="Send the prompt as a chat user turn.")] = False,
        ignore_eos: Annotated[bool, typer.Option(help="Generate past EOS (benchmarks).")] = False,
        mtp_k: MtpKOpt = 5,
        tree: TreeOpt = "hydra27",
        draft_vocab: DraftVocabOpt = 0,
        device: DeviceOpt = None,
        dtype: DtypeOpt = None,
        max_model_len: MaxLenOpt = 4096,
        as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    ) -> None:
        """Generate a completion and report decode speed and speculative acceptance."""
        from rich.console import Console

        err = Console(stderr=True)
        try:
            from lumotree.serving.llm import LLM, GenerationResult
            from lumotree.serving.sampler import SamplingParams

            params = SamplingParams(
                temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                presence_penalty=presence_penalty, max_tokens=max_tokens, seed=seed, ignore_eos=ignore_eos,
            )  # fmt: skip
            config = engine_config(model, arm, mtp_k, tree, device, dtype, max_model_len, 1, draft_vocab)
            with err.status(f"loading {model}"):
                llm = LLM(config)
            result: GenerationResult
            if chat:
                result = llm.chat([{"role": "user", "content": prompt}], params)
            else:
                result = llm.generate(prompt, params)[0]
        except (ValueError, FileNotFoundError, OSError) as e:
            err.print(f"[red]error:[/red] {e}")
            raise typer.Exit(2) from None
        out = {"arm": arm, "model": llm.engine.model_name, **result.to_dict()}
        if as_json:
            print(json.dumps(out))
            return
        print(out["text"])
        err.print(
            f"[dim]{out['num_tokens']} tokens, {out['steps']} steps, {out['decode_tok_s']:.1f} tok/s decode, "
            f"{out['tokens_per_step']:.2f} tokens/step, acceptance {out['acceptance_rate']:.2f}, "
            f"finish {out['finish_reason']}[/dim]"
        )

"""Command-line options shared by ``lumotree generate`` and ``lumotree serve`` (one definition each)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from lumotree.serving.engine import EngineConfig

ModelOpt = Annotated[str, typer.Option(help="Built-in model name (tiny) or checkpoint directory.")]
ArmOpt = Annotated[str, typer.Option(help="Decoding arm: ar | mtp | eagle | lumotree.")]
MtpKOpt = Annotated[int, typer.Option(help="MTP chain length (mtp and lumotree arms).")]
TreeOpt = Annotated[str, typer.Option(help="Tree policy of the lumotree arm: hydra27 | adaptive.")]
DraftVocabOpt = Annotated[
    int, typer.Option(help="Speculative arms draft among the first N token ids only (0 = all).", min=0)
]
DeviceOpt = Annotated[str | None, typer.Option(help="cpu or cuda (default: cuda when available).")]
DtypeOpt = Annotated[
    str | None,
    typer.Option(help="float32 | bfloat16 | float16 (default: checkpoint's on CUDA, float32 on CPU)."),
]
MaxLenOpt = Annotated[int, typer.Option(help="Prompt + output tokens per request.")]


def engine_config(
    model: str,
    arm: str,
    mtp_k: int,
    tree: str,
    device: str | None,
    dtype: str | None,
    max_model_len: int,
    max_seqs: int,
    draft_vocab: int = 0,
) -> EngineConfig:
    from lumotree.serving.engine import EngineConfig

    options: dict[str, dict[str, Any]] = {"mtp": {"mtp_k": mtp_k}, "lumotree": {"tree": tree, "mtp_k": mtp_k}}
    arm_options = options.get(arm, {})
    if draft_vocab and arm != "ar":
        arm_options = {**arm_options, "draft_vocab": draft_vocab}
    return EngineConfig(
        model=model, arm=arm, arm_options=arm_options, device=device, dtype=dtype, max_seqs=max_seqs,
        max_model_len=max_model_len,
    )  # fmt: skip

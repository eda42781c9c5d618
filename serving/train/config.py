"""One typed configuration for the lumo-tiny pipeline: tokenizer, corpus, model, MTP, EAGLE, export."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class ModelDims:
    """Shape of the Qwen3.5-architecture model (written to config.json as ``qwen3_5_text``)."""

    vocab_size: int = 8192
    """Tokenizer vocabulary including special tokens (the tokenizer is trained to exactly this size)."""
    hidden_size: int = 256
    """Residual width."""
    num_hidden_layers: int = 8
    """Decoder layers; every ``full_attention_interval``-th is full attention, the rest Gated DeltaNet."""
    full_attention_interval: int = 4
    """Qwen3.5 pattern: 3 GDN layers then 1 gated attention layer."""
    intermediate_size: int = 384
    """SwiGLU width (1.5x: the 16 MiB budget for all shipped files decides, see ``param_count``)."""
    num_attention_heads: int = 4
    """Query heads of the full-attention layers (the output gate doubles q_proj)."""
    num_key_value_heads: int = 2
    """KV heads of the full-attention layers."""
    head_dim: int = 64
    """Attention head dimension."""
    partial_rotary_factor: float = 0.25
    """Fraction of the head dimension that is rotated (Qwen3.5: 0.25)."""
    rope_theta: float = 10000.0
    """RoPE base."""
    linear_num_key_heads: int = 2
    """GDN key (and query) heads."""
    linear_num_value_heads: int = 4
    """GDN value heads (grouped over the key heads)."""
    linear_key_head_dim: int = 64
    """GDN key head dimension."""
    linear_value_head_dim: int = 64
    """GDN value head dimension."""
    linear_conv_kernel_dim: int = 4
    """Causal depthwise conv kernel over the q, k, v channels."""
    max_position_embeddings: int = 4096
    """Longest context the config advertises."""
    rms_norm_eps: float = 1e-6
    """RMSNorm epsilon."""
    tie_word_embeddings: bool = True
    """Share embed_tokens and lm_head (saves vocab x hidden parameters)."""
    mtp_num_hidden_layers: int = 1
    """MTP decoder layers (``mtp.*`` weights)."""
    eagle_intermediate_size: int = 256
    """SwiGLU width of the EAGLE head's decoder layer."""

    def layer_types(self) -> list[str]:
        k = self.full_attention_interval
        return [
            "full_attention" if (i + 1) % k == 0 else "linear_attention"
            for i in range(self.num_hidden_layers)
        ]


@dataclass
class CorpusConfig:
    """Which files become training text and how they are split and mixed."""

    max_file_bytes: int = 128_000
    """Skip larger files (generated tables, vendored bundles)."""
    min_file_bytes: int = 256
    """Skip near-empty files (``__init__.py`` stubs)."""
    max_line_chars: int = 400
    """Skip files with any longer line (minified or generated code)."""
    max_total_bytes: int = 48_000_000
    """Stop adding source files once this many bytes are chosen (files taken in hash order)."""
    heldout_percent: int = 2
    """Files whose path hash falls below this percentage are held out (never trained on)."""
    chat_fraction: float = 0.3
    """Share of training documents that are synthetic agent transcripts built from corpus files."""
    tokenizer_sample_bytes: int = 16_000_000
    """Bytes of training text the BPE tokenizer is fitted on."""
    prompts: int = 32
    """Held-out prompts written for acceptance measurements (half code, half agent chat)."""


@dataclass
class OptimConfig:
    """AdamW with linear warmup and cosine decay."""

    lr: float = 3e-3
    """Peak learning rate."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of the peak."""
    warmup_steps: int = 100
    """Linear warmup steps (capped at a tenth of the run)."""
    weight_decay: float = 0.1
    """Decoupled weight decay on matrices (not norms, biases or gates)."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas."""
    grad_clip: float = 1.0
    """Global gradient-norm clip."""


@dataclass
class TrainConfig:
    """Everything one ``lumotree train`` run needs; recorded verbatim in the metrics file."""

    out: str = "lumo-tiny-run"
    """Output directory: tokenizer, checkpoint (HF layout), eagle/, metrics.json, MODEL_CARD.md."""
    device: str = "cpu"
    """``cpu`` or ``cuda``."""
    seed: int = 0
    """Seed for file choice in chats, batch order and initialisation."""
    steps: int = 0
    """Model training steps; 0 = run until ``minutes`` of training time are spent."""
    minutes: float = 5.0
    """Training time budget in minutes (model + EAGLE), used when ``steps`` is 0."""
    eagle_share: float = 0.2
    """Share of the time budget (or of ``steps``) given to the EAGLE head."""
    eagle_steps: int = 0
    """EAGLE steps; 0 = ``eagle_share`` of the model steps / time."""
    seq_len: int = 512
    """Tokens per training sequence."""
    batch_size: int = 64
    """Sequences per step."""
    mtp_loss_weight: float = 0.5
    """Weight of the MTP loss (mean over unrolled depths) added to the next-token loss."""
    mtp_train_depth: int = 2
    """MTP recursion depth trained (1 = DeepSeek-V3/Qwen objective; 2 also trains the chained pass)."""
    eagle_train_depth: int = 2
    """EAGLE recursion depth trained (the head consumes its own features when drafting a chain)."""
    eagle_feature_weight: float = 1.0
    """Weight of the EAGLE feature (smooth-L1 on the next hidden) loss next to its token loss."""
    eval_every: int = 200
    """Held-out evaluation interval in steps."""
    eval_batches: int = 8
    """Held-out batches per evaluation (same batches every time)."""
    log_every: int = 20
    """Console log interval in steps."""
    dtype: str = "bfloat16"
    """Autocast dtype on CUDA (CPU trains in float32)."""
    export_dtype: str = "bfloat16"
    """Dtype of the shipped safetensors."""
    max_shipped_bytes: int = 16 * 1024 * 1024
    """Refuse to export a model whose shipped files exceed this many bytes."""
    model: ModelDims = field(default_factory=ModelDims)
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        nested = {"model": ModelDims, "corpus": CorpusConfig, "optim": OptimConfig}
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in data:
                continue
            value = data[f.name]
            kwargs[f.name] = nested[f.name](**value) if f.name in nested else value
        if "optim" in kwargs:
            kwargs["optim"].betas = tuple(kwargs["optim"].betas)
        return cls(**kwargs)


def tiny_test_config(out: str) -> TrainConfig:
    """A few-second CPU configuration for tests: small vocab, narrow model, short sequences."""
    cfg = TrainConfig(out=out, device="cpu", steps=16, seq_len=48, batch_size=8)
    cfg.eval_every, cfg.eval_batches, cfg.log_every, cfg.eagle_steps = 8, 1, 4, 6
    cfg.model = ModelDims(
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=4,
        intermediate_size=128,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        linear_num_key_heads=1,
        linear_num_value_heads=2,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        eagle_intermediate_size=128,
    )
    cfg.corpus = CorpusConfig(
        max_total_bytes=400_000, tokenizer_sample_bytes=200_000, heldout_percent=25, prompts=4
    )
    cfg.optim = OptimConfig(lr=3e-3, warmup_steps=5)
    return cfg

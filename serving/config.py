"""``ModelConfig``: the Qwen3.5 text architecture, parsed from a Hugging Face ``config.json``.

Accepts ``model_type`` ``qwen3_5_text`` (Qwen3_5ForCausalLM checkpoints) and ``qwen3_5`` (the multimodal
wrapper,
read through its ``text_config``). Every error names the file and the field.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

LINEAR = "linear_attention"
FULL = "full_attention"
TEXT_MODEL_TYPES = ("qwen3_5_text",)
WRAPPER_MODEL_TYPES = ("qwen3_5",)


class ConfigError(ValueError):
    """A config.json that does not describe a model we can run; the message names file and field."""


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and numerics of one Qwen3.5-architecture text model (GDN + gated attention hybrid)."""

    vocab_size: int
    """Rows of the embedding and the lm_head."""
    hidden_size: int
    """Residual stream width."""
    intermediate_size: int
    """SwiGLU MLP inner width."""
    layer_types: tuple[str, ...]
    """Per decoder layer: ``linear_attention`` (Gated DeltaNet) or ``full_attention`` (gated attention)."""
    num_attention_heads: int
    """Query heads of full-attention layers."""
    num_key_value_heads: int
    """KV heads of full-attention layers (grouped query attention)."""
    head_dim: int
    """Head size of full-attention layers."""
    linear_num_key_heads: int
    """GDN query/key heads (value heads share them in groups)."""
    linear_num_value_heads: int
    """GDN value heads; a multiple of the key heads."""
    linear_key_head_dim: int
    """GDN key head size K."""
    linear_value_head_dim: int
    """GDN value head size V."""
    linear_conv_kernel_dim: int = 4
    """Causal depthwise conv width over the concatenated q, k, v channels."""
    rms_norm_eps: float = 1e-6
    """Epsilon of every RMSNorm (zero-centred ``1 + w`` norms and the gated norm alike)."""
    rope_theta: float = 10_000_000.0
    """RoPE base."""
    partial_rotary_factor: float = 0.25
    """Fraction of ``head_dim`` rotated by RoPE (the rest passes through)."""
    max_position_embeddings: int = 32768
    """Longest context the checkpoint was trained for."""
    attention_bias: bool = False
    """Whether q/k/v/o projections carry a bias."""
    hidden_act: str = "silu"
    """MLP and conv activation; only SiLU is supported."""
    tie_word_embeddings: bool = False
    """lm_head shares the embedding matrix."""
    mtp_num_hidden_layers: int = 0
    """Decoder layers of the multi-token-prediction head (``mtp.*`` weights); 0 = none."""
    eos_token_ids: tuple[int, ...] = ()
    """End-of-sequence ids named by the config (the tokenizer may add more)."""
    bos_token_id: int | None = None
    """Beginning-of-sequence id, if any."""
    pad_token_id: int | None = None
    """Padding id, if any."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """Fields of the source config we keep but do not interpret."""

    def __post_init__(self) -> None:
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ConfigError(msg)

        need(len(self.layer_types) > 0, "layer_types: at least one layer")
        for i, t in enumerate(self.layer_types):
            need(t in (LINEAR, FULL), f"layer_types[{i}]: {t!r} is neither {LINEAR!r} nor {FULL!r}")
        need(
            self.num_attention_heads % self.num_key_value_heads == 0,
            "num_attention_heads must be a multiple of num_key_value_heads",
        )
        need(
            self.linear_num_value_heads % self.linear_num_key_heads == 0,
            "linear_num_value_heads must be a multiple of linear_num_key_heads",
        )
        need(
            self.rotary_dim % 2 == 0 and self.rotary_dim <= self.head_dim, "partial_rotary_factor * head_dim"
        )
        need(self.hidden_act == "silu", f"hidden_act: {self.hidden_act!r} (only 'silu' is supported)")
        need(self.linear_conv_kernel_dim >= 1, "linear_conv_kernel_dim must be >= 1")

    # Derived shapes, named once so every module agrees.
    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @property
    def gdn_layers(self) -> tuple[int, ...]:
        """Decoder-layer indices of the GDN layers (their order = index into the recurrent/conv pools)."""
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR)

    @property
    def attn_layers(self) -> tuple[int, ...]:
        """Decoder-layer indices of the attention layers (their order = index into the KV cache)."""
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL)

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv: q, k and v concatenated."""
        return 2 * self.linear_key_dim + self.linear_value_dim

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("extra")
        return d

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config.json") -> ModelConfig:
        """Parse a Hugging Face config dict; ``source`` names the file in error messages."""
        model_type = raw.get("model_type")
        top = raw
        if model_type in WRAPPER_MODEL_TYPES:
            text = raw.get("text_config")
            if not isinstance(text, dict):
                raise ConfigError(
                    f"{source}: field 'text_config' missing or not an object (model_type qwen3_5)"
                )
            raw = dict(text)
            raw.setdefault("model_type", "qwen3_5_text")
            model_type = raw["model_type"]
            src = f"{source} (text_config)"
        else:
            src = source
        if model_type not in TEXT_MODEL_TYPES:
            raise ConfigError(
                f"{source}: field 'model_type' is {model_type!r}; expected one of "
                f"{TEXT_MODEL_TYPES + WRAPPER_MODEL_TYPES}"
            )

        def get(name: str, typ: type, default: Any = ...) -> Any:
            if name not in raw or raw[name] is None:
                if default is ...:
                    raise ConfigError(f"{src}: required field {name!r} is missing")
                return default
            value = raw[name]
            if typ is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if typ is int and isinstance(value, bool) or not isinstance(value, typ):
                raise ConfigError(f"{src}: field {name!r} must be {typ.__name__}, got {value!r}")
            return value

        num_layers = get("num_hidden_layers", int)
        layer_types = raw.get("layer_types")
        if layer_types is None:
            interval = get("full_attention_interval", int, 4)
            layer_types = [FULL if (i + 1) % interval == 0 else LINEAR for i in range(num_layers)]
        if not isinstance(layer_types, list) or len(layer_types) != num_layers:
            raise ConfigError(
                f"{src}: field 'layer_types' must be a list of num_hidden_layers={num_layers} entries"
            )

        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        if not isinstance(rope, dict):
            raise ConfigError(f"{src}: field 'rope_parameters' must be an object")
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ConfigError(f"{src}: field 'rope_parameters.rope_type' {rope_type!r} is not supported")
        rope_theta = rope.get("rope_theta", raw.get("rope_theta", 10_000_000.0))
        partial = rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 0.25))

        eos = raw.get("eos_token_id", top.get("eos_token_id"))
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        tie = raw.get("tie_word_embeddings", top.get("tie_word_embeddings", False))
        hidden = get("hidden_size", int)
        heads = get("num_attention_heads", int)
        known = {
            "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "layer_types",
            "num_attention_heads", "num_key_value_heads", "head_dim", "linear_num_key_heads",
            "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
            "linear_conv_kernel_dim",
            "rms_norm_eps", "rope_parameters", "rope_scaling", "rope_theta", "partial_rotary_factor",
            "max_position_embeddings", "attention_bias", "hidden_act", "tie_word_embeddings",
            "mtp_num_hidden_layers", "eos_token_id", "bos_token_id", "pad_token_id",
        }  # fmt: skip
        try:
            return cls(
                vocab_size=get("vocab_size", int),
                hidden_size=hidden,
                intermediate_size=get("intermediate_size", int),
                layer_types=tuple(layer_types),
                num_attention_heads=heads,
                num_key_value_heads=get("num_key_value_heads", int),
                head_dim=get("head_dim", int, hidden // heads),
                linear_num_key_heads=get("linear_num_key_heads", int, 16),
                linear_num_value_heads=get("linear_num_value_heads", int, 32),
                linear_key_head_dim=get("linear_key_head_dim", int, 128),
                linear_value_head_dim=get("linear_value_head_dim", int, 128),
                linear_conv_kernel_dim=get("linear_conv_kernel_dim", int, 4),
                rms_norm_eps=get("rms_norm_eps", float, 1e-6),
                rope_theta=float(rope_theta),
                partial_rotary_factor=float(partial),
                max_position_embeddings=get("max_position_embeddings", int, 32768),
                attention_bias=get("attention_bias", bool, False),
                hidden_act=get("hidden_act", str, "silu"),
                tie_word_embeddings=bool(tie),
                mtp_num_hidden_layers=get("mtp_num_hidden_layers", int, 0),
                eos_token_ids=eos_ids,
                bos_token_id=raw.get("bos_token_id"),
                pad_token_id=raw.get("pad_token_id"),
                extra={k: v for k, v in raw.items() if k not in known},
            )
        except ConfigError as e:
            raise ConfigError(f"{src}: {e}") from None

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ModelConfig:
        """Read ``config.json`` from a checkpoint directory (or the file itself)."""
        p = Path(path)
        file = p / "config.json" if p.is_dir() else p
        if not file.is_file():
            raise ConfigError(f"{file}: config.json not found")
        try:
            raw = json.loads(file.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{file}: not valid JSON ({e})") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{file}: top level must be a JSON object")
        return cls.from_dict(raw, source=str(file))

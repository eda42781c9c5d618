"""Load a Hugging Face-format Qwen3.5 checkpoint directory into a ``HybridModel``.

Reads config.json, then one ``model.safetensors`` or the shards named by ``model.safetensors.index.json``.
Tensor names of both ``Qwen3_5ForCausalLM`` (``model.*``) and the multimodal wrapper
(``model.language_model.*``,
vision tower skipped) are accepted; ``mtp.*`` goes to ``model.mtp``. Errors name the file and the
tensor/field.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import torch

from .config import ConfigError, ModelConfig
from .model import HybridModel

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_SKIP_PREFIXES = ("model.visual.", "visual.", "model.vision_tower.")


class CheckpointError(ValueError):
    """A checkpoint that does not match its config; the message names the file and the tensor."""


def _weight_files(root: Path) -> list[Path]:
    index = root / "model.safetensors.index.json"
    single = root / "model.safetensors"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index}: field 'weight_map' missing or unreadable ({e})") from None
        files = sorted({root / f for f in weight_map.values()})
        for f in files:
            if not f.is_file():
                raise CheckpointError(f"{index}: shard {f.name} listed in 'weight_map' does not exist")
        return files
    if single.is_file():
        return [single]
    found = sorted(root.glob("*.safetensors"))
    if found:
        return found
    raise CheckpointError(
        f"{root}: no model.safetensors, model.safetensors.index.json or *.safetensors found"
    )


def _model_name(name: str) -> str | None:
    """Checkpoint tensor name -> our parameter name (None = not part of the text model)."""
    if name.startswith(_SKIP_PREFIXES):
        return None
    for prefix in ("model.language_model.", "model."):
        if name.startswith(prefix):
            return name[len(prefix) :]
    if name.startswith(("mtp.", "lm_head.")):
        return name
    return name


def _tensors(files: list[Path]) -> Iterator[tuple[Path, str, torch.Tensor]]:
    from safetensors import safe_open

    for f in files:
        try:
            handle = safe_open(str(f), framework="pt", device="cpu")
        except Exception as e:  # safetensors raises its own error types
            raise CheckpointError(f"{f}: not a readable safetensors file ({e})") from None
        with handle:
            for key in handle.keys():  # noqa: SIM118 - safe_open is not a dict
                yield f, key, handle.get_tensor(key)


def device_dtype(dtype: str | None, device: torch.device | str) -> str | None:
    """The dtype to load in on ``device``: an explicit ``dtype`` wins; otherwise float32 on CPU (bf16 matmuls
    there are slower and less exact than fp32) and None, i.e. the checkpoint's own dtype, on accelerators."""
    if dtype:
        return dtype
    return "float32" if torch.device(device).type == "cpu" else None


def resolve_dtype(dtype: torch.dtype | str | None, config: ModelConfig) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    name = dtype or config.extra.get("dtype") or config.extra.get("torch_dtype") or "float32"
    if name not in _DTYPES:
        raise ConfigError(f"dtype {name!r} is not one of {sorted(_DTYPES)}")
    return _DTYPES[name]


def build_empty(config: ModelConfig, device: torch.device | str, dtype: torch.dtype) -> HybridModel:
    """An uninitialised model allocated once, directly on ``device`` in ``dtype`` (no fp32 CPU copy), its
    projections fused (loading copies each checkpoint tensor into its view of the fused blocks)."""
    with torch.device("meta"):
        model = HybridModel(config)
    return model.to(dtype).to_empty(device=device).fuse_projections()


def load_model(
    path: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype | str | None = None
) -> tuple[HybridModel, ModelConfig]:
    """Build the model on ``device`` in ``dtype`` (default: the config's dtype, else float32) and load
    weights."""
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"{root}: not a checkpoint directory")
    config = ModelConfig.from_pretrained(root)
    files = _weight_files(root)
    tensors = {}
    source = {}
    for f, key, t in _tensors(files):
        name = _model_name(key)
        if name is not None:
            tensors[name] = t
            source[name] = f
    has_mtp = any(n.startswith("mtp.") for n in tensors)
    if has_mtp and config.mtp_num_hidden_layers == 0:
        raise CheckpointError(
            f"{root / 'config.json'}: mtp.* weights present but 'mtp_num_hidden_layers' is 0"
        )
    if not has_mtp and config.mtp_num_hidden_layers > 0:
        config = dataclasses.replace(config, mtp_num_hidden_layers=0)  # the MTP head was not shipped
    dt = resolve_dtype(dtype, config)
    model = build_empty(config, device, dt)

    params = dict(model.named_parameters(remove_duplicate=False))
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    unknown = sorted(n for n in tensors if n not in params)
    if unknown:
        shown = ", ".join(f"{n} ({source[n].name})" for n in unknown[:5])
        raise CheckpointError(f"{root}: {len(unknown)} tensors the config does not describe: {shown}")
    missing = sorted(n for n in params if n not in tensors and n not in tied)
    if missing:
        raise CheckpointError(
            f"{root}: {len(missing)} tensors missing from the checkpoint: {', '.join(missing[:5])}"
        )
    with torch.no_grad():
        for name, p in params.items():
            if name in tied and name not in tensors:
                continue
            t = tensors[name]
            if tuple(t.shape) != tuple(p.shape):
                raise CheckpointError(
                    f"{source[name]}: tensor {name} has shape {tuple(t.shape)}, "
                    f"the config implies {tuple(p.shape)}"
                )
            p.copy_(t.to(device=p.device, dtype=p.dtype))
        if config.tie_word_embeddings:
            model.lm_head.weight = model.embed_tokens.weight
    model.eval()
    return model, config

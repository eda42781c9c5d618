"""Checkpoint export in the Hugging Face layout the serving loader reads, plus hashes, size check and card."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from lumotree.serving.train.lm import TrainLM

MODEL_FILE = "model.safetensors"


def save_checkpoint(lm: TrainLM, out: Path, dtype: torch.dtype) -> None:
    """config.json + model.safetensors (+ generation_config.json) in ``out``."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    cfg = dict(lm.config_dict, torch_dtype=str(dtype).removeprefix("torch."))
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    gen = {"eos_token_id": cfg["eos_token_id"], "pad_token_id": cfg["pad_token_id"], "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    weights = {k: v.detach().to("cpu", dtype).contiguous() for k, v in lm.hf_state_dict().items()}
    save_file(weights, str(out / MODEL_FILE), metadata={"format": "pt"})


def load_checkpoint(path: Path, device: str) -> TrainLM:
    """The trainable network from an exported folder (to train the EAGLE head as a separate stage)."""
    from safetensors.torch import load_file

    lm = TrainLM(json.loads((path / "config.json").read_text()))
    state = load_file(str(path / MODEL_FILE))
    trunk = {k: v for k, v in state.items() if not k.startswith("mtp.")}
    if lm.config_dict["tie_word_embeddings"]:
        trunk["lm_head.weight"] = trunk["model.embed_tokens.weight"]
    lm.lm.load_state_dict(trunk, strict=True)
    if lm.mtp is not None:
        lm.mtp.load_state_dict({k[4:]: v for k, v in state.items() if k.startswith("mtp.")}, strict=True)
    return lm.float().to(device)


def file_hashes(root: Path) -> dict[str, dict[str, Any]]:
    """sha256 and size of every file under ``root`` (relative POSIX paths, sorted)."""
    out = {}
    for p in sorted(q for q in root.rglob("*") if q.is_file()):
        out[p.relative_to(root).as_posix()] = {
            "bytes": p.stat().st_size,
            "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
        }
    return out


def check_size(root: Path, limit: int) -> int:
    total = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    if total > limit:
        raise RuntimeError(f"{root}: shipped files take {total} bytes, over the {limit}-byte budget")
    return total

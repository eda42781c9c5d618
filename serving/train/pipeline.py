"""``lumotree train``: tokenizer -> trunk + MTP -> EAGLE head -> export, all under one output folder.

Layout of ``--out DIR``: ``DIR/lumo-tiny/`` is the shippable model folder (config.json, model.safetensors,
tokenizer files, eagle/, heldout_prompts.jsonl, metrics.json, MODEL_CARD.md); ``DIR/metrics.json``,
``DIR/train_log.jsonl`` and ``DIR/corpus_files.json`` (every chosen file and its split) stay beside it.
Stages can run separately (each reads what the previous one wrote) or together (``all``).
"""

from __future__ import annotations

import json
import platform as _platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from lumotree.serving.drafters.eagle import EAGLE_DIR, EagleHead, eagle_config
from lumotree.serving.train.card import write_card
from lumotree.serving.train.config import TrainConfig
from lumotree.serving.train.corpus import Corpus, build_corpus
from lumotree.serving.train.data import TokenData, encode_stream
from lumotree.serving.train.export import check_size, file_hashes, load_checkpoint, save_checkpoint
from lumotree.serving.train.lm import TrainLM, hf_config, use_torch_gdn
from lumotree.serving.train.prompts import build_prompts, write_prompts
from lumotree.serving.train.tokenizer_train import (
    ENDOFTEXT,
    SPECIAL_TOKENS,
    eos_ids,
    save_tokenizer,
    train_tokenizer,
)
from lumotree.serving.train.trainer import Budget, jsonl_logger, train_eagle, train_model

STAGES = ("tokenizer", "model", "eagle")
MODEL_DIRNAME = "lumo-tiny"


def _hardware(device: str) -> str:
    if device.startswith("cuda"):
        return f"1x {torch.cuda.get_device_name(0)}"
    return f"CPU ({_platform.processor() or _platform.machine()}, {torch.get_num_threads()} threads)"


def _count(module: torch.nn.Module | None) -> int:
    return 0 if module is None else sum(p.numel() for p in module.parameters())


def _tokenizer_sample(docs: list[str], limit: int) -> list[str]:
    out, size = [], 0
    for d in docs:
        out.append(d)
        size += len(d)
        if size >= limit:
            break
    return out


def _check_weight_budget(cfg: TrainConfig, lm: TrainLM) -> None:
    """Fail before training when the weights alone leave under ~1 MB of the shipping budget for the rest
    (tokenizer.json ~0.4 MB, prompts, card, configs)."""
    head = EagleHead(eagle_config(lm.config_dict, cfg.model.eagle_intermediate_size))
    itemsize = torch.empty((), dtype=getattr(torch, cfg.export_dtype)).element_size()
    weights = (_count(lm) + _count(head)) * itemsize
    if weights > cfg.max_shipped_bytes - 1_000_000:
        raise RuntimeError(
            f"weights would take {weights:,} bytes; budget {cfg.max_shipped_bytes:,} (shrink the model)"
        )


def _budgets(cfg: TrainConfig) -> tuple[Budget, Budget]:
    """Model and EAGLE budgets: ``steps`` split by ``eagle_share`` if given, else ``minutes`` of wall time."""
    if cfg.steps > 0:
        eagle = cfg.eagle_steps or max(1, round(cfg.steps * cfg.eagle_share))
        return Budget(cfg.steps, 0.0), Budget(eagle, 0.0)
    total = cfg.minutes * 60.0
    return Budget(0, total * (1 - cfg.eagle_share)), Budget(cfg.eagle_steps, total * cfg.eagle_share)


def run(
    cfg: TrainConfig, stages: Sequence[str] = STAGES, echo: Callable[[str], None] = print
) -> dict[str, Any]:
    """Run the requested stages; returns (and writes) the metrics dict."""
    from tokenizers import Tokenizer

    bad = [s for s in stages if s not in STAGES]
    assert not bad, f"unknown stages {bad}; choose from {STAGES}"
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but torch sees no CUDA device")
    if not cfg.device.startswith("cuda"):
        use_torch_gdn()
    t0 = time.perf_counter()
    out = Path(cfg.out)
    model_dir = out / MODEL_DIRNAME
    model_dir.mkdir(parents=True, exist_ok=True)
    metrics_path = out / "metrics.json"
    metrics: dict[str, Any] = json.loads(metrics_path.read_text()) if metrics_path.is_file() else {}
    metrics.update(config=cfg.to_dict(), layer_types=cfg.model.layer_types(), torch=torch.__version__)
    metrics["hardware"] = _hardware(cfg.device)
    log = jsonl_logger(out / "train_log.jsonl", echo)

    torch.manual_seed(cfg.seed)
    corpus: Corpus = build_corpus(cfg.corpus, cfg.seed)
    (out / "corpus_files.json").write_text(json.dumps([[f.key, f.heldout] for f in corpus.files]) + "\n")
    echo(f"corpus: {len(corpus.files)} files, {corpus.manifest()}")

    if "tokenizer" in stages:
        sample = _tokenizer_sample(corpus.train_docs, cfg.corpus.tokenizer_sample_bytes)
        tok = train_tokenizer(sample, cfg.model.vocab_size)
        save_tokenizer(tok, model_dir, cfg.model.max_position_embeddings)
        metrics["tokenizer"] = {
            "vocab_size": tok.get_vocab_size(),
            "special_tokens": SPECIAL_TOKENS,
            "sample_bytes": sum(len(d.encode()) for d in sample),
        }
        write_prompts(
            build_prompts(corpus.files, cfg.corpus.prompts, cfg.seed), model_dir / "heldout_prompts.jsonl"
        )
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    eot = tok.token_to_id(ENDOFTEXT)
    if eot is None:
        raise ValueError(f"{model_dir / 'tokenizer.json'}: no {ENDOFTEXT} token")

    if "model" in stages or "eagle" in stages:
        data = TokenData(
            encode_stream(tok, corpus.train_docs, eot), encode_stream(tok, corpus.heldout_docs, eot)
        )
        manifest = corpus.manifest()
        manifest["train"]["tokens"], manifest["heldout"]["tokens"] = data.train.numel(), data.heldout.numel()
        metrics["corpus"] = {
            **manifest,
            "python": _platform.python_version(),
            "max_total_bytes": cfg.corpus.max_total_bytes,
            "heldout_percent": cfg.corpus.heldout_percent,
        }
        echo(
            f"tokens: train {data.train.numel():,}, held-out {data.heldout.numel():,} "
            f"({time.perf_counter() - t0:.1f} s)"
        )
        model_budget, eagle_budget = _budgets(cfg)
        if "model" in stages:
            lm = TrainLM(hf_config(cfg.model, eos_ids(tok), eot)).to(cfg.device)
            metrics["params"] = {"trunk": _count(lm.lm), "mtp": _count(lm.mtp)}
            _check_weight_budget(cfg, lm)
            model_budget.started = time.perf_counter()
            metrics["model"] = train_model(lm, data, cfg, model_budget, log)
            save_checkpoint(lm, model_dir, getattr(torch, cfg.export_dtype))
        else:
            lm = load_checkpoint(model_dir, cfg.device)
        if "eagle" in stages:
            torch.manual_seed(cfg.seed + 1)
            head = EagleHead(eagle_config(lm.config_dict, cfg.model.eagle_intermediate_size)).to(cfg.device)
            metrics.setdefault("params", {})["eagle"] = _count(head)
            eagle_budget.started = time.perf_counter()
            metrics["eagle"] = train_eagle(lm, head, data, cfg, eagle_budget, log)
            head.save_pretrained(model_dir / EAGLE_DIR, getattr(torch, cfg.export_dtype))

    return finish(model_dir, metrics, cfg, time.perf_counter() - t0, echo)


def finish(
    model_dir: Path, metrics: dict[str, Any], cfg: TrainConfig, seconds: float, echo: Callable[[str], None]
) -> dict[str, Any]:
    """metrics.json, MODEL_CARD.md (with sha256 of every other file), size check, summary."""
    metrics["wall_seconds_total"] = metrics.get("wall_seconds_total", 0.0) + seconds
    card_ready = all(k in metrics for k in ("corpus", "params", "tokenizer"))
    (model_dir / "metrics.json").write_text(json.dumps(_shipped(metrics), indent=2) + "\n")
    if card_ready:
        write_card(model_dir, metrics, file_hashes(model_dir))
    metrics["files"] = file_hashes(model_dir)
    metrics["shipped_bytes"] = check_size(model_dir, cfg.max_shipped_bytes)
    (model_dir.parent / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    echo(summary(metrics, model_dir))
    return metrics


def _shipped(metrics: dict[str, Any]) -> dict[str, Any]:
    """The metrics that ship with the model (no per-eval history, no file table)."""
    out = {k: v for k, v in metrics.items() if k not in ("files", "shipped_bytes")}
    for phase in ("model", "eagle"):
        if phase in out:
            out[phase] = {k: v for k, v in out[phase].items() if k != "history"}
    return out


def summary(m: dict[str, Any], model_dir: Path) -> str:
    mh = m.get("model", {}).get("heldout", {})
    eh = m.get("eagle", {}).get("heldout", {})
    parts = [
        f"model folder: {model_dir} ({m['shipped_bytes']:,} bytes)",
        f"hardware: {m['hardware']}",
    ]
    if "model" in m:
        parts.append(
            f"trunk+MTP: {m['model']['steps']} steps, {m['model']['tokens_seen']:,} tokens, "
            f"{m['model']['seconds']:.1f} s; held-out loss {mh.get('lm', float('nan')):.4f}, "
            f"ppl {mh.get('ppl', float('nan')):.3f}; MTP agree "
            + ", ".join(f"{mh[k]:.3f}" for k in sorted(mh) if k.startswith("agree"))
        )
    if "eagle" in m:
        parts.append(
            f"EAGLE: {m['eagle']['steps']} steps, {m['eagle']['seconds']:.1f} s; agree "
            + ", ".join(f"{eh[k]:.3f}" for k in sorted(eh) if k.startswith("agree"))
        )
    return "\n".join(["== lumotree train summary =="] + parts)

"""Training loops: the trunk with its MTP layer jointly, then the EAGLE head on the frozen trunk.

Losses on a window of token ids ``w`` (row t of the trunk sees ``w[:t+1]``):
- next token: ``CE(lm_head(h_t), w[t+1])``;
- MTP depth d (d = 1..mtp_depth): ``m^d_t = mtp(embed(w[t+d]), m^{d-1}_t)`` with ``m^0 = h``, loss
  ``CE(lm_head(m^d_t), w[t+d+1])`` - depth 1 is DeepSeek-V3 / Qwen's objective, deeper depths train the
  recursion an MTP-k chain runs at inference;
- EAGLE (trunk frozen), the same unroll with the head: feature loss ``smooth_l1(e^d_t, h_{t+d})`` plus the
  cross-entropy of ``lm_head(e^d_t)`` against the trunk's own distribution at ``t+d`` (distillation: greedy
  acceptance depends on agreeing with the target, not with the data).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lumotree.serving.drafters.eagle import EagleHead
from lumotree.serving.train.config import OptimConfig, TrainConfig
from lumotree.serving.train.data import TokenData, eval_windows, train_batch
from lumotree.serving.train.lm import TrainLM

Log = Callable[[dict[str, Any]], None]


@dataclass
class Budget:
    """Stop after ``steps`` steps, or (steps = 0) after ``seconds`` of wall time; ``progress`` drives LR."""

    steps: int
    seconds: float
    started: float = field(default_factory=time.perf_counter)

    def progress(self, step: int) -> float:
        if self.steps > 0:
            return step / self.steps
        return (time.perf_counter() - self.started) / max(1e-9, self.seconds)

    def done(self, step: int) -> bool:
        return self.progress(step) >= 1.0

    def elapsed(self) -> float:
        return time.perf_counter() - self.started


def lr_factor(step: int, progress: float, optim: OptimConfig, warmup: int) -> float:
    """Linear warmup over ``warmup`` steps, then cosine from 1 to ``min_lr_ratio`` over the run's progress."""
    if step < warmup:
        return (step + 1) / warmup
    p = min(1.0, max(0.0, progress))
    return optim.min_lr_ratio + (1 - optim.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p))


def make_optimizer(module: nn.Module, optim: OptimConfig, device: str) -> torch.optim.AdamW:
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, p in module.named_parameters():
        if not p.requires_grad:
            continue
        # Norm gains, A_log / dt_bias and the (tied) embedding are not decayed.
        (decay if p.dim() >= 2 and "embed" not in name else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": optim.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=optim.lr, betas=optim.betas, fused=device.startswith("cuda"))


def autocast(cfg: TrainConfig) -> Any:
    if cfg.device.startswith("cuda"):
        return torch.autocast("cuda", dtype=getattr(torch, cfg.dtype))
    return nullcontext()


def ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def unroll(
    step_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    embed: nn.Embedding,
    hidden: torch.Tensor,
    window: torch.Tensor,
    depth: int,
) -> list[torch.Tensor]:
    """Feature heads chained ``depth`` times: entry d-1 is ``f^d`` [B, T, H] (predicts ``window[t+d+1]``)."""
    seq = hidden.shape[1]
    out, feats = [], hidden
    for d in range(1, depth + 1):
        feats = step_fn(embed(window[:, d : d + seq]), feats)
        out.append(feats)
    return out


def _head_losses(
    lm: TrainLM, feats: list[torch.Tensor], h: torch.Tensor, window: torch.Tensor, seq: int
) -> dict[str, torch.Tensor]:
    """Per depth d: CE against the data token, agreement with the trunk's greedy token at t+d (an acceptance
    proxy: a greedy draft is accepted when it equals the target's argmax), and the trunk's logits there."""
    out: dict[str, torch.Tensor] = {}
    for d, f in enumerate(feats, start=1):
        logits = lm.logits(f).float()
        out[f"ce{d}"] = ce(logits, window[:, d + 1 : d + 1 + seq])
        with torch.no_grad():
            greedy = lm.logits(h[:, d : d + seq]).argmax(-1)
        out[f"agree{d}"] = (logits.argmax(-1) == greedy).float().mean().detach()
    return out


def model_losses(lm: TrainLM, window: torch.Tensor, seq: int, depth: int) -> dict[str, torch.Tensor]:
    """Losses on a window batch [B, seq + depth + 1]: ``lm`` (next token), ``ce{d}``/``agree{d}`` (MTP d),
    ``loss`` (the sum the optimizer sees, MTP depths weighted by ``mtp_weight``, set by the caller)."""
    h = lm.hidden(window[:, : seq + depth])
    out = {"lm": ce(lm.logits(h[:, :seq]), window[:, 1 : seq + 1])}
    if lm.mtp is not None and depth > 0:
        feats = unroll(lm.mtp_step, lm.embed, h[:, :seq], window, depth)
        out.update(_head_losses(lm, feats, h, window, seq))
    return out


def eagle_losses(
    lm: TrainLM, head: EagleHead, window: torch.Tensor, seq: int, depth: int, feature_weight: float
) -> dict[str, torch.Tensor]:
    """EAGLE losses on [B, seq + depth + 1] with the trunk frozen: per depth the feature regression to
    ``h_{t+d}`` plus cross-entropy to the trunk's distribution at t+d; ``loss`` is their sum."""
    with torch.no_grad():
        h = lm.hidden(window[:, : seq + depth])
    pos = torch.arange(seq, device=window.device).unsqueeze(0).expand(window.shape[0], -1)
    feats = unroll(lambda e, f: head(e, f, pos), lm.embed, h[:, :seq], window, depth)
    out = _head_losses(lm, feats, h, window, seq)
    total = torch.zeros((), device=window.device)
    for d, f in enumerate(feats, start=1):
        with torch.no_grad():
            target = lm.logits(h[:, d : d + seq]).float().softmax(-1)
        out[f"feat{d}"] = F.smooth_l1_loss(f.float(), h[:, d : d + seq].float())
        out[f"kd{d}"] = -(target * lm.logits(f).float().log_softmax(-1)).sum(-1).mean()
        total = total + out[f"kd{d}"] + feature_weight * out[f"feat{d}"]
    out["loss"] = total / depth
    return out


@torch.no_grad()
def evaluate(
    loss_fn: Callable[[torch.Tensor], dict[str, torch.Tensor]], windows: torch.Tensor, cfg: TrainConfig
):
    """Mean of every loss/metric over the fixed held-out windows; adds ``ppl`` when ``lm`` is present."""
    sums: dict[str, float] = {}
    n = 0
    for i in range(0, windows.shape[0], cfg.batch_size):
        w = windows[i : i + cfg.batch_size].to(cfg.device)
        with autocast(cfg):
            out = loss_fn(w)
        for k, v in out.items():
            sums[k] = sums.get(k, 0.0) + float(v) * w.shape[0]
        n += w.shape[0]
    mean = {k: v / n for k, v in sums.items()}
    if "lm" in mean:
        mean["ppl"] = math.exp(min(mean["lm"], 50.0))
    return mean


def fit(
    module: nn.Module,
    loss_fn: Callable[[torch.Tensor], dict[str, torch.Tensor]],
    data: TokenData,
    cfg: TrainConfig,
    budget: Budget,
    depth: int,
    log: Log,
    phase: str,
) -> dict[str, Any]:
    """One optimisation run: seeded batches, warmup + cosine LR, clipping, periodic held-out evaluation."""
    opt = make_optimizer(module, cfg.optim, cfg.device)
    gen = torch.Generator().manual_seed(cfg.seed + (0 if phase == "model" else 1))
    length = cfg.seq_len + depth + 1
    windows = eval_windows(data.heldout, cfg.eval_batches * cfg.batch_size, length)
    train_stream = data.train.to(cfg.device)
    warmup = (
        min(cfg.optim.warmup_steps, max(1, budget.steps // 10)) if budget.steps else cfg.optim.warmup_steps
    )
    step, history = 0, []
    module.eval()
    history.append(
        {"phase": phase, "step": 0, **{f"heldout_{k}": v for k, v in evaluate(loss_fn, windows, cfg).items()}}
    )
    log(history[-1])
    module.train()
    while not budget.done(step):
        for g in opt.param_groups:
            g["lr"] = cfg.optim.lr * lr_factor(step, budget.progress(step), cfg.optim, warmup)
        window = train_batch(train_stream, cfg.batch_size, length, gen)
        with autocast(cfg):
            losses = loss_fn(window)
        opt.zero_grad(set_to_none=True)
        losses["loss"].backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), cfg.optim.grad_clip)
        opt.step()
        step += 1
        if step % cfg.log_every == 0 or step == 1:
            row = {"phase": phase, "step": step, "lr": opt.param_groups[0]["lr"], "seconds": budget.elapsed()}
            row.update({f"train_{k}": float(v.detach()) for k, v in losses.items()})
            log(row)
        if step % cfg.eval_every == 0:
            module.eval()
            history.append(
                {
                    "phase": phase,
                    "step": step,
                    **{f"heldout_{k}": v for k, v in evaluate(loss_fn, windows, cfg).items()},
                }
            )
            log(history[-1])
            module.train()
    module.eval()
    final = evaluate(loss_fn, windows, cfg)
    return {
        "steps": step,
        "tokens_seen": step * cfg.batch_size * cfg.seq_len,
        "seconds": budget.elapsed(),
        "heldout": final,
        "heldout_tokens": windows.shape[0] * cfg.seq_len,
        "history": history,
    }


def train_model(lm: TrainLM, data: TokenData, cfg: TrainConfig, budget: Budget, log: Log) -> dict[str, Any]:
    depth = cfg.mtp_train_depth if lm.mtp is not None else 0

    def loss_fn(window: torch.Tensor) -> dict[str, torch.Tensor]:
        out = model_losses(lm, window, cfg.seq_len, depth)
        mtp = [out[f"ce{d}"] for d in range(1, depth + 1)]
        out["loss"] = out["lm"] + (cfg.mtp_loss_weight * torch.stack(mtp).mean() if mtp else 0.0)
        return out

    return fit(lm, loss_fn, data, cfg, budget, depth, log, "model")


def train_eagle(lm: TrainLM, head: EagleHead, data: TokenData, cfg: TrainConfig, budget: Budget, log: Log):
    lm.requires_grad_(False)
    lm.eval()
    depth = cfg.eagle_train_depth
    return fit(
        head,
        lambda w: eagle_losses(lm, head, w, cfg.seq_len, depth, cfg.eagle_feature_weight),
        data,
        cfg,
        budget,
        depth,
        log,
        "eagle",
    )


def jsonl_logger(path: Path, echo: Callable[[str], None] | None = print) -> Log:
    path.parent.mkdir(parents=True, exist_ok=True)

    def log(row: dict[str, Any]) -> None:
        with path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if echo is not None:
            keys = [k for k in row if k not in ("phase",)]
            echo(f"[{row.get('phase', '')}] " + " ".join(f"{k}={_fmt(row[k])}" for k in keys))

    return log


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)

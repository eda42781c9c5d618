"""The native sampling transforms, batched over rows, on the logits' device, without host syncs.

Order (fixed, the reference every arm reproduces):
  1. presence penalty: logit -= presence_penalty for every token present in the row's generated history;
  2. greedy rows (temperature == 0) stop here: argmax, ties -> lowest token id;
  3. temperature: logit / T;
  4. top-k: keep every token whose scaled logit >= the k-th largest (ties at the boundary are all kept);
  5. top-p: over the top-k survivors' renormalized probabilities sorted descending, keep a token when the
     mass of tokens with strictly larger probability is < top_p (a tie group is kept or dropped whole);
  6. min-p: keep tokens with probability >= min_p * (largest probability), i.e. logit >= max + log(min_p).
Removed tokens get -inf; a draw is argmax(masked logits + Gumbel noise), see ``rng``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lumotree.serving.sampling.params import SamplingParams

NEG_INF = float("-inf")


@dataclass
class RowParams:
    """Sampling parameters of R rows as device tensors plus the host facts that pick the code path."""

    temperature: torch.Tensor  # [R] float32, 0 = greedy
    top_k: torch.Tensor  # [R] int64, vocab size where disabled
    top_p: torch.Tensor  # [R] float32, 1 where disabled
    min_p: torch.Tensor  # [R] float32
    presence_penalty: torch.Tensor  # [R] float32
    all_greedy: bool  # host: no row samples, skip transforms and noise
    sort_width: int  # host: 0 = no row needs sorted logits; else how many top logits to sort
    any_penalty: bool  # host: some row has a nonzero presence penalty
    any_min_p: bool  # host: some row uses min-p

    @staticmethod
    def build(params: Sequence[SamplingParams], vocab: int, device: torch.device | str) -> RowParams:
        sampled = [p for p in params if not p.greedy]
        if any(p.top_p_enabled and not p.top_k_enabled for p in sampled):
            width = vocab  # top-p over the whole vocabulary needs a full sort
        else:
            width = min(vocab, max((p.top_k for p in sampled if p.top_k_enabled), default=0))

        def t(xs: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(xs, dtype=dtype).to(device, non_blocking=True)

        return RowParams(
            temperature=t([p.temperature for p in params], torch.float32),
            top_k=t([min(p.top_k, vocab) if p.top_k_enabled else vocab for p in params], torch.int64),
            top_p=t([p.top_p for p in params], torch.float32),
            min_p=t([p.min_p for p in params], torch.float32),
            presence_penalty=t([p.presence_penalty for p in params], torch.float32),
            all_greedy=not sampled,
            sort_width=width,
            any_penalty=any(p.presence_penalty != 0.0 for p in params),
            any_min_p=any(p.min_p > 0.0 for p in sampled),
        )

    def index(self, rows: torch.Tensor) -> RowParams:
        """Parameters for rows gathered by ``rows`` (e.g. request -> tree node); host facts carry over."""
        return RowParams(
            self.temperature[rows],
            self.top_k[rows],
            self.top_p[rows],
            self.min_p[rows],
            self.presence_penalty[rows],
            self.all_greedy,
            self.sort_width,
            self.any_penalty,
            self.any_min_p,
        )


def apply_presence(logits: torch.Tensor, present: torch.Tensor | None, rp: RowParams) -> torch.Tensor:
    """logits [R, V] fp32, present [R, V] bool -> penalized copy (the input is never modified)."""
    if present is None or not rp.any_penalty:
        return logits
    return logits - rp.presence_penalty[:, None] * present.to(logits.dtype)


def argmax_lowest(x: torch.Tensor) -> torch.Tensor:
    """Row argmax [R] int64 with the documented tie rule: the lowest token id among the maxima.

    ``torch.argmax`` documents exactly this rule (the first maximal index) and reads the logits once, where
    max / compare / min read them three times: at 32 verify rows of a 248k vocabulary that is most of the
    walk's time. ``tests/serving/test_walk_static.py`` checks the rule on every device the suite sees."""
    return torch.argmax(x, dim=-1)


def filter_logits(penalized: torch.Tensor, rp: RowParams) -> torch.Tensor:
    """Steps 3-6: temperature-scaled logits [R, V] with removed tokens at -inf."""
    temp = torch.where(rp.temperature > 0, rp.temperature, torch.ones_like(rp.temperature))
    x = penalized / temp[:, None]
    rows, vocab = x.shape
    thr = torch.full((rows,), NEG_INF, device=x.device, dtype=x.dtype)
    width = rp.sort_width
    if width > 0:
        if width < vocab:
            sorted_x = torch.topk(x, width, dim=-1, sorted=True).values
        else:
            sorted_x = torch.sort(x, dim=-1, descending=True).values
        k_on = rp.top_k < vocab
        kth = sorted_x.gather(1, (rp.top_k.clamp(max=width) - 1)[:, None]).squeeze(1)
        thr_k = torch.where(k_on, kth, torch.full_like(kth, NEG_INF))
        in_list = sorted_x >= thr_k[:, None]
        # Tokens tied with the k-th value beyond the sorted window still belong to the kept set's mass.
        extra = (x >= thr_k[:, None]).sum(-1) - in_list.sum(-1)
        top = sorted_x[:, :1]
        e = torch.where(in_list, torch.exp(sorted_x - top), torch.zeros_like(sorted_x))
        z = e.sum(-1) + torch.where(k_on, extra * torch.exp(thr_k - top[:, 0]), torch.zeros_like(kth))
        probs = e / z[:, None]
        exclusive = torch.cumsum(probs, dim=-1) - probs
        # Mass strictly above a token = exclusive mass at the start of its tie group.
        idx = torch.arange(width, device=x.device).expand(rows, width)
        starts = torch.ones_like(in_list)
        starts[:, 1:] = sorted_x[:, 1:] != sorted_x[:, :-1]
        group_start = torch.cummax(torch.where(starts, idx, torch.zeros_like(idx)), dim=-1).values
        keep = in_list & (exclusive.gather(1, group_start) < rp.top_p[:, None])
        count = keep.sum(-1).clamp(min=1)
        thr_p = sorted_x.gather(1, (count - 1)[:, None]).squeeze(1)
        thr_p = torch.where(rp.top_p < 1.0, thr_p, torch.full_like(thr_p, NEG_INF))
        thr = torch.maximum(thr_k, thr_p)
    if rp.any_min_p:
        log_min_p = torch.where(rp.min_p > 0, torch.log(rp.min_p), torch.full_like(rp.min_p, NEG_INF))
        thr = torch.maximum(thr, x.max(dim=-1).values + log_min_p)
    return torch.where(x >= thr[:, None], x, torch.full_like(x, NEG_INF))


def probabilities(logits: torch.Tensor, present: torch.Tensor | None, rp: RowParams) -> torch.Tensor:
    """The exact next-token distribution [R, V] of each row (one-hot at the argmax for greedy rows)."""
    penalized = apply_presence(logits, present, rp)
    probs = torch.softmax(filter_logits(penalized, rp), dim=-1)
    greedy = torch.nn.functional.one_hot(argmax_lowest(penalized), logits.shape[-1]).to(probs.dtype)
    return torch.where((rp.temperature == 0)[:, None], greedy, probs)

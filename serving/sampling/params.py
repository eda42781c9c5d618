"""Per-request sampling parameters, validated with messages a user of the HTTP API can act on."""

from __future__ import annotations

from dataclasses import dataclass, field

# OpenAI's documented range for presence_penalty.
PRESENCE_PENALTY_RANGE = (-2.0, 2.0)


@dataclass
class SamplingParams:
    """How one request chooses its tokens.

    Transforms run in this fixed order (see ``lumotree.serving.sampling.transforms``): presence penalty
    over the generated history, temperature, top-k, top-p, min-p. ``temperature == 0`` means greedy:
    argmax of the penalized logits, ties broken towards the lowest token id.
    """

    temperature: float = 1.0
    """Softmax temperature; 0 selects greedy decoding."""
    top_p: float = 1.0
    """Nucleus mass in (0, 1]; 1 disables it. Tokens tied at the cut are all kept."""
    top_k: int = -1
    """Keep the k largest logits plus every token tied with the k-th; -1 or 0 disables it."""
    min_p: float = 0.0
    """Drop tokens whose probability is below min_p times the largest probability; 0 disables it."""
    presence_penalty: float = 0.0
    """Subtracted once from the logit of every token that already occurs in the generated output."""
    max_tokens: int = 16
    """Upper bound on generated tokens (the first token counts)."""
    seed: int | None = None
    """Seed of the request's random stream; None draws a fresh one. Same seed + same logits = same tokens."""
    stop: list[str] = field(default_factory=list)
    """Stop strings: generation ends before the first occurrence, which is cut from the text."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Extra token ids that end generation (kept in the output, like EOS)."""
    ignore_eos: bool = False
    """Keep generating past the model's EOS tokens (benchmarks)."""

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the field and the allowed range."""

        def bad(name: str, rule: str) -> None:
            raise ValueError(f"{name} must be {rule}, got {getattr(self, name)!r}")

        def is_num(x: object) -> bool:
            return isinstance(x, int | float) and not isinstance(x, bool) and x == x  # rejects NaN

        if not is_num(self.temperature) or not 0.0 <= self.temperature < float("inf"):
            bad("temperature", "a finite number >= 0")
        if not is_num(self.top_p) or not 0.0 < self.top_p <= 1.0:
            bad("top_p", "in (0, 1]")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < -1:
            bad("top_k", "an integer >= 1, or -1 / 0 to disable")
        if not is_num(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            bad("min_p", "in [0, 1]")
        lo, hi = PRESENCE_PENALTY_RANGE
        if not is_num(self.presence_penalty) or not lo <= self.presence_penalty <= hi:
            bad("presence_penalty", f"in [{lo}, {hi}]")
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            bad("max_tokens", "an integer >= 1")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            bad("seed", "an integer or null")
        if not all(isinstance(s, str) and s for s in self.stop):
            bad("stop", "a list of non-empty strings")
        if not all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
            bad("stop_token_ids", "a list of token ids >= 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def top_k_enabled(self) -> bool:
        return self.top_k > 0

    @property
    def top_p_enabled(self) -> bool:
        return self.top_p < 1.0

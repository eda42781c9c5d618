"""``lumotree bench acceptance``: greedy acceptance of every speculative arm on a model's held-out prompts.

Each arm decodes the same prompts greedily through the engine (continuous batching, ``--batch`` requests at
a time). Per arm: accepted drafts per verify step, tokens per step (1 + accepted per step: the bonus token
plus the accepted drafts), vLLM's acceptance rate (accepted / draft tokens) and mean acceptance length
(1 + accepted / drafts), per-position acceptance, decode throughput, and a check that the arm's greedy tokens
equal AR's on every prompt (speculation is lossless or the numbers are void). ``--record`` writes the summary
into the model card.

Prompt files are JSON lines; ``prompt`` is the exact text to feed (held-out chat prompts already carry the
chat template and its generation prompt); a row with only ``messages`` goes through the tokenizer's chat
template.
"""

from __future__ import annotations

import json
import shlex
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, cast

import typer

from lumotree.platform.provenance import git_commit

ARM_SPECS: dict[str, tuple[str, dict[str, Any]]] = {
    "ar": ("ar", {}),
    "mtp": ("mtp", {}),
    "eagle": ("eagle", {}),
    "lumotree": ("lumotree", {"tree": "hydra27"}),
    "lumotree-adaptive": ("lumotree", {"tree": "adaptive"}),
}
"""Bench arm name -> (engine arm, arm options); ``--mtp-k`` is added to the MTP-drafted arms."""
DEFAULT_ARMS = "ar,mtp,eagle,lumotree,lumotree-adaptive"
PROMPTS_FILE = "heldout_prompts.jsonl"


@dataclass
class AcceptanceConfig:
    """One acceptance measurement."""

    model: str = "tiny"
    """Built-in model name or checkpoint directory."""
    arms: list[str] = field(default_factory=lambda: DEFAULT_ARMS.split(","))
    """Bench arm names (keys of ARM_SPECS); AR always runs first as the greedy reference."""
    prompts: str | None = None
    """JSON-lines prompt file; None = the model's heldout_prompts.jsonl."""
    limit: int | None = None
    """Use only the first N prompts."""
    max_tokens: int = 128
    """Greedy tokens generated per prompt (fewer when EOS comes first, unless ignore_eos)."""
    batch: int = 8
    """Requests decoded together (the engine's max_seqs)."""
    device: str | None = None
    """cpu or cuda; None = cuda when available."""
    dtype: str | None = None
    """Weight dtype; None = float32 on CPU, the checkpoint's on CUDA."""
    mtp_k: int = 5
    """MTP chain length of the mtp arm and the MTP spine of the lumotree arms."""
    ignore_eos: bool = False
    """Keep generating past EOS (longer outputs; acceptance over the same decoding rule)."""
    threads: int = 0
    """torch CPU threads; 0 = leave torch's default."""

    def __post_init__(self) -> None:
        unknown = [a for a in self.arms if a not in ARM_SPECS]
        assert not unknown, f"unknown arms {unknown}; choose from {', '.join(ARM_SPECS)}"
        assert self.max_tokens >= 1 and self.batch >= 1, "max_tokens and batch must be positive"
        assert self.limit is None or self.limit >= 1, "limit must be positive"

    def command(self) -> str:
        """The command line that reproduces this measurement (output options left out)."""
        args = ["lumotree", "bench", "acceptance", "--model", self.model, "--arms", ",".join(self.arms)]
        if self.prompts is not None:
            args += ["--prompts", self.prompts]
        if self.limit is not None:
            args += ["--limit", str(self.limit)]
        args += ["--max-tokens", str(self.max_tokens), "--batch", str(self.batch)]
        if self.device:
            args += ["--device", self.device]
        if self.dtype:
            args += ["--dtype", self.dtype]
        if self.mtp_k != 5:
            args += ["--mtp-k", str(self.mtp_k)]
        if self.ignore_eos:
            args.append("--ignore-eos")
        if self.threads:
            args += ["--threads", str(self.threads)]
        return shlex.join(args)

    def arm_options(self, name: str) -> tuple[str, dict[str, Any]]:
        arm, opts = ARM_SPECS[name]
        return arm, ({**opts, "mtp_k": self.mtp_k} if arm in ("mtp", "lumotree") else dict(opts))

    def card_label(self, name: str) -> str:
        """The arm's row name in the model card (its drafter settings and the EOS rule spelled out)."""
        label = {"mtp": f"mtp-{self.mtp_k}", "eagle": "eagle (7 steps)", "lumotree": "lumotree hydra27"}.get(
            name, name.replace("-", " ")
        )
        return label + (" (ignore-eos)" if self.ignore_eos else "")


@dataclass
class Prompt:
    id: str
    kind: str
    token_ids: list[int]


def load_prompts(path: Path, tokenizer: Any, limit: int | None) -> list[Prompt]:
    """Token ids of each row: ``prompt`` verbatim (it is the exact text to feed), else ``messages`` through
    the chat template with the generation prompt."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    out = []
    for i, row in enumerate(rows[:limit]):
        if "prompt" in row:
            text = row["prompt"]
        elif "messages" in row:
            text = tokenizer.apply_chat_template(row["messages"], add_generation_prompt=True)
        else:
            raise ValueError(f"{path.name} line {i + 1}: neither 'prompt' nor 'messages'")
        out.append(Prompt(str(row.get("id", i)), str(row.get("kind", "prompt")), tokenizer.encode(text)))
    if not out:
        raise ValueError(f"{path} holds no prompts")
    return out


def _per_step(reqs: list[Any]) -> dict[str, float]:
    """Pooled over requests: every verify step of every request counts once."""
    steps = sum(r.stats.decode_steps for r in reqs)
    acc = sum(r.stats.accepted_tokens for r in reqs)
    emitted = sum(len(r.output_ids) - 1 for r in reqs)  # the first token comes from prefill
    return {
        "requests": len(reqs),
        "verify_steps": steps,
        "accepted_per_step": acc / steps if steps else 0.0,
        "tokens_per_step": 1.0 + acc / steps if steps else 1.0,
        "emitted_per_step": emitted / steps if steps else 0.0,
    }


def summarize(
    reqs: list[Any], prompts: list[Prompt], counters: dict[str, Any], wall: float
) -> dict[str, Any]:
    """One arm's figures from its finished requests and its engine's counters."""
    drafts, draft_tokens, accepted = counters["drafts"], counters["draft_tokens"], counters["accepted_tokens"]
    assert accepted == sum(r.stats.accepted_tokens for r in reqs), "engine and request counters disagree"
    decode_tokens = sum(len(r.output_ids) - 1 for r in reqs)
    kinds = sorted({p.kind for p in prompts})
    return {
        **_per_step(reqs),
        "generated_tokens": sum(len(r.output_ids) for r in reqs),
        "drafts": drafts,
        "draft_tokens": draft_tokens,
        "accepted_tokens": accepted,
        "acceptance_rate": accepted / draft_tokens if draft_tokens else 0.0,
        "acceptance_length": 1.0 + accepted / drafts if drafts else 1.0,
        "per_position_acceptance": [n / drafts for n in counters["accepted_per_pos"]] if drafts else [],
        "decode_seconds": counters["decode_seconds"],
        "decode_tok_s": decode_tokens / counters["decode_seconds"] if counters["decode_seconds"] else 0.0,
        "prefill_seconds": counters["prefill_seconds"],
        "wall_seconds": wall,
        "engine_steps": counters["steps"],
        "finish_reasons": dict(Counter(str(r.finish_reason) for r in reqs)),
        "by_kind": {
            k: _per_step([r for r, p in zip(reqs, prompts, strict=True) if p.kind == k]) for k in kinds
        },
    }


def mismatches(prompts: list[Prompt], ref: list[list[int]], got: list[list[int]]) -> list[dict[str, Any]]:
    """Prompts whose tokens differ from the reference, with the first differing index."""
    out = []
    for p, a, b in zip(prompts, ref, got, strict=True):
        if a != b:
            i = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            out.append({
                "id": p.id, "index": i, "ar_token": a[i] if i < len(a) else None,
                "arm_token": b[i] if i < len(b) else None, "ar_len": len(a), "arm_len": len(b),
            })  # fmt: skip
    return out


DECIDING_PATHS = (
    "serving", "kernels", "platform/benches/acceptance.py",
    ":(exclude)serving/builtin/*/MODEL_CARD.md", ":(exclude)serving/builtin/*/metrics.json",
)  # fmt: skip
"""The code and weights that decide the measured tokens (a recorded card changes none of them)."""


def _run_arm(
    model: Any, tok: Any, cfg: AcceptanceConfig, name: str, prompts: list[Prompt], progress: Any
) -> Any:
    from lumotree.serving.engine import Engine, EngineConfig
    from lumotree.serving.request import Status
    from lumotree.serving.sampler import SamplingParams

    arm, opts = cfg.arm_options(name)
    longest = max(len(p.token_ids) for p in prompts)
    ecfg = EngineConfig(
        model=cfg.model, arm=arm, arm_options=opts, device=str(next(model.parameters()).device),
        max_seqs=cfg.batch, max_model_len=longest + cfg.max_tokens + 1,
    )  # fmt: skip
    eng = Engine(model, tok, ecfg)
    params = SamplingParams(temperature=0.0, max_tokens=cfg.max_tokens, ignore_eos=cfg.ignore_eos)
    task = progress(name, len(prompts)) if progress else None
    t0 = time.perf_counter()
    reqs = [eng.add_request(p.token_ids, params, req_id=p.id) for p in prompts]
    done = 0
    while eng.has_unfinished():
        eng.step()
        n = sum(r.status is Status.FINISHED for r in reqs)
        if task and n != done:
            task(n - done)
        done = n
    wall = time.perf_counter() - t0
    eng.check_no_leaks()
    return reqs, eng.counters.as_dict(), wall


def run(cfg: AcceptanceConfig, progress: Any = None) -> dict[str, Any]:
    """Decode the prompts with AR and every requested arm; ``progress(name, total) -> advance(n)``."""
    import torch

    from lumotree.serving.builtin import resolve_model
    from lumotree.serving.loader import device_dtype, load_model
    from lumotree.serving.tokenizer import Tokenizer

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    path = resolve_model(cfg.model)
    device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model, _ = load_model(path, device=device, dtype=device_dtype(cfg.dtype, device))
    tok = Tokenizer.from_pretrained(path)
    prompt_file = Path(cfg.prompts) if cfg.prompts else path / PROMPTS_FILE
    prompts = load_prompts(prompt_file, tok, cfg.limit)
    t0 = time.perf_counter()
    arms: dict[str, Any] = {}
    ref: list[list[int]] = []
    for name in ["ar", *(a for a in cfg.arms if a != "ar")]:
        reqs, counters, wall = _run_arm(model, tok, cfg, name, prompts, progress)
        tokens = [list(r.output_ids) for r in reqs]
        if name == "ar":
            ref = tokens
        row = {"arm": cfg.arm_options(name)[0], "options": cfg.arm_options(name)[1]}
        row |= summarize(reqs, prompts, counters, wall)
        bad = mismatches(prompts, ref, tokens)
        arms[name] = row | {"greedy_equal_ar": not bad, "mismatches": bad}
    total_mismatches = sum(len(a["mismatches"]) for a in arms.values())
    return {
        "command": cfg.command(),
        "commit": git_commit(DECIDING_PATHS),
        "config": asdict(cfg),
        "model": path.name,
        "device": str(device),
        "dtype": str(model.dtype).removeprefix("torch."),
        "torch_threads": torch.get_num_threads(),
        "prompts": {
            "file": prompt_file.name,
            "count": len(prompts),
            "kinds": dict(Counter(p.kind for p in prompts)),
            "prompt_tokens": sum(len(p.token_ids) for p in prompts),
        },
        "arms": arms,
        "mismatched_prompts": total_mismatches,
        "ok": total_mismatches == 0,
        "wall_seconds": time.perf_counter() - t0,
    }


CARD_KEYS = (
    "tokens_per_step", "accepted_per_step", "acceptance_rate", "acceptance_length", "emitted_per_step",
    "per_position_acceptance", "decode_tok_s", "greedy_equal_ar",
)  # fmt: skip


def record(report: dict[str, Any], cfg: AcceptanceConfig) -> Path:
    """Merge the report's arms into the model's metrics.json and card (rows of other settings stay)."""
    from lumotree.serving.builtin import resolve_model
    from lumotree.serving.train.card import record_acceptance

    model_dir = resolve_model(cfg.model)
    old = json.loads((model_dir / "metrics.json").read_text()).get("acceptance") or {}
    setting = {
        "command": report["command"], "commit": report["commit"], "device": report["device"],
        "prompts": report["prompts"]["count"], "max_tokens": cfg.max_tokens, "ignore_eos": cfg.ignore_eos,
    }  # fmt: skip
    new = {
        cfg.card_label(name): {k: row[k] for k in CARD_KEYS} | setting for name, row in report["arms"].items()
    }
    record_acceptance(model_dir, cast(dict[str, dict[str, float]], old | new))
    return model_dir


def print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"greedy acceptance: {report['model']}, {report['prompts']['count']} prompts")
    for col in ("arm", "tok/step", "acc/step", "acc rate", "acc len", "decode tok/s", "= ar"):
        t.add_column(col)
    for name, a in report["arms"].items():
        t.add_row(
            name, f"{a['tokens_per_step']:.2f}", f"{a['accepted_per_step']:.2f}",
            f"{a['acceptance_rate']:.3f}", f"{a['acceptance_length']:.2f}", f"{a['decode_tok_s']:.1f}",
            "yes" if a["greedy_equal_ar"] else f"NO ({len(a['mismatches'])})",
        )  # fmt: skip
    Console().print(t)


def register(bench_app: typer.Typer) -> None:
    @bench_app.command("acceptance")
    def acceptance(
        model: Annotated[
            str, typer.Option(help="Built-in model name (tiny) or checkpoint directory.")
        ] = "tiny",
        arms: Annotated[
            str, typer.Option(help=f"Comma-separated arms of {', '.join(ARM_SPECS)}.")
        ] = DEFAULT_ARMS,
        prompts: Annotated[
            str | None, typer.Option(help="JSON-lines prompts (default: the model's heldout_prompts.jsonl).")
        ] = None,
        limit: Annotated[int | None, typer.Option(help="Use only the first N prompts.")] = None,
        max_tokens: Annotated[int, typer.Option(help="Greedy tokens per prompt.")] = 128,
        batch: Annotated[int, typer.Option(help="Requests decoded together.")] = 8,
        device: Annotated[
            str | None, typer.Option(help="cpu or cuda (default: cuda when available).")
        ] = None,
        dtype: Annotated[
            str | None, typer.Option(help="float32 | bfloat16 | float16 (default: float32 on CPU).")
        ] = None,
        mtp_k: Annotated[int, typer.Option(help="MTP chain length (mtp and lumotree arms).")] = 5,
        ignore_eos: Annotated[bool, typer.Option(help="Generate past EOS (longer outputs).")] = False,
        threads: Annotated[int, typer.Option(help="torch CPU threads (0: torch's default).")] = 0,
        as_json: Annotated[bool, typer.Option("--json", help="Print the JSON report.")] = False,
        out: Annotated[Path | None, typer.Option(help="Write the JSON report here.")] = None,
        record_card: Annotated[
            bool, typer.Option("--record", help="Write the result into the model's metrics.json and card.")
        ] = False,
        from_report: Annotated[
            Path | None,
            typer.Option(help="Use this saved JSON report (its own settings) instead of measuring again."),
        ] = None,
    ) -> None:
        """Greedy acceptance of MTP, EAGLE and LumoTree on held-out prompts, and greedy equality with AR."""
        import torch
        from rich.console import Console
        from rich.progress import Progress

        names = [a.strip() for a in arms.split(",") if a.strip()]
        if unknown := [a for a in names if a not in ARM_SPECS]:
            raise typer.BadParameter(f"unknown arms {unknown}; choose from {', '.join(ARM_SPECS)}")
        if device and device.startswith("cuda") and not torch.cuda.is_available():
            raise typer.BadParameter("--device cuda: no CUDA device is available")
        cfg = AcceptanceConfig(
            model=model, arms=names, prompts=prompts, limit=limit, max_tokens=max_tokens, batch=batch,
            device=device, dtype=dtype, mtp_k=mtp_k, ignore_eos=ignore_eos, threads=threads,
        )  # fmt: skip
        if from_report is not None:
            report = json.loads(from_report.read_text())
            cfg = AcceptanceConfig(**report["config"])
        else:
            # Progress goes to stderr so that --json keeps stdout a clean JSON document.
            with Progress(console=Console(stderr=True)) as bar:

                def progress(name: str, total: int) -> Any:
                    task = bar.add_task(name, total=total)
                    return lambda n: bar.advance(task, n)

                report = run(cfg, progress)
        text = json.dumps(report, indent=2)
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text + "\n")
        if as_json:
            print(text)
        else:
            print_table(report)
        if not report["ok"]:
            bad = {
                n: [m["id"] for m in a["mismatches"]] for n, a in report["arms"].items() if a["mismatches"]
            }
            typer.echo(f"greedy outputs differ from ar: {bad}", err=True)
            raise typer.Exit(1)
        if record_card:
            model_dir = record(report, cfg)
            typer.echo(f"recorded in {model_dir.name}/metrics.json and MODEL_CARD.md", err=True)

"""MODEL_CARD.md of the built-in model, written from the run's metrics (nothing in it is typed by hand)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

CARD = "MODEL_CARD.md"


def _f(x: Any, nd: int = 4) -> str:
    return f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def _depths(heldout: dict[str, float], prefix: str) -> str:
    keys = sorted(k for k in heldout if k.startswith(prefix) and k[len(prefix) :].isdigit())
    return ", ".join(f"depth {k[len(prefix) :]}: {heldout[k]:.3f}" for k in keys) or "n/a"


def render_card(m: dict[str, Any], hashes: dict[str, dict[str, Any]]) -> str:
    cfg, dims, corpus = m["config"], m["config"]["model"], m["corpus"]
    model, eagle = m.get("model", {}), m.get("eagle", {})
    mh, eh = model.get("heldout", {}), eagle.get("heldout", {})
    acc = m.get("acceptance")
    lines = [
        "# lumo-tiny",
        "",
        "A small Qwen3.5-architecture code model (Gated DeltaNet + gated attention hybrid) with one MTP",
        "layer and an EAGLE draft head, trained from scratch by `lumotree train all`. It exists so that",
        "every command has an offline default whose speculative drafts are really accepted; it is not a",
        "useful assistant.",
        "",
        "## Architecture",
        "",
        f"- `qwen3_5_text`: vocab {dims['vocab_size']}, hidden {dims['hidden_size']}, "
        f"{dims['num_hidden_layers']} layers ({', '.join(m['layer_types'])}), "
        f"SwiGLU {dims['intermediate_size']}",
        f"- GDN: {dims['linear_num_key_heads']} key heads x {dims['linear_key_head_dim']}, "
        f"{dims['linear_num_value_heads']} value heads x {dims['linear_value_head_dim']}, conv "
        f"{dims['linear_conv_kernel_dim']}",
        f"- attention: {dims['num_attention_heads']} query / {dims['num_key_value_heads']} KV heads x "
        f"{dims['head_dim']}, output gate, partial rotary {dims['partial_rotary_factor']}, "
        f"tied embeddings: {dims['tie_word_embeddings']}",
        f"- MTP: {dims['mtp_num_hidden_layers']} layer (`mtp.*`: fc over [norm(embed), norm(hidden)], one "
        "full-attention layer, norm, shared lm_head)",
        f"- EAGLE head (`eagle/`): fc over [embed, target hidden], one full-attention layer (SwiGLU "
        f"{dims['eagle_intermediate_size']}), norm, shared lm_head",
        f"- parameters: trunk {m['params']['trunk']:,}, MTP {m['params']['mtp']:,}, "
        f"EAGLE {m['params'].get('eagle', 0):,}; shipped as {cfg['export_dtype']}",
        "",
        "## Tokenizer",
        "",
        f"Byte-level BPE, {m['tokenizer']['vocab_size']} tokens, Qwen2 split pattern, special tokens "
        f"{', '.join(m['tokenizer']['special_tokens'])}; ChatML chat template "
        "(`<|im_start|>role\\n...<|im_end|>`),"
        f" eos `<|im_end|>`. Fitted on {m['tokenizer']['sample_bytes']:,} bytes of training text.",
        "",
        "## Corpus",
        "",
        f"Python files of the training machine's interpreter (stdlib and site-packages; Python "
        f"{corpus['python']}), taken in sha256-of-path order up to {corpus['max_total_bytes']:,} bytes, "
        "split "
        f"by file: held out when sha256(path) % 100 < {corpus['heldout_percent']}. "
        f"{int(cfg['corpus']['chat_fraction'] * 100)}% of the documents are synthetic bash-agent transcripts "
        "built from those files (real command outputs: head/cat, sed ranges, grep -n, a heredoc edit and its "
        "git diff) in the agent's own message format.",
        "",
        "| split | files | file bytes | documents | agent transcripts | tokens |",
        "|---|---|---|---|---|---|",
    ]
    for split in ("train", "heldout"):
        s = corpus[split]
        lines.append(
            f"| {split} | {s['files']:,} | {s['file_bytes']:,} | {s['documents']:,} | {s['chat_documents']:,}"
            f" | {s['tokens']:,} |"
        )
    lines += [
        "",
        "## Training",
        "",
        f"- hardware: {m['hardware']}; torch {m['torch']}; seed {cfg['seed']}",
        f"- AdamW (lr {cfg['optim']['lr']}, betas {tuple(cfg['optim']['betas'])}, weight decay "
        f"{cfg['optim']['weight_decay']}), warmup + cosine, "
        f"batch {cfg['batch_size']} x {cfg['seq_len']} tokens"
        + (f", {cfg['dtype']} autocast" if cfg["device"].startswith("cuda") else ", float32"),
        f"- trunk + MTP jointly: {model.get('steps', 0):,} steps, "
        f"{model.get('tokens_seen', 0):,} tokens seen, "
        f"{_f(model.get('seconds', 0.0), 1)} s; loss = next-token CE + {cfg['mtp_loss_weight']} x MTP CE "
        f"(unrolled to depth {cfg['mtp_train_depth']})",
        f"- EAGLE head on the frozen trunk: {eagle.get('steps', 0):,} steps, {eagle.get('tokens_seen', 0):,}"
        f" tokens, {_f(eagle.get('seconds', 0.0), 1)} s; loss = KL to the trunk's distribution + "
        f"{cfg['eagle_feature_weight']} x smooth-L1 feature regression "
        f"(unrolled to depth {cfg['eagle_train_depth']})",
        "",
        "## Held-out results",
        "",
        f"Over {model.get('heldout_tokens', 0):,} held-out tokens (fixed windows):",
        "",
        f"- next-token loss {_f(mh.get('lm', float('nan')))} nats, "
        f"perplexity {_f(mh.get('ppl', float('nan')), 3)}",
        f"- MTP cross-entropy: {_depths(mh, 'ce')}",
        f"- MTP argmax = trunk argmax (greedy acceptance proxy): {_depths(mh, 'agree')}",
        f"- EAGLE argmax = trunk argmax: {_depths(eh, 'agree')}",
        "",
        "## Greedy acceptance (held-out prompts; mean tokens per step = accepted drafts + 1 bonus token)",
        "",
    ]
    if acc:
        lines += ["| arm | tokens per step | acceptance rate |", "|---|---|---|"]
        lines += [
            f"| {a} | {_f(v['tokens_per_step'], 2)} | {_f(v['acceptance_rate'], 3)} |" for a, v in acc.items()
        ]
    else:
        lines.append(
            "Not measured in this run: measure with the arms on `heldout_prompts.jsonl` "
            "(greedy, MTP-5, EAGLE, "
            "LumoTree hydra27) and record the result here."
        )
    lines += ["", "## Files", "", "| file | bytes | sha256 |", "|---|---|---|"]
    lines += [f"| {name} | {h['bytes']:,} | `{h['sha256']}` |" for name, h in hashes.items() if name != CARD]
    return "\n".join(lines) + "\n"


def write_card(root: Path, metrics: dict[str, Any], hashes: dict[str, dict[str, Any]]) -> None:
    (root / CARD).write_text(render_card(metrics, hashes))


def record_acceptance(model_dir: Path, acceptance: dict[str, dict[str, float]]) -> None:
    """Add measured greedy acceptance (arm -> {tokens_per_step, acceptance_rate}) to the shipped metrics.json
    and rewrite MODEL_CARD.md (with fresh file hashes)."""
    import json

    from lumotree.serving.train.export import file_hashes

    for arm, row in acceptance.items():
        assert {"tokens_per_step", "acceptance_rate"} <= set(row), f"{arm}: {row}"
    path = model_dir / "metrics.json"
    metrics = json.loads(path.read_text())
    metrics["acceptance"] = acceptance
    path.write_text(json.dumps(metrics, indent=2) + "\n")
    write_card(model_dir, metrics, file_hashes(model_dir))

"""Config parsing, checkpoint loading (single file, shards, wrapper names, MTP), their errors; tokenizer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from checkpoints import LAYOUTS, tiny_config_dict
from safetensors.torch import load_file, save_file

from lumotree.serving.config import ConfigError, ModelConfig
from lumotree.serving.loader import CheckpointError, load_model
from lumotree.serving.tokenizer import Tokenizer


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_config_fields_and_wrapper(tmp_path: Path) -> None:
    raw = tiny_config_dict(LAYOUTS["gdn3_attn1"])
    cfg = ModelConfig.from_dict(raw)
    assert cfg.gdn_layers == (0, 1, 2) and cfg.attn_layers == (3,)
    assert cfg.rotary_dim == 8 and cfg.conv_dim == 2 * 32 + 64 and cfg.eos_token_ids == (299,)
    wrapped = {
        "model_type": "qwen3_5",
        "text_config": {**raw, "model_type": "qwen3_5_text"},
        "tie_word_embeddings": True,
    }
    wrapped["text_config"].pop("tie_word_embeddings")
    assert ModelConfig.from_dict(wrapped).tie_word_embeddings
    legacy = {k: v for k, v in raw.items() if k not in ("layer_types", "rope_parameters")}
    legacy.update(rope_theta=5000.0, partial_rotary_factor=0.5, full_attention_interval=2)
    lc = ModelConfig.from_dict(legacy)
    assert lc.layer_types == ("linear_attention", "full_attention") * 2 and lc.rope_theta == 5000.0


@pytest.mark.parametrize(
    ("patch", "needle"),
    [
        ({"model_type": "llama"}, "'model_type'"),
        ({"hidden_size": None}, "'hidden_size'"),
        ({"num_key_value_heads": "2"}, "'num_key_value_heads'"),
        ({"layer_types": ["linear_attention"]}, "'layer_types'"),
        ({"rope_parameters": {"rope_type": "yarn"}}, "rope_type"),
    ],
)
def test_config_errors_name_file_and_field(tmp_path: Path, patch: dict, needle: str) -> None:
    raw = tiny_config_dict(LAYOUTS["gdn3_attn1"])
    raw.update(patch)
    raw = {k: v for k, v in raw.items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError) as e:
        ModelConfig.from_pretrained(tmp_path)
    assert str(tmp_path / "config.json") in str(e.value) and needle in str(e.value)


def test_shards_wrapper_names_and_mtp_load(tiny_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    src = tiny_checkpoints["gdn3_attn1"]
    ref, cfg = load_model(src)
    assert ref.mtp is not None and cfg.mtp_num_hidden_layers == 1
    tensors = load_file(str(src / "model.safetensors"))
    torch.testing.assert_close(ref.mtp.fc.weight, tensors["mtp.fc.weight"], rtol=0, atol=0)
    torch.testing.assert_close(
        ref.mtp.layers[0].self_attn.q_proj.weight,
        tensors["mtp.layers.0.self_attn.q_proj.weight"],
        rtol=0,
        atol=0,
    )
    # Re-save as two shards with the multimodal wrapper's names and a wrapper config.
    dst = tmp_path / "sharded"
    dst.mkdir()
    renamed = {
        (k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k): v
        for k, v in tensors.items()
    }
    names = sorted(renamed)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for fname, keys in shards.items():
        save_file({k: renamed[k] for k in keys}, str(dst / fname))
        weight_map.update({k: fname for k in keys})
    (dst / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    text = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({"model_type": "qwen3_5", "text_config": text}))
    model, _ = load_model(dst, dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        torch.testing.assert_close(p.float(), q.bfloat16().float(), rtol=0, atol=0, msg=n)
    # A shard listed in the index but missing is named.
    (dst / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors"):
        load_model(dst)


def test_weight_errors_name_the_tensor(tiny_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    src = tiny_checkpoints["alternating"]
    tensors = load_file(str(src / "model.safetensors"))
    cases = {
        "missing": (
            {k: v for k, v in tensors.items() if k != "model.layers.1.self_attn.k_proj.weight"},
            "k_proj",
        ),
        "shape": ({**tensors, "model.norm.weight": torch.zeros(3)}, "model.safetensors: tensor norm.weight"),
        "unknown": ({**tensors, "model.layers.9.mlp.up_proj.weight": torch.zeros(1)}, "layers.9.mlp.up_proj"),
    }
    for name, (content, needle) in cases.items():
        d = tmp_path / name
        d.mkdir()
        shutil.copy(src / "config.json", d / "config.json")
        save_file(content, str(d / "model.safetensors"))
        with pytest.raises(CheckpointError, match=needle.replace(".", r"\.")):
            load_model(d)
    empty = tmp_path / "empty"
    empty.mkdir()
    shutil.copy(src / "config.json", empty / "config.json")
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_model(empty)


def test_tied_embeddings_share_one_matrix(tiny_checkpoints: dict[str, Path]) -> None:
    model, cfg = load_model(tiny_checkpoints["attn_first"])
    assert cfg.tie_word_embeddings and model.lm_head.weight is model.embed_tokens.weight


CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_tokenizer_roundtrip_and_chat_template_match_transformers(tmp_path: Path) -> None:
    from tokenizers import Tokenizer as HFTok
    from tokenizers import models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = HFTok(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    from tokenizers import decoders

    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<|im_start|>", "<|im_end|>"])
    tok.train_from_iterator(
        ["def foo(x):\n    return x + 1\n", "hello world, the model decodes"] * 20, trainer
    )
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "chat_template": CHATML})
    )
    ours = Tokenizer(tmp_path)
    ids = ours.encode("def foo(x): hello")
    assert ours.decode(ids) == "def foo(x): hello"
    assert ours.eos_token_ids == [tok.token_to_id("<|im_end|>")]
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    ref = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    ref.chat_template = CHATML
    for gen in (True, False):
        assert ours.apply_chat_template(msgs, add_generation_prompt=gen) == ref.apply_chat_template(
            msgs, add_generation_prompt=gen, tokenize=False
        )


def test_engine_dtype_default_is_float32_on_cpu() -> None:
    """The built-in checkpoint is bf16; on CPU the engine loads it in fp32 unless a dtype is asked for."""
    from lumotree.serving.engine import Engine, EngineConfig
    from lumotree.serving.loader import device_dtype

    assert device_dtype(None, "cpu") == "float32" and device_dtype(None, torch.device("cuda")) is None
    assert device_dtype("bfloat16", "cpu") == "bfloat16" and device_dtype("float16", "cuda") == "float16"
    for dtype, want in ((None, torch.float32), ("bfloat16", torch.bfloat16)):
        cfg = EngineConfig(model="tiny", device="cpu", dtype=dtype, max_seqs=1, max_model_len=64)
        engine = Engine.from_config(cfg)
        assert engine.model.dtype == want and engine.caches.dtype == want


def test_loaded_projections_are_fused_views_and_match_separate_gemms(
    tiny_checkpoints: dict[str, Path],
) -> None:
    """Loading fills one weight block per projection group (checkpoint names kept as views); the fused GEMM
    gives the separate projections' results, and replacing a weight (``.to``) falls back to them."""
    from lumotree.serving.cache import CacheConfig, StateCaches

    path = tiny_checkpoints["gdn3_attn1"]
    model, cfg = load_model(path)
    ref = load_file(str(path / "model.safetensors"))
    fused = [m.fused for m in model.modules() if getattr(m, "fused", None) is not None]
    assert len(fused) == 2 * (len(cfg.layer_types) + cfg.mtp_num_hidden_layers) and all(
        f.intact() for f in fused
    )
    gdn = next(m for m in model.modules() if type(m).__name__ == "GatedDeltaNet")
    assert gdn.in_proj_z.weight.data_ptr() == gdn.fused.weight[gdn.in_proj_qkv.out_features].data_ptr()
    assert any(torch.equal(gdn.in_proj_z.weight, t) for k, t in ref.items() if k.endswith("in_proj_z.weight"))

    def logits() -> torch.Tensor:
        caches = StateCaches(cfg, CacheConfig(max_seqs=2, num_blocks=8, block_size=16))
        caches.allocate(0, 5)
        caches.allocate(1, 2)
        batch = caches.make_batch("prefill", [0, 1], [[1, 2, 3, 4, 5], [6, 7]], [0, 0])
        return model.compute_logits(model(batch, caches))

    got = logits()
    for f in fused:  # un-fuse: every layer gets its own copy of its rows
        for la in f.layers:
            la.weight = torch.nn.Parameter(la.weight.detach().clone(), requires_grad=False)
    assert not any(f.intact() for f in fused)
    torch.testing.assert_close(got, logits(), rtol=1e-5, atol=1e-5)

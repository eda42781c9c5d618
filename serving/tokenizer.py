"""``Tokenizer``: tokenizer.json through ``tokenizers``, the chat template through jinja2."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class TokenizerError(ValueError):
    """A tokenizer file that cannot be used; the message names the file and the field."""


def _token_text(value: Any) -> str | None:
    """tokenizer_config special tokens are strings or AddedToken dicts ({"content": ...})."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class Tokenizer:
    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        root = Path(path)
        file = root / "tokenizer.json"
        if not file.is_file():
            raise TokenizerError(f"{file}: tokenizer.json not found")
        try:
            self._tok = HFTokenizer.from_file(str(file))
        except Exception as e:  # tokenizers raises plain Exceptions
            raise TokenizerError(f"{file}: not a valid tokenizers file ({e})") from None
        cfg_file = root / "tokenizer_config.json"
        self.config: dict[str, Any] = {}
        if cfg_file.is_file():
            try:
                self.config = json.loads(cfg_file.read_text())
            except json.JSONDecodeError as e:
                raise TokenizerError(f"{cfg_file}: not valid JSON ({e})") from None
        self.chat_template = self._load_template(root, cfg_file)
        self.eos_token = _token_text(self.config.get("eos_token"))
        self.bos_token = _token_text(self.config.get("bos_token"))
        self.pad_token = _token_text(self.config.get("pad_token"))
        self.eos_token_ids = self._eos_ids(root)
        """Every id that ends generation (tokenizer_config's eos_token plus generation_config/config ids)."""

    def _load_template(self, root: Path, cfg_file: Path) -> str | None:
        tpl = self.config.get("chat_template")
        if isinstance(tpl, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
            tpl = named.get("default") or next(iter(named.values()), None)
        if tpl is None and (root / "chat_template.jinja").is_file():
            tpl = (root / "chat_template.jinja").read_text()
        if tpl is not None and not isinstance(tpl, str):
            raise TokenizerError(
                f"{cfg_file}: field 'chat_template' must be a string or a list of named templates"
            )
        return tpl

    def _eos_ids(self, root: Path) -> list[int]:
        ids: list[int] = []
        if self.eos_token is not None:
            tid = self._tok.token_to_id(self.eos_token)
            if tid is not None:
                ids.append(tid)
        for name in ("generation_config.json", "config.json"):
            f = root / name
            if f.is_file():
                try:
                    raw = json.loads(f.read_text())
                except json.JSONDecodeError:
                    continue
                eos = raw.get("eos_token_id", (raw.get("text_config") or {}).get("eos_token_id"))
                for e in eos if isinstance(eos, list) else [eos]:
                    if isinstance(e, int) and e not in ids:
                        ids.append(e)
        return ids

    @classmethod
    def from_pretrained(cls, path: str | Path) -> Tokenizer:
        return cls(path)

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        """Render the chat template (jinja2 sandbox, trim/lstrip blocks as transformers does)."""
        if self.chat_template is None:
            raise TokenizerError("tokenizer_config.json: no 'chat_template' (and no chat_template.jinja)")
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, **kw: Any) -> str:
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, **kw)

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        template = env.from_string(self.chat_template)
        return template.render(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            tools=list(tools) if tools is not None else None,
            eos_token=self.eos_token,
            bos_token=self.bos_token,
            pad_token=self.pad_token,
            **kwargs,
        )

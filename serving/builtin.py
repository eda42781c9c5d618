"""``--model tiny|PATH``: built-in checkpoints ship inside the package; anything else is a directory."""

from __future__ import annotations

from pathlib import Path

BUILTIN = {"tiny": Path(__file__).resolve().parent / "builtin" / "lumo-tiny"}


def resolve_model(name_or_path: str | Path) -> Path:
    """The checkpoint directory for a built-in name or a path; errors say what is missing."""
    key = str(name_or_path)
    if key in BUILTIN:
        path = BUILTIN[key]
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"the built-in model {key!r} is not in this build (expected {path}/config.json); "
                "pass --model PATH to a Hugging Face-format checkpoint directory"
            )
        return path
    path = Path(key).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"model {key!r}: no such directory (built-in names: {', '.join(BUILTIN)})")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"model directory {path} has no config.json")
    return path


def model_name(name_or_path: str | Path) -> str:
    """The name the server reports in /v1/models: the built-in name or the directory's name."""
    key = str(name_or_path)
    return f"lumo-{key}" if key in BUILTIN else Path(key).expanduser().resolve().name

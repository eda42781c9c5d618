"""The ``lumotree`` command line: one Typer app; each module in ``platform/commands`` adds its commands."""

from __future__ import annotations

import importlib
import pkgutil

import typer

from lumotree.platform import commands

app = typer.Typer(no_args_is_help=True, add_completion=False, help="LumoTree: serving arms and agent sweeps.")

for _info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
    importlib.import_module(f"{commands.__name__}.{_info.name}").register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()

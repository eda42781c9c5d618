"""``lumotree bench <name>``: each module in ``platform/benches`` adds one benchmark command."""

from __future__ import annotations

import importlib
import pkgutil

import typer

from lumotree.platform import benches


def register(app: typer.Typer) -> None:
    bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks that print numbers and write JSON.")
    for info in sorted(pkgutil.iter_modules(benches.__path__), key=lambda m: m.name):
        importlib.import_module(f"{benches.__name__}.{info.name}").register(bench_app)
    app.add_typer(bench_app, name="bench")

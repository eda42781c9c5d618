"""Benchmark commands: each module exposes ``register(bench_app)``; heavy imports stay inside commands."""

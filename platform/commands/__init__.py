"""CLI command modules: each exposes ``register(app)`` and imports its heavy dependencies lazily."""

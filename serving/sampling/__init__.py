"""Sampling: parameters, native transforms, the counter-based random stream, the target-only walk."""

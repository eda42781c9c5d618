"""Drafters: sources of speculative tokens (MTP layer, EAGLE head, suffix matches)."""

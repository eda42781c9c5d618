"""Numerical audits: the GDN tree scan, full-model continuation and the sampler walk, each with faults."""

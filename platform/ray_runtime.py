"""Connecting to Ray: an existing cluster by address, or a small local instance started for one command."""

from __future__ import annotations

import logging
import os

LOCAL_OBJECT_STORE_BYTES = 100 * 1024 * 1024
"""Arms exchange only chat messages and counters, so a small object store is plenty."""


def init_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """``ray.init`` once per process: ``address`` (or ``$RAY_ADDRESS``) joins a cluster; else a local Ray
    with at most 2 CPUs, a 100 MiB object store and no dashboard."""
    import ray

    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
        return
    ray.init(
        num_cpus=num_cpus or min(2, os.cpu_count() or 1),
        object_store_memory=LOCAL_OBJECT_STORE_BYTES,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,
    )

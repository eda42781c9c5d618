"""Configuration of the synthesized Astropy suite."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from lumotree.tasks.rootfs import BaseSpec

REQUIREMENTS = Path(__file__).with_name("requirements.txt")


@dataclass(frozen=True)
class SynthConfig:
    """Everything that defines the generated instances (all of it is part of their cache key)."""

    seed: int = 0  # drives the order of candidate modules and mutation sites
    count: int = 40  # instances to generate
    base: BaseSpec = BaseSpec(release="bookworm")  # Debian base (Python 3.11)
    requirements: str = field(
        default_factory=lambda: REQUIREMENTS.read_text()
    )  # pinned venv (astropy + tests)
    # Subpackages whose modules are paired with their test modules (``x.py`` <-> ``tests/test_x.py``).
    subpackages: tuple[str, ...] = (
        "utils",
        "units",
        "stats",
        "nddata",
        "time",
        "modeling",
        "convolution",
        "table",
    )
    mutants_per_module: int = 8  # mutation sites tried per source module
    max_per_module: int = 3  # instances kept per source module (diversity)
    max_fail_to_pass: int = 25  # a mutant breaking more tests than this is too blunt to be a task
    max_test_seconds: float = 40.0  # test modules slower than this (clean run) are skipped
    test_timeout: float = 180.0  # seconds allowed for one test-module run
    max_source_bytes: int = 120_000  # skip huge source modules (slow to parse, many blunt mutants)

    def __post_init__(self) -> None:
        assert self.count > 0 and self.mutants_per_module > 0 and self.max_per_module > 0
        assert "astropy==" in self.requirements, "the requirements must pin astropy"

    @property
    def astropy_version(self) -> str:
        return self.requirements.split("astropy==", 1)[1].split()[0]

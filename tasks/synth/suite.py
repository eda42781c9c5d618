"""The ``astropy-synth`` suite: generated instances, cached by content hash, in offline-built images."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from lumotree.tasks.api import Instance, load_instances, write_instances
from lumotree.tasks.rootfs import cache_dir, content_hash
from lumotree.tasks.synth.config import SynthConfig
from lumotree.tasks.synth.testbed import TEST_COMMAND, build_instance_image, build_testbed, testbed_spec

GENERATOR_VERSION = 1  # bump when generation would give different instances for the same config
PACKAGED = Path(__file__).with_name("data")  # instances generated for the default config ship here


def dataset_key(config: SynthConfig) -> str:
    """Content hash of everything the generated instances depend on."""
    fields = {k: v for k, v in vars(config).items() if k not in ("count", "base")}
    return content_hash(testbed_spec(config).tag(), fields, config.count, GENERATOR_VERSION)


class AstropySynthSuite:
    """Synthesized Astropy bugs; see :mod:`lumotree.tasks.synth.generate`."""

    name = "astropy-synth"

    def __init__(
        self,
        seed: int = 0,
        count: int | None = None,
        dataset: str | Path | None = None,
        config: SynthConfig | None = None,
        log: Callable[[str], Any] | None = None,
    ) -> None:
        config = config or SynthConfig()
        if seed != config.seed or (count is not None and count != config.count):
            config = replace(config, seed=seed, count=count or config.count)
        self.config = config
        self.dataset = Path(dataset) if dataset else None
        self.log = log
        self._testbed: str | None = None
        self._instances: list[Instance] | None = None

    # --- images

    def testbed(self) -> str:
        if self._testbed is None:
            self._testbed = build_testbed(self.config, log=self.log)
        return self._testbed

    def image_for(self, instance: Instance, build: bool = True) -> str:
        testbed = self.testbed() if build else testbed_spec(self.config).tag()
        return build_instance_image(testbed, instance, build=build, log=self.log)

    def test_command(self, instance: Instance) -> str:
        return f"{TEST_COMMAND} " + " ".join(shlex.quote(f) for f in instance.test_files())

    # --- instances

    def cache_path(self) -> Path:
        return cache_dir() / "synth" / f"instances-{dataset_key(self.config)}.jsonl"

    def packaged_path(self) -> Path:
        return PACKAGED / f"astropy-synth-{dataset_key(self.config)}.jsonl"

    def instances(self, limit: int | None = None) -> list[Instance]:
        if self._instances is None:
            self._instances = self._load()
        return self._instances[:limit] if limit is not None else list(self._instances)

    def _load(self) -> list[Instance]:
        if self.dataset is not None:
            return load_instances(self.dataset)
        for path in (self.cache_path(), self.packaged_path()):
            if path.is_file():
                return load_instances(path)
        from lumotree.tasks.synth.generate import generate

        instances = generate(self.config, self.testbed(), log=self.log)
        path = self.cache_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        write_instances(instances, tmp)
        tmp.replace(path)
        return instances

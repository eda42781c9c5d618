"""``SwebenchSuite``: the tasks ``Suite`` over SWE-bench astropy instances with offline-rebuilt images."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from lumotree.tasks.api import Instance
from lumotree.tasks.swebench.config import SwebenchConfig, default_dataset
from lumotree.tasks.swebench.dataset import load_swebench
from lumotree.tasks.swebench.resolve import Resolution, ResolveError, recorded, resolve
from lumotree.tasks.swebench.specs import test_command


class SwebenchSuite:
    """SWE-bench instances of one repository; ``image_for`` finds (or rebuilds and validates) their images."""

    name = "swebench-astropy"

    def __init__(
        self, dataset: str | None = None, config: SwebenchConfig | None = None, log: Any = None
    ) -> None:
        config = config or SwebenchConfig()
        if dataset is not None:
            config = replace(config, dataset=str(dataset))
        elif config.dataset is None and default_dataset() is not None:
            config = replace(config, dataset=str(default_dataset()))
        self.config = config
        self.log = log
        self._instances: list[Instance] | None = None

    def instances(self, limit: int | None = None) -> list[Instance]:
        if self._instances is None:
            self._instances = load_swebench(self.config)
        return self._instances[:limit] if limit is not None else list(self._instances)

    def resolution(self, instance: Instance, build: bool = True) -> Resolution:
        """How the instance's environment was found (release, patch direction, image, candidates tried)."""
        if not build:
            done = recorded(self.config, instance)
            if done is None:
                raise ResolveError(f"{instance.instance_id}: no environment built yet (run with build)")
            return done
        return resolve(instance, self.config, log=self.log)

    def image_for(self, instance: Instance, build: bool = True) -> str:
        return self.resolution(instance, build=build).image

    def test_command(self, instance: Instance) -> str:
        return test_command(instance)

"""The synthesized Astropy suite ``astropy-synth``: procedurally injected bugs in astropy's own code."""

from __future__ import annotations

from typing import Any

from lumotree.tasks.api import Suite, register_suite


def _factory(**options: Any) -> Suite:
    from lumotree.tasks.synth.suite import AstropySynthSuite

    return AstropySynthSuite(**options)


register_suite("astropy-synth", _factory)

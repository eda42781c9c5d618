"""The ``swebench-astropy`` suite: real SWE-bench astropy instances, their environments rebuilt offline.

Nothing heavy is imported here; the registry calls the factory only when the suite is asked for.
"""

from __future__ import annotations

from typing import Any

from lumotree.tasks.api import Suite, register_suite


def _factory(dataset: str | None = None, log: Any = None) -> Suite:
    from lumotree.tasks.swebench.suite import SwebenchSuite

    return SwebenchSuite(dataset=dataset, log=log)


register_suite("swebench-astropy", _factory)

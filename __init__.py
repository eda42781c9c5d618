"""LumoTree: an agent-evaluation platform with embedded speculative serving arms.

The repository root is the ``lumotree`` package; its subpackages are the design card's top-level
folders (``lumotree.platform`` is ``platform/``), so nothing here ever shadows the standard library.
"""

__version__ = "0.1.0"

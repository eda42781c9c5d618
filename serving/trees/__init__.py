"""Built-in draft-tree shapes (JSON path lists) shipped with the package."""

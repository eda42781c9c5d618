"""``python -m lumotree.serving.train all --out DIR --device cuda --minutes 6``: the fallback entry point."""

import sys

from lumotree.serving.train.cli import main

sys.exit(main())

"""``python -m idempotent.compare ARGS``: the same as ``idempotent compare ARGS``."""

import sys

from ..cli import main

sys.exit(main(["compare", *sys.argv[1:]]))

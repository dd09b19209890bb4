"""``python -m idempotent.compare``: the ``idempotent compare`` command."""

import sys

from .cli import main

sys.exit(main())

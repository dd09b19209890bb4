"""``python -m idempotent.spark URL KEY IDLE_SECONDS``: the per-URL broker server host that
:func:`idempotent.spark._host.ensure_host` starts (not meant to be run by hand)."""

import sys

from ._host import main

sys.exit(main(sys.argv[1:]))

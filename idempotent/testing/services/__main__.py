"""``python -m idempotent.testing.services``: the services command line (``idempotent services``)."""

import sys

from idempotent.testing.services import main

sys.exit(main())

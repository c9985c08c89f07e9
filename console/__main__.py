"""``python -m console`` is the ``rankdeck`` command."""

import sys

from .verbs.cli import main

sys.exit(main())

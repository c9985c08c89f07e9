"""``python -m console`` is the ``rankdeck`` command."""

import sys

from .cli import main

sys.exit(main())

"""``python -m verify.cli``: the same as the ``dash-verify`` command."""

import sys

from verify.cli import main

sys.exit(main())

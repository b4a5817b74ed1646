"""``python -m kinegen.cli``: the same as the ``kinegen`` command."""

import sys

from . import main

sys.exit(main())

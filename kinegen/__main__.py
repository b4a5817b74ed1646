"""``python -m kinegen`` (and ``torchrun ... -m kinegen``): the same as the ``kinegen`` command."""

import sys

from .cli import main

sys.exit(main())

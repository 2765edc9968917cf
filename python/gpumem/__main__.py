"""``python -m gpumem ARGS...`` runs the gpumem command-line program (see ``gpumem --help``)."""

import sys

from ._cli import main

sys.exit(main())

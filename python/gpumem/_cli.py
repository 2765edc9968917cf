"""The ``gpumem`` console script and ``python -m gpumem``: runs the command-line program shipped in
the package (report, diff, replay, view) with the given arguments."""

from __future__ import annotations

import os
import sys
from typing import Optional, Sequence

from ._paths import cli_environment, cli_path


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Replaces this process with ``gpumem ARGS...`` (never returns unless the program is missing)."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        program = cli_path()
    except FileNotFoundError as e:
        print(e, file=sys.stderr)
        return 1
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(program, [program, *args], cli_environment())
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())

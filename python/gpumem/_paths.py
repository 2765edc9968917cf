"""Where the package's binaries are, and how to run them."""

from __future__ import annotations

import os
from pathlib import Path

_HERE = Path(__file__).resolve().parent


def _shipped(variable: str, relative: str, what: str) -> str:
    """The file the package ships at ``relative``, or the one the environment variable names."""
    override = os.environ.get(variable)
    path = Path(override) if override else _HERE / relative
    if not path.is_file():
        raise FileNotFoundError(
            f"gpumem: {path} is missing; reinstall the package (pip install --no-build-isolation .) "
            f"or point {variable} at a built {what}"
        )
    return str(path)


def library_path() -> str:
    """Path of ``libgpumem_torch.so``, the torch adapter this package loads.

    ``GPUMEM_LIBRARY`` overrides it (a library from a build tree, for development).
    """
    return _shipped("GPUMEM_LIBRARY", "lib/libgpumem_torch.so", "libgpumem_torch.so")


def cli_path() -> str:
    """Path of the ``gpumem`` command-line program shipped in the package.

    ``GPUMEM_CLI`` overrides it (a program from a build tree, for development).
    """
    return _shipped("GPUMEM_CLI", "bin/gpumem", "gpumem program")


def bundled_lib_dir() -> str:
    """The directory of the shared libraries the binaries need beyond torch (libfmt, ncurses)."""
    return str(_HERE / "lib")


def cli_environment() -> dict[str, str]:
    """The environment the command-line program runs in: the bundled libraries first."""
    env = dict(os.environ)
    lib = bundled_lib_dir()
    env["LD_LIBRARY_PATH"] = lib + (os.pathsep + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    return env

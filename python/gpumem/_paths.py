"""Where the package's binaries are, and how to run them."""

from __future__ import annotations

import os
from pathlib import Path

_HERE = Path(__file__).resolve().parent


def library_path() -> str:
    """Path of ``libgpumem_torch.so``, the torch adapter this package loads.

    ``GPUMEM_LIBRARY`` overrides it (a library from a build tree, for development).
    """
    override = os.environ.get("GPUMEM_LIBRARY")
    path = Path(override) if override else _HERE / "lib" / "libgpumem_torch.so"
    if not path.is_file():
        raise FileNotFoundError(
            f"gpumem: {path} is missing; reinstall the package (pip install --no-build-isolation .) "
            "or point GPUMEM_LIBRARY at a built libgpumem_torch.so"
        )
    return str(path)


def cli_path() -> str:
    """Path of the ``gpumem`` command-line program shipped in the package.

    ``GPUMEM_CLI`` overrides it (a program from a build tree, for development).
    """
    override = os.environ.get("GPUMEM_CLI")
    path = Path(override) if override else _HERE / "bin" / "gpumem"
    if not path.is_file():
        raise FileNotFoundError(
            f"gpumem: {path} is missing; reinstall the package (pip install --no-build-isolation .) "
            "or point GPUMEM_CLI at a built gpumem program"
        )
    return str(path)


def bundled_lib_dir() -> str:
    """The directory of the shared libraries the binaries need beyond torch (libfmt, ncurses)."""
    return str(_HERE / "lib")


def cli_environment() -> dict[str, str]:
    """The environment the command-line program runs in: the bundled libraries first."""
    env = dict(os.environ)
    lib = bundled_lib_dir()
    env["LD_LIBRARY_PATH"] = lib + (os.pathsep + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    return env

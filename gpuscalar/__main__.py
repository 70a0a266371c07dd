"""Command line: ``gpuscalar demo | profile | bench`` (also ``python -m gpuscalar``).

Why this module exists: one entry point for the console script; each subcommand lives in the
module that owns the feature and exposes ``main(argv) -> int``.
"""

from __future__ import annotations

import importlib
import os
import sys

SUBCOMMANDS = {
    "demo": ("gpuscalar.tools.demo",
             "one training loop three ways (float, gpuscalar, captured): syncs, launches, time"),
    "profile": ("gpuscalar.profile", "run a script and report every sync by call site"),
    "bench": ("gpuscalar.tools.benchmarks",
              "the workload benchmarks, three paths each, in one table"),
}


def _usage() -> str:
    lines = ["usage: gpuscalar [--version] {" + ",".join(SUBCOMMANDS) + "} [ARGS...]", ""]
    lines += [f"  {name:<8} {doc}" for name, (_, doc) in SUBCOMMANDS.items()]
    lines += ["", "'gpuscalar COMMAND --help' describes one command."]
    return "\n".join(lines)


def stdout_closed_by_reader() -> None:
    """The reader of stdout has gone (``gpuscalar ... | head``): what Python's documentation
    advises for EPIPE. Standard output is pointed at the null device, so the flush at exit
    cannot fail again with a second traceback; the caller then exits with status 1. Where
    stdout is no file descriptor (captured in a test), nothing is redirected."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def main(argv: list[str] | None = None) -> int:
    """Run ``gpuscalar COMMAND ARGS...``; its exit status. A reader that closes the output
    early (``| head``) ends the command quietly with status 1 (no BrokenPipeError traceback)."""
    try:
        status = _main(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        stdout_closed_by_reader()
        return 1
    return status


def _main(argv: list[str] | None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    if args[0] == "--version":
        from . import __version__

        print(f"gpuscalar {__version__}")
        return 0
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"gpuscalar: unknown command {name!r}\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())

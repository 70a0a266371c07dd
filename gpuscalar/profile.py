"""``gpuscalar profile SCRIPT [ARGS...]``: run a script and report every sync by call site.

Why this module exists: the syncs that slow a GPU program down are invisible in its source, and
a sync count is only useful if it says *where*. This command runs an unmodified script as
``__main__`` (the way ``python -m cProfile`` does) inside `count_syncs`, then prints the table
of syncs by ``file:line`` to stderr — also when the script fails. ``--fail-over N`` turns it into
a CI check, ``--guard error`` stops at the first sync, ``--json`` keeps the data.

CuPy's own syncs (``ndarray.get``, ``asnumpy``, mask indexing, ...) are counted too when CuPy is
installed and a CUDA device is present; otherwise only gpuscalar's reads are.
"""

from __future__ import annotations

import argparse
import builtins
import importlib.util
import json
import os
import sys
import traceback
import types
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from . import sync

__all__ = ["main", "build_parser"]

PROG = "gpuscalar profile"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; everything after SCRIPT is passed to the script untouched."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Run SCRIPT as __main__ and report every device->host sync by call site "
        "(on stderr, when the script ends).",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON to FILE")
    parser.add_argument(
        "--fail-over",
        metavar="N",
        type=_non_negative_int,
        help="exit with status 1 if the script makes more than N syncs (for CI)",
    )
    parser.add_argument(
        "--guard",
        choices=sync._MODES,
        help="run the script under sync_guard(MODE); 'error' stops at the first sync",
    )
    parser.add_argument("script", metavar="SCRIPT", nargs="?", help="the Python file to run")
    parser.add_argument(
        "args", metavar="ARGS", nargs=argparse.REMAINDER, help="arguments for the script"
    )
    return parser


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _error(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def _cupy_countable() -> bool:
    """CuPy's own syncs are counted when CuPy is installed and sees a CUDA device."""
    if importlib.util.find_spec("cupy") is None:
        return False
    from .backend import gpu_available  # noqa: PLC0415 - imports CuPy; only needed here

    return gpu_available()


@contextmanager
def _as_main(script: str, args: list[str]) -> Iterator[dict[str, Any]]:
    """Make ``script`` the program: sys.argv, sys.path[0] and a fresh ``__main__`` module.

    Everything is restored afterwards, so `main` can run in-process (tests, notebooks).
    """
    module = types.ModuleType("__main__")
    module.__dict__.update(
        {"__file__": script, "__builtins__": builtins, "__package__": None, "__cached__": None}
    )
    saved_argv, saved_path = sys.argv, list(sys.path)
    saved_main = sys.modules.get("__main__")
    sys.argv = [script, *args]
    script_dir = os.path.dirname(os.path.abspath(script))
    if sys.path:
        sys.path[0] = script_dir
    else:
        sys.path.append(script_dir)
    sys.modules["__main__"] = module
    try:
        yield module.__dict__
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
        if saved_main is not None:
            sys.modules["__main__"] = saved_main


def _exit_status(code: object) -> int:
    """The process status Python gives ``SystemExit(code)``: None is 0; a message is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _run(code: types.CodeType, namespace: dict[str, Any]) -> int:
    """Execute the compiled script; its exit status (traceback printed on an exception)."""
    try:
        exec(code, namespace)
    except SystemExit as exit_:
        return _exit_status(exit_.code)
    except BaseException as exc:  # noqa: BLE001 - the script's failure is reported, not ours
        tb = exc.__traceback__
        # Drop this frame, so the traceback starts in the user's script, as `python` shows it.
        traceback.print_exception(type(exc), exc, tb.tb_next if tb is not None else None)
        return 1
    return 0


def main(argv: list[str]) -> int:
    """Run ``gpuscalar profile [--json FILE] [--fail-over N] [--guard MODE] SCRIPT [ARGS...]``.

    Returns the exit status: the script's own (0, its ``sys.exit`` code, or 1 when it raised),
    1 when ``--fail-over N`` is exceeded, 2 for a usage error, a missing script or a script
    that does not compile.
    """
    parser = build_parser()
    try:
        options = parser.parse_args(list(argv))
    except SystemExit as exit_:  # argparse printed usage or help
        return _exit_status(exit_.code)
    if options.script is None:
        parser.print_usage(sys.stderr)
        return _error("no SCRIPT given: name the Python file to run (its arguments follow it)")
    script: str = options.script
    if options.json is not None:
        json_dir = os.path.dirname(os.path.abspath(options.json))
        if not os.path.isdir(json_dir):
            return _error(f"--json {options.json}: directory {json_dir} does not exist")
    try:
        with open(script, "rb") as handle:
            source = handle.read()
    except OSError as exc:
        return _error(f"cannot open script {script!r}: {exc.strerror or exc}")
    try:
        code = compile(source, script, "exec")
    except (SyntaxError, ValueError) as exc:
        detail = exc.msg if isinstance(exc, SyntaxError) else str(exc)
        where = f" (line {exc.lineno})" if isinstance(exc, SyntaxError) and exc.lineno else ""
        return _error(f"cannot compile {script}{where}: {detail}")

    include_cupy = _cupy_countable()
    with ExitStack() as stack:
        counter = stack.enter_context(sync.count_syncs(include_cupy=include_cupy))
        if options.guard is not None:
            stack.enter_context(sync.sync_guard(options.guard))
        namespace = stack.enter_context(_as_main(script, options.args))
        status = _run(code, namespace)

    sys.stdout.flush()
    print(counter.report(), file=sys.stderr)
    if not include_cupy:
        print("  (gpuscalar syncs only: CuPy's own syncs need CuPy and a GPU)", file=sys.stderr)
    if options.json is not None:
        data = counter.to_dict()
        data["script"] = script
        data["exit_status"] = status
        data["include_cupy"] = include_cupy
        try:
            with open(options.json, "w", encoding="utf-8") as handle:
                json.dump(data, handle, indent=2)
                handle.write("\n")
        except OSError as exc:
            return _error(f"cannot write --json {options.json}: {exc.strerror or exc}")
    if options.fail_over is not None and counter.count > options.fail_over:
        print(
            f"{PROG}: {counter.count} syncs, more than --fail-over {options.fail_over}",
            file=sys.stderr,
        )
        return status or 1
    return status

"""``gpuscalar profile [-m MODULE | SCRIPT] [ARGS...]``: run a program, report every sync by site.

Why this module exists: the syncs that slow a GPU program down are invisible in its source, and
a sync count is only useful if it says *where*. This command runs an unmodified script as
``__main__`` (the way ``python -m cProfile`` does), or a module as ``python -m`` would, inside
``count_syncs(include_cupy=True, all_threads=True)``, then prints the table of syncs by
``file:line`` to stderr — also when the program fails. ``--fail-over N`` turns it into a CI
check, ``--guard error`` stops at the first sync, ``--json`` keeps the data.

Every sync is counted: gpuscalar's reads, and the array library's own — CuPy's (``x.get()``,
``asnumpy``, mask indexing, ...; hooked when CuPy is imported, with or without a GPU) and the
strict device's (`gpuscalar.strict`, no CuPy needed) — in every thread of the program, each at
the program's own line. A reader that closes the output early (``| head``) ends the program
quietly, with status 1, as Python's documentation advises.
"""

from __future__ import annotations

import argparse
import builtins
import importlib.util
import json
import os
import runpy
import select
import sys
import traceback
import types
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

from . import sync
from .__main__ import stdout_closed_by_reader

__all__ = ["main", "build_parser"]

PROG = "gpuscalar profile"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; everything after SCRIPT is passed to the script untouched."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        usage=f"{PROG} [-h] [--json FILE] [--fail-over N] [--guard MODE] "
        "(-m MODULE | SCRIPT) [ARGS ...]",
        description="Run SCRIPT as __main__ (or MODULE, as 'python -m MODULE' does) and report "
        "every device->host sync by call site (on stderr, when the program ends).",
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
    parser.add_argument(
        "-m",
        dest="module",
        metavar="MODULE",
        nargs=argparse.REMAINDER,
        help="run library module MODULE as a script, as 'python -m MODULE' does (everything "
        "after it is its arguments)",
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


@contextmanager
def _as_main(argv: list[str], path0: str, main: types.ModuleType | None) -> Iterator[None]:
    """Make the program's world: ``sys.argv``, ``sys.path[0]`` and (for a script) a fresh
    ``__main__`` module; runpy makes its own for a module.

    Everything is restored afterwards, so `main` can run in-process (tests, notebooks).
    """
    saved_argv, saved_path = sys.argv, list(sys.path)
    saved_main = sys.modules.get("__main__")
    sys.argv = list(argv)
    if sys.path:
        sys.path[0] = path0
    else:
        sys.path.append(path0)
    if main is not None:
        sys.modules["__main__"] = main
    try:
        yield
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
        if saved_main is not None:
            sys.modules["__main__"] = saved_main


def _script_module(script: str) -> types.ModuleType:
    module = types.ModuleType("__main__")
    module.__dict__.update(
        {"__file__": script, "__builtins__": builtins, "__package__": None, "__cached__": None}
    )
    return module


def _module_file(name: str) -> str:
    """The file ``python -m name`` would run (a package's ``__main__``); ImportError if none."""
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise ImportError(f"No module named {name!r}")
    if spec.submodule_search_locations is not None:  # a package: runs its __main__
        main_spec = importlib.util.find_spec(f"{name}.__main__")
        if main_spec is None:
            raise ImportError(f"No module named '{name}.__main__'; {name!r} is a package and "
                              "cannot be directly executed")
        spec = main_spec
    return spec.origin or name


def _exit_status(code: object) -> int:
    """The process status Python gives ``SystemExit(code)``: None is 0; a message is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


#: Files whose frames lead into the program: left out of its traceback, as `python` shows it.
_LAUNCH_FILES = frozenset(
    {__file__, os.path.abspath(__file__), runpy.__file__, runpy.run_module.__code__.co_filename}
)  # (runpy's code may be frozen: "<frozen runpy>")


def _run(program: Callable[[], object]) -> int:
    """Run the program; its exit status (traceback printed on an exception)."""
    try:
        program()
    except SystemExit as exit_:
        return _exit_status(exit_.code)
    except BaseException as exc:  # noqa: BLE001 - the program's failure is reported, not ours
        if isinstance(exc, BrokenPipeError) and _stdout_reader_gone():
            stdout_closed_by_reader()  # `| head` closed the program's output: a quiet end
            return 1
        _print_traceback(exc)
        return 1
    return 0


def _print_traceback(exc: BaseException) -> None:
    tb = exc.__traceback__
    # Drop our frames (and runpy's), so the traceback starts in the program's own code.
    while tb is not None and tb.tb_frame.f_code.co_filename in _LAUNCH_FILES:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb)


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll sees an error on it), so a
    BrokenPipeError is about the program's output and not, say, one of its sockets."""
    try:
        fd = sys.stdout.fileno()
        poller = select.poll()  # (not on Windows: there the traceback is shown)
        poller.register(fd, select.POLLOUT)
        events = poller.poll(0)
    except (AttributeError, OSError, ValueError):
        return False
    return any(event & select.POLLERR for _, event in events)


def _flush_stdout() -> bool:
    """Flush the program's output; False when its reader has gone (stdout is then silenced)."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        stdout_closed_by_reader()
        return False
    return True


def main(argv: list[str]) -> int:
    """Run ``gpuscalar profile [--json FILE] [--fail-over N] [--guard MODE] (-m MODULE | SCRIPT)
    [ARGS...]``.

    Returns the exit status: the program's own (0, its ``sys.exit`` code, or 1 when it raised or
    its reader closed stdout), 1 when ``--fail-over N`` is exceeded, 2 for a usage error, a
    missing script or module, or a script that does not compile.
    """
    parser = build_parser()
    try:
        options = parser.parse_args(list(argv))
    except SystemExit as exit_:  # argparse printed usage or help
        return _exit_status(exit_.code)
    module: str | None = None
    if options.module is not None:
        if options.script is not None:  # (argparse gives -m everything after it: not reached)
            return _error("give either -m MODULE or SCRIPT, not both")
        if not options.module or not options.module[0] or options.module[0].startswith("-"):
            parser.print_usage(sys.stderr)
            return _error("-m needs a MODULE name (its arguments follow it)")
        module, args = options.module[0], options.module[1:]
    elif options.script is None:
        parser.print_usage(sys.stderr)
        return _error("no SCRIPT given: name the Python file to run (its arguments follow it)")
    else:
        args = options.args
    if options.json is not None:
        json_dir = os.path.dirname(os.path.abspath(options.json))
        if not os.path.isdir(json_dir):
            return _error(f"--json {options.json}: directory {json_dir} does not exist")

    if module is not None:
        # `python -m` puts the current directory first on sys.path; the module is found (its
        # parent packages imported) inside the counted block, as part of the program.
        script, path0, main_module = module, os.getcwd(), None
    else:
        script = str(options.script)
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
        path0, main_module = os.path.dirname(os.path.abspath(script)), _script_module(script)

    with ExitStack() as stack:
        counter = stack.enter_context(sync.count_syncs(include_cupy=True, all_threads=True))
        if options.guard is not None:
            stack.enter_context(sync.sync_guard(options.guard))
        stack.enter_context(_as_main([script, *args], path0, main_module))
        status, missing = 0, None
        if module is None:
            status = _run(lambda: exec(code, main_module.__dict__))
        else:
            try:
                script = _module_file(module)
            except (ImportError, ValueError) as exc:
                missing = exc
            else:
                status = _run(lambda: runpy.run_module(module, run_name="__main__",
                                                       alter_sys=True))
    if missing is not None:  # nothing ran
        return _error(f"cannot find module {module!r}: {missing}")

    if not _flush_stdout():
        status = status or 1
    print(counter.report(), file=sys.stderr)
    if options.json is not None:
        data = counter.to_dict()
        data["script"] = script
        data["module"] = module
        data["exit_status"] = status
        data["include_cupy"] = True  # the array library's own syncs are counted
        data["all_threads"] = True
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

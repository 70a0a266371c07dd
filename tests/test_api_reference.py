"""docs/api.md, the API reference, is generated from the package and must not go stale.

Why: a reference page written by hand drifts from the code. This module writes the page (every
name of ``__all__`` of the public modules, the command line, the pytest plugin and the
environment variables, one line each: the first sentence of the docstring, or of the ``#:``
comment above a constant) and the test fails when the page differs from what it would write (a
name missing, a removed name listed, a line differing from its docstring). Regenerate with
``python -m tests.test_api_reference`` from the repository root.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import inspect
import io
import pkgutil
import re
import sys
import types
from pathlib import Path
from typing import Any

import gpuscalar

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "api.md"
REGENERATE = "python -m tests.test_api_reference"

#: The public modules, each with how the page spells its names (``import gpuscalar as gs``).
MODULES = (("gpuscalar", "gs"), ("gpuscalar.optim", "gs.optim"), ("gpuscalar.ad", "gs.ad"),
           ("gpuscalar.strict", "gs.strict"), ("gpuscalar.linalg", "gs.linalg"),
           ("gpuscalar.distributed", "gs.distributed"))


def first_sentence(text: str) -> str:
    """The first sentence of the first paragraph, on one line."""
    paragraph = " ".join(inspect.cleandoc(text).split("\n\n")[0].split())
    return re.split(r"(?<=[.!?])\s+(?=[A-Z`(])", paragraph, maxsplit=1)[0]


def _assignment_comments() -> dict[tuple[str, str], str]:
    """(module, name) -> the ``#:`` comment above the module-level assignment of ``name``."""
    found: dict[tuple[str, str], str] = {}
    for info in pkgutil.walk_packages(gpuscalar.__path__, "gpuscalar."):
        spec = importlib.util.find_spec(info.name)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            continue
        source = Path(spec.origin).read_text(encoding="utf-8")
        lines = source.splitlines()
        for node in ast.parse(source).body:
            if isinstance(node, ast.Assign):
                targets = [t for target in node.targets
                           for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
            elif isinstance(node, ast.AnnAssign):
                targets = [node.target]
            else:
                continue
            comment: list[str] = []
            at = node.lineno - 2
            while at >= 0 and lines[at].startswith("#:"):
                comment.insert(0, lines[at].removeprefix("#:").strip())
                at -= 1
            for target in targets:
                if isinstance(target, ast.Name) and comment:
                    found[(info.name, target.id)] = " ".join(comment)
    return found


def _documented_value(name: str, value: Any, comments: dict[tuple[str, str], str]) -> str:
    """A constant's line: its ``#:`` comment where the defining module has one, else what it is."""
    for (module_name, assigned), comment in comments.items():
        module = sys.modules.get(module_name) or importlib.import_module(module_name)
        if assigned == name and getattr(module, name, None) is value:
            return first_sentence(comment)
    kind = type(value)
    if kind.__module__.startswith("gpuscalar") and kind.__doc__:
        return f"A `{kind.__name__}`: {first_sentence(kind.__doc__)}"
    return f"``{value!r}``"


def summary(name: str, value: Any, comments: dict[tuple[str, str], str]) -> tuple[str, str]:
    """(kind, one line) for a public name."""
    if inspect.ismodule(value):
        return "module", first_sentence(value.__doc__ or "")
    if inspect.isclass(value):
        return "class", first_sentence(inspect.getdoc(value) or "")
    if inspect.isroutine(value) or (callable(value) and hasattr(value, "__wrapped__")):
        return "function", first_sentence(value.__doc__ or "")  # (a cached one has __wrapped__)
    return "constant", _documented_value(name, value, comments)


def _plugin_option_help() -> list[tuple[str, str]]:
    """The options gpuscalar's pytest plugin adds, with their help, as pytest would list them."""
    from gpuscalar import pytest_plugin

    options: list[tuple[str, str]] = []

    class Group:
        def addoption(self, *names: str, **attrs: Any) -> None:
            options.append((names[0], attrs.get("help", "")))

    pytest_plugin.pytest_addoption(types.SimpleNamespace(  # type: ignore[arg-type]
        getgroup=lambda *args, **kwargs: Group()))
    return options


def reference() -> str:
    """The page, as it should read now."""
    from gpuscalar import __main__ as cli
    from gpuscalar import pytest_plugin, sync
    from gpuscalar.lazy import expr

    comments = _assignment_comments()
    out = [
        "# API reference",
        "",
        "Every public name, one line each: the first sentence of its docstring (of the `#:`",
        "comment above it for a constant). Generated from the package by",
        "`tests/test_api_reference.py`, which fails when this page is stale; after changing a",
        "public name or its docstring, regenerate it from the repository root with",
        f"`{REGENERATE}`. The guides are linked from the [README](../README.md#7-more).",
    ]
    for module_name, spelled in MODULES:
        module = importlib.import_module(module_name)
        heading = f"`{module_name}`" + (" (`import gpuscalar as gs`)" if spelled == "gs" else "")
        out += ["", f"## {heading}", "", first_sentence(module.__doc__ or ""), ""]
        for name in module.__all__:
            kind, line = summary(name, getattr(module, name), comments)
            out.append(f"- `{spelled}.{name}` ({kind}): {line}")
    out += ["", "## Command line", "", first_sentence(cli.__doc__ or ""), ""]
    out += [f"- `gpuscalar {name}`: {doc}" for name, (_, doc) in cli.SUBCOMMANDS.items()]
    out += ["- `gpuscalar --version`: the installed version; `gpuscalar COMMAND --help` "
            "describes one command."]
    counter_doc = first_sentence(inspect.getdoc(pytest_plugin.sync_counter) or "")
    out += ["", "## pytest plugin", "", first_sentence(pytest_plugin.__doc__ or ""), ""]
    out += [f"- fixture `sync_counter`: {counter_doc}",
            f"- marker `@pytest.mark.{pytest_plugin.MARKER_HELP.split(':')[0]}`: "
            f"{pytest_plugin.MARKER_HELP.split(':', 1)[1].strip()}"]
    out += [f"- option `{name}`: {help_text}" for name, help_text in _plugin_option_help()]
    out += ["", "## Environment variables", ""]
    for module, constant in ((sync, "GUARD_ENV_VAR"), (expr, "LAZY_ENV_VAR")):
        line = first_sentence(comments[(module.__name__, constant)])
        out.append(f"- `{getattr(module, constant)}`: {line}")
    return "\n".join(out) + "\n"


def test_the_api_reference_page_is_current():
    written = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
    wanted = reference()
    old, new = set(written.splitlines()), set(wanted.splitlines())
    differ = [f"page:    {line}" for line in sorted(old - new) if line][:10] + [
        f"package: {line}" for line in sorted(new - old) if line][:10]
    assert written == wanted, (
        f"docs/api.md is stale (regenerate it: {REGENERATE}); lines that differ:\n"
        + "\n".join(differ))


def test_every_public_name_is_on_the_page_once():
    page = PAGE.read_text(encoding="utf-8")
    for module_name, spelled in MODULES:
        for name in importlib.import_module(module_name).__all__:
            assert page.count(f"- `{spelled}.{name}` (") == 1, f"{spelled}.{name}"


def test_a_line_is_the_first_sentence_of_its_docstring():
    """Spot checks of the rules the page follows."""
    import gpuscalar as gs
    from gpuscalar import strict

    comments = _assignment_comments()
    assert summary("sum", gs.sum, comments) == ("function", first_sentence(gs.sum.__doc__))
    assert summary("GPUScalar", gs.GPUScalar, comments)[1].startswith("A 0-d device value")
    assert summary("IMPLICIT_MESSAGE", strict.IMPLICIT_MESSAGE, comments) == (
        "constant", "CuPy's words when something asks for a host array implicitly.")
    assert first_sentence("One thing. Another.\n\nMore.") == "One thing."
    assert first_sentence("Wrapped\n    over lines, ``x.y`` kept.") == (
        "Wrapped over lines, ``x.y`` kept.")


if __name__ == "__main__":
    with contextlib.redirect_stdout(io.StringIO()):
        text = reference()
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)} ({len(text.splitlines())} lines)")

"""What a type checker sees of gpuscalar's public API (issue 16, "types that help users").

Why: the package ships ``py.typed``, so users' mypy/pyright read our annotations; a reduction
revealed as ``Any`` silently switches their checking off for everything computed from it. These
tests run mypy on small snippets of user code and assert what it reveals (``GPUScalar`` for a
device scalar, ``float`` for a host read) and which misuse it reports. Nothing here touches a
device: the snippets are only type-checked, never run.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

import gpuscalar

mypy_api = pytest.importorskip("mypy.api", reason="mypy is not installed (the `test` extra)")

#: The snippets' common head: an array and a device scalar made from it.
_HEAD = """\
import numpy as np
import gpuscalar as gs
x = np.ones(3)
s = gs.sum(x)
"""

#: Expressions whose type must be `GPUScalar`: reductions with their defaults and the values
#: made by GPUScalar's factories (annotated in gpuscalar/reduce.py and scalar.py).
_REDUCTIONS = [
    "gs.sum(x)",
    "gs.mean(x)",
    "gs.prod(x)",
    "gs.min(x)",
    "gs.max(x)",
    "gs.any(x)",
    "gs.var(x, ddof=1)",
    "gs.std(x)",
    "gs.norm(x, ord=1)",
    "gs.logsumexp(x)",
    "gs.count_nonzero(x)",
    "gs.vdot(x, x)",
    "gs.global_norm([x, x])",
    "gs.asscalar(1.0, like=x)",
]

#: GPUScalar's operators, installed from one table at import time, and a math helper: typed by
#: the operator table's annotations (gpuscalar/scalar.py, math.py).
_OPERATORS = [
    "s * 2.0",
    "2.0 * s",
    "gs.sum(x) * 2.0",
    "s + gs.mean(x)",
    "s - 1",
    "1 / s",
    "s ** 2",
    "-s",
    "abs(s)",
    "s > 1.0",
    "gs.sqrt(s)",
]

#: An axis (or kept dimensions) may leave an array or reduce to 0-d: not known statically.
_DEPENDS_ON_SHAPE = ["gs.sum(x, axis=0)", "gs.mean(x, keepdims=True)", "gs.norm(x, axis=0)"]

_REVEALED = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+): note: Revealed type is \"(?P<type>.*)\"$")
_ERROR = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+): error: (?P<message>.*)$")
_GPUSCALAR = re.compile(r"^gpuscalar(\.\w+)*\.GPUScalar$")


def _mypy(directory: Path, source: str) -> tuple[dict[int, str], dict[int, str]]:
    """Type-check ``source`` (after `_HEAD`) with mypy: (revealed type by line, error by line),
    lines numbered within ``source``. Errors inside gpuscalar itself are not reported here
    (``.ci/run`` checks the package); only the snippet's."""
    snippet = directory / "snippet.py"
    snippet.write_text(_HEAD + textwrap.dedent(source))
    config = directory / "mypy.ini"
    lines = ["[mypy]", "follow_imports = silent", "check_untyped_defs = True"]
    root = Path(gpuscalar.__file__).resolve().parents[1]
    if (root / "pyproject.toml").is_file():  # a source checkout (editable install): mypy does
        lines.append(f"mypy_path = {root}")  # not follow setuptools' editable import hooks
    config.write_text("\n".join(lines) + "\n")
    out, err, status = mypy_api.run([
        "--config-file", str(config), "--cache-dir", str(directory / "cache"),
        "--no-error-summary", "--hide-error-context", "--no-pretty", str(snippet),
    ])
    assert status in (0, 1) and not err, f"mypy did not run: {err}{out}"
    offset = _HEAD.count("\n")
    revealed: dict[int, str] = {}
    errors: dict[int, str] = {}
    for line in out.splitlines():
        if match := _REVEALED.match(line):
            # mypy 2 shows builtins unqualified ("float"), earlier versions "builtins.float"
            revealed[int(match["line"]) - offset] = match["type"].replace("builtins.", "")
        elif match := _ERROR.match(line):
            errors.setdefault(int(match["line"]) - offset, match["message"])
        else:
            assert line.startswith(str(snippet)) and ": note:" in line, f"unexpected: {line}"
    return revealed, errors


@pytest.fixture(scope="module")
def reveals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str | None]]:
    """expression -> (revealed type, mypy's error on that line or None), for every expression
    of this module, in one mypy run."""
    expressions = _REDUCTIONS + _OPERATORS + _DEPENDS_ON_SHAPE
    source = "".join(f"reveal_type({e})\n" for e in expressions)
    revealed, errors = _mypy(tmp_path_factory.mktemp("typing"), source)
    assert set(revealed) == set(range(1, len(expressions) + 1)), revealed
    return {e: (revealed[i], errors.get(i)) for i, e in enumerate(expressions, start=1)}


@pytest.mark.parametrize("expression", _REDUCTIONS)
def test_reductions_reveal_gpuscalar(
    reveals: dict[str, tuple[str, str | None]], expression: str
) -> None:
    revealed, error = reveals[expression]
    assert _GPUSCALAR.match(revealed), f"reveal_type({expression}) is {revealed!r}"
    assert error is None


@pytest.mark.parametrize("expression", _OPERATORS)
def test_operators_reveal_gpuscalar(
    reveals: dict[str, tuple[str, str | None]], expression: str
) -> None:
    revealed, error = reveals[expression]
    assert error is None, f"{expression}: {error}"
    assert _GPUSCALAR.match(revealed), f"reveal_type({expression}) is {revealed!r}"


@pytest.mark.parametrize("expression", _DEPENDS_ON_SHAPE)
def test_an_axis_leaves_the_type_open(
    reveals: dict[str, tuple[str, str | None]], expression: str
) -> None:
    # not GPUScalar: claiming it would make mypy wrong about every array result
    assert reveals[expression] == ("Any", None)


def test_host_values_are_asked_for_explicitly(tmp_path: Path) -> None:
    """docs/typing.md: a GPUScalar passed where ``float`` is annotated is reported (the place a
    hidden sync would happen); ``SupportsFloat`` takes it, for code that reads on the host."""
    revealed, errors = _mypy(tmp_path, """\
        from typing import SupportsFloat

        def log_loss(value: float) -> None: ...

        def report(loss: SupportsFloat) -> str:
            return f"loss {float(loss):.4f}"

        log_loss(gs.sum(x))
        log_loss(0.25)
        report(gs.sum(x))
        report(0.25)
        report("0.25")
        reveal_type(float(s))
        """)
    assert revealed == {13: "float"}
    assert sorted(errors) == [8, 12], errors
    assert 'incompatible type "GPUScalar"; expected "float"' in errors[8]
    assert 'incompatible type "str"; expected "SupportsFloat"' in errors[12]


def test_float_or_gpuscalar_parameters(tmp_path: Path) -> None:
    """docs/typing.md's annotations for code that keeps device values on the device: a
    ``float | gs.GPUScalar`` parameter, and a constrained TypeVar returning what it was
    given; both bodies type-check for a float and a GPUScalar, and a string is reported."""
    revealed, errors = _mypy(tmp_path, """\
        from typing import TypeVar

        Number = TypeVar("Number", float, gs.GPUScalar)

        def halve(v: float | gs.GPUScalar) -> float | gs.GPUScalar:
            return v / 2

        def scale(v: Number, k: float) -> Number:
            return v * k

        reveal_type(halve(s))
        reveal_type(scale(s, 0.5))
        reveal_type(scale(1.0, 0.5))
        halve(1.5)
        halve("1.5")
        """)
    assert revealed == {
        11: "float | gpuscalar.scalar.GPUScalar", 12: "gpuscalar.scalar.GPUScalar", 13: "float"
    }
    assert sorted(errors) == [15], errors  # and none in the bodies
    assert 'incompatible type "str"' in errors[15]

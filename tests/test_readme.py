"""The README and the docs/ pages run as written, and show the output they produce.

Why: a newcomer copies the blocks in order. Every fenced ```python block of README.md and
docs/*.md either runs here (the blocks of one page in order, in one namespace, in a temporary
folder, as a newcomer would paste them) or is a sketch: its first line is ``# sketch: ...``
naming what it leaves out, and it must at least compile. Where the text shows a block's output
(a ```text block right after "prints", or "prints `...`" in the sentence after the block), the
printed lines must be exactly those. The shown outputs of commands (`gpuscalar demo`,
`gpuscalar profile`, the pytest plugin) are compared on their machine-independent lines (counts,
answers; not times or the CPU's name). Relative links must lead to existing files and headings.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import gpuscalar as gs
from gpuscalar import strict
from tests.helpers import host

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)
PRINTS_INLINE = re.compile(r"\A\s*prints\s+((?:`[^`]*`(?:,|\s|and)*)+)")
SKETCH = "# sketch:"


@dataclass
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    shown: list[str] | None  # the output the text shows for it, if any
    section: str  # the last "## " heading before it

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """Every fenced block of a page, each python block with the output the text shows."""
    text = page.read_text(encoding="utf-8")
    matches = list(FENCE.finditer(text))
    found = []
    for k, match in enumerate(matches):
        after = text[match.end():matches[k + 1].start() if k + 1 < len(matches) else len(text)]
        after = re.sub(r"<!--.*?-->", "", after, flags=re.S)  # section marks between
        shown = None
        if match.group(1) == "python":
            if after.strip() == "prints" and k + 1 < len(matches):
                shown = matches[k + 1].group(2).splitlines()
            elif inline := PRINTS_INLINE.match(after):
                shown = re.findall(r"`([^`]*)`", inline.group(1))
        headings = re.findall(r"^## (.*)$", text[:match.start()], re.M)
        found.append(Block(page, text.count("\n", 0, match.start()) + 1, match.group(1),
                           match.group(2), shown, headings[-1] if headings else ""))
    return found


def python_blocks(page: Path) -> list[Block]:
    return [b for b in blocks(page) if b.lang == "python"]


def run_block(block: Block, namespace: dict) -> list[str]:
    """Run one block in `namespace`; returns its printed lines (checked against the shown ones)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block.code, block.where, "exec"), namespace)
    printed = out.getvalue().splitlines()
    if block.shown is not None:
        assert printed == block.shown, f"{block.where}: the text shows other output"
    return printed


def run_in_order(page_blocks: list[Block], tmp_path: Path, monkeypatch) -> dict:
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__readme__"}
    for block in page_blocks:
        if block.code.startswith(SKETCH):
            continue
        run_block(block, namespace)
    return namespace


def readme_halves() -> tuple[list[Block], list[Block]]:
    """The README's first half (through "Remove them") and the rest."""
    every = python_blocks(README)
    first = [b for b in every if not re.match(r"[5-9]\.", b.section)]
    return first, every[len(first):]


# ---- every block is runnable or a sketch that says what it leaves out --------------------------


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_python_block_compiles_and_sketches_say_what_they_leave_out(page):
    for block in python_blocks(page):
        compile(block.code, block.where, "exec")
        if block.code.startswith(SKETCH):
            reason = block.code.splitlines()[0].removeprefix(SKETCH).strip()
            assert len(reason.split()) >= 3, f"{block.where}: a sketch names what it leaves out"


def test_the_readme_has_runnable_blocks_with_output_in_both_halves():
    first, second = readme_halves()
    assert len(first) >= 3 and len(second) >= 3
    assert all(not b.code.startswith(SKETCH) for b in first + second)
    assert sum(b.shown is not None for b in first) >= 2
    assert sum(b.shown is not None for b in second) >= 3


# ---- the README as a newcomer reads it -----------------------------------------------------------


def test_the_readme_first_half_runs_in_order_as_a_newcomer_would(tmp_path, monkeypatch):
    """Clone to "I found and removed my script's syncs": every block through "Remove them", in
    order, in one namespace, in an empty folder; each shown output matches."""
    first, _ = readme_halves()
    namespace = run_in_order(first, tmp_path, monkeypatch)
    assert namespace["counter"].count == 1  # the last block: one formatted read (best is known)
    assert "test_step" in namespace  # the plugin's test file


def test_the_readme_second_half_runs_in_order(tmp_path, monkeypatch):
    _, second = readme_halves()
    if not hasattr(gs, "while_loop"):
        pytest.skip("gs.while_loop is not there yet (README's control-flow block)")
    namespace = run_in_order(second, tmp_path, monkeypatch)
    assert namespace["counter"].count == 0  # the last block: a loop decided on the device


def test_the_readme_plugin_test_file_fails_and_reports_as_shown(tmp_path):
    """The pytest-plugin block, saved under the name its first line gives, run by pytest: the
    lines the README shows (not pytest's own banners) come out, in order."""
    block = next(b for b in python_blocks(README) if "max_syncs" in b.code)
    name = block.code.splitlines()[0].removeprefix("# ").strip()
    (tmp_path / name).write_text(block.code, encoding="utf-8")
    shown = next(b for b in blocks(README)
                 if b.lang == "text" and b.code.startswith(f"$ pytest {name}")).code
    # as on a newcomer's terminal: 80 columns, and not CI (where pytest would not shorten lines)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "BUILD_NUMBER")}
    result = subprocess.run([sys.executable, "-m", "pytest", name, "--gpuscalar-report",
                             "-p", "no:cacheprovider"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, env={**env, "COLUMNS": "80"})
    assert result.returncode == 1, result.stdout + result.stderr  # test_step over its budget
    wanted = [line for line in shown.splitlines()[1:] if not line.startswith(("_", "="))]
    got = iter(result.stdout.splitlines())
    for line in wanted:  # each shown line, in this order
        assert any(line == g for g in got), f"not in pytest's output (in order): {line!r}"


def test_the_readme_profile_output_is_what_gpuscalar_profile_prints(monkeypatch, capfd):
    from gpuscalar import profile

    shown = next(b for b in blocks(README) if b.code.startswith("$ gpuscalar profile")).code
    command, *lines = shown.splitlines()
    if gs.gpu_available():  # then CuPy's own syncs are counted too, and the note is not printed
        lines = [line for line in lines if not line.startswith("  (gpuscalar syncs only")]
    monkeypatch.chdir(ROOT)
    status = profile.main(command.split()[3:])
    out, err = capfd.readouterr()
    assert lines[-2:] == ["$ echo $?", str(status)] and status == 1
    assert out.splitlines() + err.splitlines() == lines[:-2]


def test_the_readme_demo_output_has_the_counts_and_answers_gpuscalar_demo_prints(capsys):
    """The demo's rows without the time column, and the weights line: the same on any machine
    (the first line's CPU name and the times vary, as the README says)."""
    from gpuscalar.__main__ import main

    shown = next(b for b in blocks(README) if b.code.startswith("$ gpuscalar demo")).code
    assert main(["demo", "--backend", "numpy", "--repeats", "1"]) == 0
    printed = capsys.readouterr().out

    def rows(text: str) -> list[str]:
        row = r"^  (float|gpuscalar|gpuscalar \+ capture) +(\d+) +(\d+) +[\d.]+ +(.*)$"
        found = re.findall(row, text, re.M)
        return [" ".join(row) for row in found]

    assert len(rows(shown)) == 3 and rows(printed) == rows(shown)
    weights = [line for line in shown.splitlines() if line.startswith("weights:")]
    assert weights and weights[0] in printed.splitlines()


# ---- the capture example: the strict device, and plain SGD by hand ------------------------------


def _capture_block() -> Block:
    text = README.read_text(encoding="utf-8")
    section = text.split("<!-- section: capture -->")[1].split("<!-- /section: capture -->")[0]
    return next(b for b in python_blocks(README) if b.code in section)


def test_the_readme_capture_example_runs_on_the_strict_device_as_on_numpy(tmp_path, monkeypatch):
    """The example with `import cupy as xp` swapped for the CuPy-strict device: what CuPy would
    refuse in a captured step (a host-to-device copy, `@`, an implicit host read) fails here."""
    block = _capture_block()
    xp_line = next(line for line in block.code.splitlines()
                   if line.startswith("import numpy as xp"))
    strict_block = Block(block.page, block.line, block.lang,
                         block.code.replace(xp_line, "from gpuscalar.strict import xp"),
                         block.shown, block.section)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    assert run_block(strict_block, namespace) == block.shown  # the same lines as on NumPy
    assert isinstance(namespace["w"], strict.StrictArray)


def test_the_readme_capture_example_is_plain_sgd_and_converges_at_the_benchmarks_size(
        tmp_path, monkeypatch):
    block = _capture_block()
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    run_block(block, namespace)
    n, d = namespace["n"], namespace["d"]
    assert (n, d) == (1024, 64)
    # the same loop by hand: 2 warm-up steps on the first batch, then 10 steps per new batch
    rng = np.random.default_rng(0)
    w_true = np.linspace(-1, 1, d, dtype=np.float32)
    batches = [rng.standard_normal((n, d), dtype=np.float32) for _ in range(21)]
    w, total, t = np.zeros(d, np.float32), 0.0, 0
    for x in batches[:1] * 2 + [x for x in batches[1:] for _ in range(10)]:
        t += 1
        err = x @ w - x @ w_true
        total += float(np.mean(err * err))
        w = w - np.float32(0.1 * min(1.0, t / 100)) * (x.T @ err) / np.float32(n)
    np.testing.assert_allclose(host(namespace["w"]), w, rtol=1e-4, atol=1e-6)
    assert float(gs.GPUScalar(namespace["total"])) == pytest.approx(total, rel=1e-4)
    assert np.abs(w - w_true).max() < 1e-3  # it converges: the gradient is divided by n


# ---- links --------------------------------------------------------------------------------------


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_lead_to_existing_pages_and_headings(page):
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # an external address
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name}: the link {target} leads nowhere"
        if anchor:
            headings = re.findall(r"^#+ (.*)$", FENCE.sub("", linked.read_text(encoding="utf-8")),
                                  re.M)
            assert anchor in {_slug(h) for h in headings}, f"{page.name}: no heading #{anchor}"


def test_ci_run_says_what_it_does_before_deleting_the_venv():
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    before = script[:script.index("rm -rf .venv")]
    assert re.search(r"^echo .*\.venv", before, re.M)


def test_without_the_cuda_extra_cupy_tests_skip_and_under_ci_they_fail(monkeypatch):
    """Section 1's promise: a test marked ``needs_cupy`` skips where CuPy cannot be imported,
    saying so, and fails under ``CI=true`` (tests/conftest.py)."""
    import types

    from tests import conftest

    item = types.SimpleNamespace(get_closest_marker=lambda name: name == "needs_cupy" or None)
    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` raises ImportError
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="CuPy is not installed"):
        conftest.pytest_runtest_setup(item)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CuPy must be importable in CI"):
        conftest.pytest_runtest_setup(item)
    unmarked = types.SimpleNamespace(get_closest_marker=lambda name: None)
    conftest.pytest_runtest_setup(unmarked)  # nothing else is affected

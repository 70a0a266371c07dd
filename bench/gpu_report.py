"""One command for a GPU machine: run everything that needs a GPU, and write down what it saw.

    python bench/gpu_report.py --out DIR

Why this script exists: a GPU is lent to this project rarely and briefly. In one run (five
minutes on one H100) it records the environment (device, driver, CUDA, CuPy, NumPy, Python,
date), `gpuscalar bench --backend cupy`, fused Adam's bandwidth and the multi-tensor optimizer
table (`bench/gpu_adam.py`), per-op overhead and the idle read latency on CuPy
(`bench/overhead.py`), the demo, the sync table of every workload's gpuscalar path under
``count_syncs(include_cupy=True)`` (each must read only what it states it needs), the captured
training loop against PyTorch's CUDA graph (`bench/gpu_capture.py`, when present), the CG solve
as one loop (`bench/gpu_control.py`), a 0-d NCCL all-reduce eager and captured
(`bench/gpu_nccl.py`) and the whole test suite (its pass/fail/skip counts; ``--tests gpu``: the
GPU's own tests only). It writes ``DIR/report.md`` and ``DIR/report.json``, and each section's
whole output beside them (``DIR/<section>.log``).
Adding a section is one entry in ``SECTIONS``.

Each section runs in a subprocess with its own time limit, under one overall deadline, so a crash
or a hang costs that section only; the measurements run before the (longest) test suite. Nothing
is ever estimated: a section that did not run says so. Without a GPU the script says that no GPU
was found and nothing was measured, writes a report saying so, and exits 0.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
#: The whole report must fit in this many seconds on one GPU.
TOTAL_BUDGET_S = 295.0


@dataclass(frozen=True)
class Section:
    """One thing the report runs: ``argv`` (``{json}`` is replaced by the section's JSON file),
    its time limit, the file that must exist for it to run at all (optional sections), and for
    a tool that writes no JSON, a function that reads its data from its output."""

    name: str
    title: str
    argv: tuple[str, ...]
    budget_s: float
    writes_json: bool = False
    requires: str | None = None
    parse: Callable[[str], Any] | None = None
    #: at the limit, interrupt (SIGINT) before killing: pytest then prints its summary line
    interrupt: bool = False


@dataclass
class SectionResult:
    name: str
    title: str
    status: str  # "ok", "failed", "timeout", "skipped"
    seconds: float
    returncode: int | None
    output_tail: str
    data: Any = None
    reason: str = ""


def _python(*args: str) -> tuple[str, ...]:
    return (sys.executable, *args)


_PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|skipped|xfailed|xpassed|deselected|errors?"
                           r"|warnings?)\b")


def pytest_counts(output: str) -> dict[str, int]:
    """The counts on pytest's final summary line ("2 failed, 1200 passed, 9 skipped in 31.2s"),
    keyed passed/failed/skipped/errors/...; empty when the output has no summary line."""
    for line in reversed(output.splitlines()):
        found = _PYTEST_COUNT.findall(line)
        if found and re.search(r"\bin [\d.]+s", line):
            plural = {"error": "errors", "warning": "warnings"}
            return {plural.get(word, word): int(count) for count, word in found}
    return {}


_THIS = str(Path(__file__).resolve())

#: In running order: the measurements first, then the test suite with all the time left (at
#: least TOTAL_BUDGET_S minus the measurements' budgets, usually much more). The budgets (210 s
#: in all) favour the sections that compile many kernels cold (NVRTC: fused Adam and the
#: optimizer table) and import PyTorch (the capture comparison, seven versions of the loop);
#: the overhead and demo sections run a few thousand small ops.
SECTIONS: tuple[Section, ...] = (
    Section("environment", "Environment",
            _python(_THIS, "--section", "environment", "--json", "{json}"), 10, True),
    Section("syncs", "Sync table of each workload's gpuscalar path (CuPy, include_cupy=True)",
            _python(_THIS, "--section", "syncs", "--json", "{json}"), 12, True),
    Section("bench", "gpuscalar bench --backend cupy",
            _python("-m", "gpuscalar", "bench", "--backend", "cupy", "--json", "{json}"), 35,
            True),
    Section("adam", "Fused Adam bandwidth and the optimizer table (bench/gpu_adam.py)",
            _python("bench/gpu_adam.py", "--json", "{json}"), 50, True),
    Section("overhead", "Per-op overhead on CuPy (bench/overhead.py)",
            _python("bench/overhead.py", "--backend", "cupy", "--number", "2000",
                    "--json", "{json}"), 12, True),
    Section("demo", "The demo (gpuscalar demo --backend cupy)",
            _python("-m", "gpuscalar", "demo", "--backend", "cupy"), 10),
    Section("capture", "Captured training loop vs PyTorch's CUDA graph (bench/gpu_capture.py)",
            _python("bench/gpu_capture.py", "--json", "{json}"), 35, True,
            requires="bench/gpu_capture.py"),
    Section("control", "gs.while_loop: the CG solve vs its per-iteration-sync loop "
            "(bench/gpu_control.py)",
            _python("bench/gpu_control.py", "--json", "{json}"), 11, True,
            requires="bench/gpu_control.py"),
    Section("products", "Vector products, host and device time by route (bench/gpu_products.py)",
            _python("bench/gpu_products.py", "--json", "{json}"), 20, True,
            requires="bench/gpu_products.py"),
    Section("nccl", "0-d all_reduce on one GPU, eager and captured (bench/gpu_nccl.py)",
            _python("bench/gpu_nccl.py", "--json", "{json}"), 15, True,
            requires="bench/gpu_nccl.py"),
    Section("tests", "The whole test suite (python -m pytest -q)",
            _python("-m", "pytest", "-q", "-p", "no:cacheprovider"), float("inf"),
            parse=pytest_counts, interrupt=True),
)


def _without_pytest_benchmark(argv: tuple[str, ...]) -> tuple[str, ...]:
    """A pytest command that runs where pytest-benchmark is not installed (a GPU machine may
    have only the wheels carried to it): the project's ``addopts`` name its flag
    (``--benchmark-disable``), which pytest refuses without the plugin, and bench/'s tests use
    its fixture; so the flag is overridden and bench/ left out (the report says so)."""
    if "pytest" not in argv or importlib.util.find_spec("pytest_benchmark") is not None:
        return argv
    return (*argv, "-o", "addopts=-rfE", "--ignore=bench")


#: What ``--tests gpu`` adds to the test section's pytest command.
GPU_TESTS_ONLY = ("-k", "cupy or cuda or gpu or nccl")


def sections_for(tests: str) -> tuple[Section, ...]:
    """SECTIONS, with the test section narrowed to the GPU's own tests for ``tests == "gpu"``:
    a lent GPU's minutes go to what CI cannot run (xdist's ``-n 12`` and pytest-timeout's
    per-test limit where those plugins are installed, so one hang costs one test)."""
    if tests == "all":
        return SECTIONS
    extra: tuple[str, ...] = GPU_TESTS_ONLY
    if importlib.util.find_spec("xdist") is not None:
        extra += ("-n", "12")  # 16 cores on the lent machines: ~2,000 tests in ~3 min
    if importlib.util.find_spec("pytest_timeout") is not None:
        extra += ("--timeout", "120")
    return tuple(Section(s.name, s.title + " (GPU tests only)", (*s.argv, *extra), s.budget_s,
                         s.writes_json, s.requires, s.parse, s.interrupt)
                 if s.name == "tests" else s for s in SECTIONS)


def run_sections(sections: tuple[Section, ...] | list[Section], out: Path,
                 total_budget_s: float = TOTAL_BUDGET_S) -> list[SectionResult]:
    """Run each section in a subprocess (from the repository root), each limited by its own
    budget and by what is left of ``total_budget_s``; a section with no time left is skipped."""
    deadline = time.monotonic() + total_budget_s
    results = []
    for section in sections:
        if section.requires and not (REPO / section.requires).exists():
            results.append(SectionResult(section.name, section.title, "skipped", 0.0, None, "",
                                         reason=f"{section.requires} does not exist"))
            continue
        left = deadline - time.monotonic()
        if left < 5:
            results.append(SectionResult(section.name, section.title, "skipped", 0.0, None, "",
                                         reason="no time left in the report's budget"))
            continue
        results.append(_run_one(section, out, min(section.budget_s, left)))
        print(f"  {section.name}: {results[-1].status} ({results[-1].seconds:.0f} s)",
              flush=True)
    return results


#: Seconds an interrupted section has to print its summary before it is killed.
INTERRUPT_GRACE_S = 15.0


def _run_one(section: Section, out: Path, limit: float) -> SectionResult:
    json_file = out / f"{section.name}.json"
    argv = [arg.replace("{json}", str(json_file)) for arg in section.argv]
    argv = list(_without_pytest_benchmark(tuple(argv)))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    start = time.monotonic()
    process = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=env)
    grace = min(INTERRUPT_GRACE_S, limit / 4) if section.interrupt else 0.0
    try:
        output, _ = process.communicate(timeout=limit - grace)
    except subprocess.TimeoutExpired:
        output = ""
        if section.interrupt:  # pytest prints its counts on KeyboardInterrupt
            process.send_signal(signal.SIGINT)
            try:
                output, _ = process.communicate(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        if process.poll() is None:
            process.kill()
            more, _ = process.communicate()
            output += _text(more)
        (out / f"{section.name}.log").write_text(output)
        data = section.parse(output) if section.parse is not None else None
        return SectionResult(section.name, section.title, "timeout", time.monotonic() - start,
                             None, _tail(output), data,
                             reason=f"stopped after its {limit:.0f} s limit")
    seconds = time.monotonic() - start
    (out / f"{section.name}.log").write_text(output)  # the whole output; the report keeps a tail
    completed = subprocess.CompletedProcess(argv, process.returncode, output, "")
    data = None
    if section.writes_json and json_file.exists():
        try:
            data = json.loads(json_file.read_text())
        except json.JSONDecodeError as error:
            data = {"unreadable": str(error)}
    elif section.parse is not None:
        data = section.parse(output)
    status = "ok" if completed.returncode == 0 else "failed"
    if "--ignore=bench" in argv and section.interrupt:
        output += "\n(pytest-benchmark is not installed: bench/ was left out)"
    return SectionResult(section.name, section.title, status, seconds, completed.returncode,
                         _tail(output), data)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else (value or "")


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


# ---- sections implemented here ---------------------------------------------------------------


def environment() -> dict[str, Any]:
    """Device, driver, CUDA, library versions and the date (no device work)."""
    import numpy

    import gpuscalar

    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(), "numpy": numpy.__version__,
        "gpuscalar": gpuscalar.__version__, "host": platform.node(),
        "gpu": gpuscalar.gpu_available(),  # imports CuPy when it is installed
        "cupy": getattr(sys.modules.get("cupy"), "__version__", None),
    }
    if info["gpu"]:
        import cupy

        runtime = cupy.cuda.runtime
        props = runtime.getDeviceProperties(cupy.cuda.Device().id)
        name = props["name"]
        info.update(
            device=name.decode() if isinstance(name, bytes) else name,
            driver=_driver_version(),
            cuda_runtime=_cuda_version(runtime.runtimeGetVersion()),
            cuda_driver=_cuda_version(runtime.driverGetVersion()),
            multiprocessors=props["multiProcessorCount"],
            memory_gib=round(props["totalGlobalMem"] / 2**30, 1),
        )
    try:
        import torch

        info["torch"] = torch.__version__
    except ImportError:
        info["torch"] = None
    return info


def _cuda_version(number: int) -> str:
    """CUDA's integer version (12080) as text ("12.8")."""
    return f"{number // 1000}.{number % 1000 // 10}"


def _driver_version() -> str | None:
    """The NVIDIA driver's version ("580.159"): from nvidia-smi, else from the kernel module."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            query = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                                   capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            query = None
        if query is not None and query.returncode == 0 and query.stdout.strip():
            return query.stdout.split()[0]
    try:
        return module_version(Path("/proc/driver/nvidia/version").read_text())
    except OSError:
        return None


def module_version(text: str) -> str | None:
    """The driver version in /proc/driver/nvidia/version's text (proprietary or open module)."""
    found = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+(?:\.\d+)+)", text)
    return found.group(1) if found else None


def workload_sync_tables(xp: Any, size: str = "default") -> list[dict[str, Any]]:
    """Each workload's gpuscalar path on ``xp`` under a counter that also sees the array
    library's own syncs: its sync table, and whether it read only what it states it needs."""
    from gpuscalar import sync
    from gpuscalar.tools.workloads import WORKLOADS

    rows = []
    for name, workload in WORKLOADS.items():
        params = workload.params(size)
        inputs = workload.make_inputs(xp, params)
        counter = sync.SyncCounter(include_cupy=True)
        if xp.__name__ == "cupy":
            with sync.count_syncs(include_cupy=True) as counter:
                workload.run("gpuscalar", xp, params, inputs)
        else:  # the strict device declares its reads as CuPy does; no CuPy hook needed
            with sync._activate(counter):
                workload.run("gpuscalar", xp, params, inputs)
        needed = workload.host_values_needed(params)
        rows.append({"workload": name, "syncs": counter.count, "needed": needed,
                     "only_stated_reads": counter.count <= needed,
                     "device_ops": counter.device_ops, "table": counter.report()})
    return rows


def syncs_section() -> dict[str, Any]:
    import cupy

    rows = workload_sync_tables(cupy)
    return {"workloads": rows, "all_only_stated_reads": all(r["only_stated_reads"] for r in rows)}


# ---- writing the report --------------------------------------------------------------------------


def to_markdown(environment_info: dict[str, Any], results: list[SectionResult]) -> str:
    lines = ["# gpuscalar GPU report", ""]
    if not environment_info.get("gpu"):
        lines += ["**No GPU was found on this machine: nothing was measured.**", ""]
    lines += ["| | |", "|---|---|"]
    lines += [f"| {key} | {value} |" for key, value in environment_info.items()]
    if results:
        lines += ["", "| section | status | seconds |", "|---|---|---|"]
        lines += [f"| {r.name} | {r.status} | {r.seconds:.0f} |" for r in results]
    for result in results:
        lines += ["", f"## {result.title}", "",
                  f"status: **{result.status}**, {result.seconds:.0f} s"
                  + (f" ({result.reason})" if result.reason else "")]
        if result.name == "tests" and isinstance(result.data, dict):
            counts = ", ".join(f"{n} {word}" for word, n in result.data.items())
            lines += ["", f"counts: {counts or 'no pytest summary line in the output'}"]
        if result.name == "syncs" and isinstance(result.data, dict):
            for row in result.data.get("workloads", []):
                verdict = "ok" if row["only_stated_reads"] else "**MORE THAN STATED**"
                lines += ["", f"`{row['workload']}`: {row['syncs']} syncs, {row['needed']} "
                          f"needed: {verdict}", "", "```", row["table"], "```"]
        if result.output_tail:
            lines += ["", "```", result.output_tail, "```"]
    return "\n".join(lines) + "\n"


def write_report(out: Path, environment_info: dict[str, Any],
                 results: list[SectionResult], total_budget_s: float = TOTAL_BUDGET_S) -> None:
    report = {"environment": environment_info, "total_budget_s": total_budget_s,
              "sections": [asdict(r) for r in results]}
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / "report.md").write_text(to_markdown(environment_info, results))


def _parse(argv: list[str]) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    parser = argparse.ArgumentParser(prog="bench/gpu_report.py", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="folder for report.md and report.json")
    parser.add_argument("--section", choices=("environment", "syncs"), help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    parser.add_argument("--tests", choices=("all", "gpu"), default="all",
                        help="the test section runs the whole suite (all), or only the tests "
                             "that CI skips or fakes for want of a GPU (gpu: -k 'cupy or cuda "
                             "or gpu or nccl', spread over 12 processes with pytest-xdist where "
                             "installed)")
    parser.add_argument("--budget-s", type=float, default=TOTAL_BUDGET_S,
                        help="the whole report's time limit in seconds (default "
                             f"{TOTAL_BUDGET_S:.0f}); the test section gets what the "
                             "measurements leave")
    return parser, parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    parser, args = _parse(sys.argv[1:] if argv is None else argv)
    if args.section:  # one section, run in its own process by the report
        data = environment() if args.section == "environment" else syncs_section()
        if args.json:
            Path(args.json).write_text(json.dumps(data, indent=2, default=str))
        print(json.dumps(data, indent=2, default=str)[:4000])
        return 0 if data.get("all_only_stated_reads", True) else 1
    if args.out is None:
        parser.print_usage(sys.stderr)
        print("bench/gpu_report.py: --out DIR is required", file=sys.stderr)
        return 2
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        probe = args.out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        print(f"bench/gpu_report.py: cannot write to --out {str(args.out)!r}: "
              f"{error.strerror}", file=sys.stderr)
        return 2
    info = environment()
    if not info["gpu"]:
        print("bench/gpu_report.py: no GPU found (CuPy sees no CUDA device): nothing was "
              f"measured. Wrote a report saying so to {args.out}/.")
        write_report(args.out, info, [])
        return 0
    print(f"bench/gpu_report.py on {info.get('device')}: {len(SECTIONS)} sections, at most "
          f"{args.budget_s:.0f} s", flush=True)
    results = run_sections(sections_for(args.tests), args.out, args.budget_s)
    write_report(args.out, info, results, args.budget_s)
    print(f"wrote {args.out}/report.md and {args.out}/report.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())

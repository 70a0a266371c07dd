"""Host cost of ONE packed ``gs.distributed.all_reduce`` of 8 GPUScalars vs 8 separate calls.

Why this benchmark exists: packing is what makes ``k`` scalars cost one collective (and, on a
device, one sync) instead of ``k``; this measures what it saves on the host alone, where no
device runs ahead: one process, NumPy backend, ``MPI.COMM_SELF`` (mpi4py and mpich from the
test extra; no ``mpiexec`` needed: MPI starts as a singleton), so the figures are gpuscalar's
and mpi4py's Python path plus MPI's own per-call cost, never a network.

Cases (each a whole round: the collective(s) and the read of every result, so every
non-blocking request is completed inside the case and none piles up):

- ``8 x all_reduce + float``: ``gs.distributed.all_reduce(s, comm=...)`` for each of 8 scalars,
  then ``float`` of each result (8 collectives);
- ``packed all_reduce of 8 + gs.read``: one call for the 8 (one collective), then
  ``gs.read(*results)`` (one wait, one transfer);
- the same two without the reads (``... (calls only)``): the calls' own cost (on host MPI,
  GPUScalars alone go by non-blocking ``Iallreduce``: unread requests are left to complete
  when their results are collected, or at exit);
- ``mpi4py 8 x comm.allreduce(float)``: what people write on host floats (the floor of a
  per-value collective; pickles each float);
- ``mpi4py 1 x Allreduce of 8 doubles``: the floor: one buffer collective, no gpuscalar.

Prints ns per round (wall, best of 7) and the ratio to the packed case, or instructions per
round under callgrind with ``--instructions`` (valgrind; the nullcuda markers of
``shared/nullcuda``, as bench/nullcuda_harness.py uses them):

    python bench/allreduce_overhead.py [--n 2000] [--instructions] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nullcuda_harness as harness  # noqa: E402 - by path, as every bench of this folder

BENCH = "allreduce_overhead"
PACKED = "packed all_reduce of 8 + gs.read"
SEPARATE = "8 x all_reduce + float"
SEPARATE_CALLS = "8 x all_reduce (calls only)"
PACKED_CALL = "packed all_reduce of 8 (call only)"
VALUES = 8


def make_cases() -> dict[str, Any]:
    """The four rounds (label -> a function of no arguments)."""
    import numpy as np  # noqa: PLC0415
    from mpi4py import MPI  # noqa: PLC0415

    import gpuscalar as gs  # noqa: PLC0415

    comm = MPI.COMM_SELF
    like = np.zeros(())
    scalars = [gs.asscalar(float(i) + 0.5, like=like) for i in range(VALUES)]
    floats = [float(s) for s in scalars]
    buffer = np.arange(VALUES, dtype=np.float64)
    all_reduce = gs.distributed.all_reduce

    def separate() -> None:
        for s in scalars:
            float(all_reduce(s, "sum", comm=comm))

    def packed() -> None:
        gs.read(*all_reduce(scalars, "sum", comm=comm))

    def separate_calls() -> None:
        for s in scalars:
            all_reduce(s, "sum", comm=comm)

    def packed_call() -> None:
        all_reduce(scalars, "sum", comm=comm)

    def mpi_floats() -> None:
        for f in floats:
            comm.allreduce(f)

    def mpi_buffer() -> None:
        comm.Allreduce(MPI.IN_PLACE, buffer, op=MPI.SUM)

    assert gs.read(*all_reduce(scalars, "sum", comm=comm)) == tuple(floats)  # (1 rank: x)
    return {SEPARATE: separate, PACKED: packed, SEPARATE_CALLS: separate_calls,
            PACKED_CALL: packed_call, "mpi4py 8 x comm.allreduce(float)": mpi_floats,
            "mpi4py 1 x Allreduce of 8 doubles": mpi_buffer}


def measure(n: int) -> dict[str, float] | None:
    """ns per round (timing), or None under callgrind (the dumps hold the figures)."""
    harness.import_nullcuda()
    from nullcuda.measure import Bench  # noqa: PLC0415

    bench = Bench(BENCH, warm=20)
    rows = {}
    for label, fn in make_cases().items():
        row = bench.case(label, fn, n=n)
        if "ns" in row:
            rows[label] = row["ns"]
    return None if bench.callgrind else rows


def table(rows: dict[str, float], unit: str) -> str:
    base = rows[PACKED]
    lines = [f"{'round (one process, MPI.COMM_SELF, NumPy)':<42} {unit:>14}  vs packed"]
    lines += [f"{label:<42} {value:>14,.0f}  {value / base:6.2f}x"
              for label, value in rows.items()]
    what = unit.split()[0]
    lines.append(f"packing 8 GPUScalars into one all_reduce: {rows[SEPARATE] / base:.2f}x less "
                 f"host {what} than 8 separate calls (reads included); calls alone "
                 f"{rows[SEPARATE_CALLS] / rows[PACKED_CALL]:.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="allreduce_overhead", description=__doc__.split(
        "\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="rounds per region")
    parser.add_argument("--instructions", action="store_true",
                        help="instructions per round under callgrind (needs valgrind)")
    parser.add_argument("--out", help="with --instructions: directory for callgrind's dumps")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    options = parser.parse_args(argv)
    if options.n < 1:
        return harness.fail("allreduce_overhead", f"--n must be >= 1, got {options.n}")
    try:
        if options.instructions:
            rows = harness.instructions(__file__, BENCH, ["--n", str(options.n)], options.out)
            unit = "instructions"
        else:
            found = measure(options.n)
            if found is None:  # under callgrind: the parent reads the dumps
                return 0
            rows, unit = found, "ns (wall)"
    except ImportError as exc:
        return harness.fail("allreduce_overhead", f"cannot measure ({exc}): needs mpi4py "
                                                  "(the test extra) and shared/nullcuda")
    except (OSError, RuntimeError) as exc:
        return harness.cannot_measure("allreduce_overhead", exc)
    rows = {label: rows[label] for label in (SEPARATE, PACKED, *rows) if label in rows}
    print(table(rows, unit))
    if options.json:
        with open(options.json, "w", encoding="utf-8") as handle:
            json.dump({"unit": unit, "per_round": rows}, handle, indent=1)
            handle.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

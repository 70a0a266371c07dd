"""Fused Adam's achieved memory bandwidth on a CUDA GPU, against a device-to-device copy and
against an unfused CuPy Adam (one kernel per elementwise op).

Why this script exists: Adam is memory-bound. Per fp32 parameter a step must read param, grad,
exp_avg, exp_avg_sq and write param, exp_avg, exp_avg_sq: 28 bytes, the floor. The fraction of a
large copy's bandwidth that a step reaches over those 28 bytes says how close the fused kernel
is to the hardware limit. Unit tests cannot measure this; no number is written anywhere until
this script has run on a GPU.

    python bench/gpu_adam.py [--params 67108864] [--repeats 50]

Without a CUDA device it says so and exits 0.
"""

from __future__ import annotations

import argparse
import sys

import gpuscalar as gs
from gpuscalar import optim

BYTES_PER_PARAM = 28  # fp32: read p, g, m, v (16) + write p, m, v (12)


def _time_ms(cupy, fn, repeats: int) -> float:
    fn()  # warm-up (compiles kernels)
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(repeats):
        fn()
    stop.record()
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop) / repeats


def unfused_adam(cupy, p, g, m, v, t, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
    m *= b1
    m += (1 - b1) * g
    v *= b2
    v += (1 - b2) * g * g
    denom = cupy.sqrt(v) / (1 - b2**t) ** 0.5 + eps
    p -= (lr / (1 - b1**t)) * m / denom


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=64 * 2**20)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args(argv)
    if not gs.gpu_available():
        print("bench/gpu_adam.py needs a CUDA GPU with CuPy; none found here, nothing measured.")
        return 0
    import cupy

    n = args.params
    p = cupy.random.standard_normal(n, dtype=cupy.float32)
    g = cupy.random.standard_normal(n, dtype=cupy.float32)
    m, v = cupy.zeros_like(p), cupy.zeros_like(p)
    src, dst = cupy.empty(n * 7, dtype=cupy.float32), cupy.empty(n * 7, dtype=cupy.float32)

    copy_ms = _time_ms(cupy, lambda: cupy.copyto(dst, src), args.repeats)
    copy_gbs = 2 * src.nbytes / copy_ms / 1e6  # read + write

    step = gs.asscalar(1, like=p, dtype="int64")
    lr = gs.asscalar(1e-3, like=p)
    fused_ms = _time_ms(
        cupy, lambda: optim.adam_step(p, g, m, v, step=step, lr=lr), args.repeats
    )
    unfused_ms = _time_ms(cupy, lambda: unfused_adam(cupy, p, g, m, v, 1), args.repeats)

    opt = optim.Adam([p.reshape(-1)], lr=lr)
    grads = opt.grads
    grads[0][...] = g
    class_ms = _time_ms(cupy, lambda: opt.step(grads), args.repeats)

    print(f"device: {gs.backend.describe(gs.get_backend('cupy'))}")
    print(f"parameters: {n:,} fp32, {BYTES_PER_PARAM} bytes moved per parameter per step")
    print(f"device-to-device copy: {copy_gbs:8.1f} GB/s")
    for name, ms in (("fused adam_step", fused_ms), ("fused Adam class", class_ms),
                     ("unfused CuPy Adam", unfused_ms)):
        gbs = BYTES_PER_PARAM * n / ms / 1e6
        print(f"{name:18s}: {ms:8.3f} ms/step  {gbs:8.1f} GB/s  {gbs / copy_gbs:6.1%} of copy")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Sample script for the profiler tests: a loop with one sync per step, and a final print of a
value already read (no sync)."""

import sys

import numpy as np

import gpuscalar as gs


def step(x):
    loss = gs.sum(x * x)
    if loss > 1e9:  # a bool() read: one sync per call
        raise RuntimeError("diverged")
    return loss


def main(steps):
    x = np.linspace(0.0, 1.0, 8)
    for _ in range(steps):
        loss = step(x)
    print(f"final loss {loss:.3f}")  # a format() read: known already (the last bool() read)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)

"""k-means until the labels stop changing, decided on the device: zero syncs.

Why this example exists: CuPy's k-means example (``examples/kmeans`` in CuPy's repository) stops
when ``xp.all(new_pred == pred)``, a host read every iteration. With ``gs.while_loop`` the "did
any label change" flag is a 0-d bool array written by the body and read by the device, so the
whole clustering is one loop without a sync. The script clusters the same points both ways and
prints the iteration counts, the syncs each made, and whether labels and centers agree.

Runs on CuPy when a GPU is present, else NumPy:  python examples/kmeans.py
"""

from __future__ import annotations

from typing import Any

import numpy as np

import gpuscalar as gs

N_POINTS, N_CLUSTERS, MAX_ITER = 600, 4, 100


def blobs(xp: Any, seed: int = 0) -> Any:
    """Points around ``N_CLUSTERS`` centers in the plane."""
    rng = np.random.default_rng(seed)
    centers = rng.uniform(-6, 6, (N_CLUSTERS, 2))
    labels = rng.integers(0, N_CLUSTERS, N_POINTS)
    return xp.asarray(centers[labels] + rng.standard_normal((N_POINTS, 2)))


def start(xp: Any, points: Any) -> tuple[Any, ...]:
    """State: centers (the first points), labels, the "labels changed" flag, cluster ids."""
    centers = points[:N_CLUSTERS].copy()
    labels = xp.full(len(points), -1, dtype=np.int64)
    changed = xp.ones((), dtype=bool)
    return centers, labels, changed, xp.arange(N_CLUSTERS)


def labels_changed(points: Any, centers: Any, labels: Any, changed: Any, ids: Any) -> Any:
    return changed


def iteration(points: Any, centers: Any, labels: Any, changed: Any, ids: Any) -> None:
    """Label each point by its nearest center, note whether any label changed, move centers."""
    distances = ((points[:, None, :] - centers[None, :, :]) ** 2).sum(axis=2)
    new_labels = distances.argmin(axis=1)
    changed[...] = (new_labels != labels).any()
    labels[...] = new_labels
    mask = labels == ids[:, None]
    sums = (mask[:, :, None] * points[None, :, :]).sum(axis=1)
    counts = mask.sum(axis=1)[:, None]
    centers[...] = sums / counts


def cluster_on_device(points: Any, xp: Any) -> tuple[Any, Any, gs.GPUScalar]:
    state = start(xp, points)
    n = gs.while_loop(labels_changed, iteration, points, *state, max_iter=MAX_ITER)
    return state[0], state[1], n


def cluster_with_host_checks(points: Any, xp: Any) -> tuple[Any, Any, int]:
    """The straightforward loop: one host read of the flag per iteration."""
    state = start(xp, points)
    n = 0
    while n < MAX_ITER and bool(gs.GPUScalar(state[2])):
        iteration(points, *state)
        n += 1
    return state[0], state[1], n


def main() -> None:
    backend = gs.default_backend()
    xp = backend.xp
    points = blobs(xp)
    with gs.count_syncs() as device_counter:
        centers, labels, n = cluster_on_device(points, xp)
    with gs.count_syncs() as host_counter:
        centers_plain, labels_plain, n_plain = cluster_with_host_checks(points, xp)
    same = bool(gs.all(labels == labels_plain)) and bool(gs.all(centers == centers_plain))
    print(f"backend: {backend.name}, {N_POINTS} points, {N_CLUSTERS} clusters")
    print(f"while_loop: iterations {int(n)}, syncs {device_counter.count}")
    print(f"host checks: iterations {n_plain}, syncs {host_counter.count}")
    print(f"same labels and centers: {same}")


if __name__ == "__main__":
    main()

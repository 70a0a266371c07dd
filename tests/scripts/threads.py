"""Sample script for the profiler tests: syncs made in worker threads that the script starts."""

import sys
import threading

import numpy as np

import gpuscalar as gs


def work(n):
    s = gs.sum(np.arange(float(n)))
    float(s)  # a worker's read: one sync in each worker thread


workers = [threading.Thread(target=work, args=(n,)) for n in range(int(sys.argv[1]))]
for worker in workers:
    worker.start()
for worker in workers:
    worker.join()
print(f"done {gs.sum(np.ones(2)):.1f}")  # the main thread's read: one sync

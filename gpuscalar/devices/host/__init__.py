"""The host device (a wing of `gpuscalar.devices`): NumPy arrays, always there.

Why this subpackage exists: every device is one folder that owns its code, the smallest one
included. `backend` is its root (`NumpyBackend` and its one instance); beside it the executors
that serve NumPy and the strict device alike (both evaluate on the host; the strict device's
entries name them): `metrics` (`gs.MetricLog`'s ring in host data) and `collectives`
(`gs.distributed.all_reduce`, MPI on host data in `mpi`, imported only with the user's mpi4py
communicator).
"""

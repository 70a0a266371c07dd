"""The host device (a wing of `gpuscalar.devices`): NumPy arrays, always there.

Why this subpackage exists: every device is one folder that owns its code, the smallest one
included. `backend` is its root (`NumpyBackend` and its one instance); beside it the host
executors that NumPy and the strict device share, one home that both wings' entries name
(`Backend.executors`), each computing on NumPy data in one counted device op: `blas`
(``"blas"``: gs.matmul, gs.dot, gs.vdot), `sparse` (``"sparse"``: gs.spmv, gs.as_csr, which the
strict device's extends for its own CSR matrices), `control` (the ``"loops"`` executor:
`gs.while_loop`/`gs.cond` run on the host, with check runs of the bodies that do not run),
`graphs` (the ``"graphs"`` executor: a `gs.capture` step re-run under the sync guard, its
outputs kept in the same buffers), `fusion` (``"scalars"``: pending expressions evaluated with
NumPy, one op each), `steps` (``"steps"``: the optimizers' programs on the host, with the
strict device's layout rule in `strict_steps`), `metrics` (``"metrics"``: `gs.MetricLog`'s ring
in host data) and `collectives` (``"collectives"``: `gs.distributed.all_reduce`, MPI on host
data in `mpi`, imported only with the user's mpi4py communicator). Importing this package
imports none of them: the registry imports `backend` only.
"""

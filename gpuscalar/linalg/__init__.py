"""Sync-free Krylov solvers: SciPy's ``cg``, ``cgs``, ``bicgstab``, ``gmres`` and ``minres``,
each one `gs.while_loop` on the device.

Why this package exists: CuPy's own solvers (``cupyx.scipy.sparse.linalg``) read a residual
norm, a breakdown test or a least-squares problem on the host every iteration, so a solve makes
one or more syncs per iteration. Here each solve is set-up work plus ONE `gs.while_loop`: the
device decides when to stop (on a GPU, one graph launch with conditional nodes), and nothing is
read on the host. Signatures are cupyx's (and SciPy's): ``(A, b, x0=None, *, rtol=1e-5,
atol=0.0, maxiter=None, M=None, callback=None)`` (``restart`` for gmres, ``shift`` for minres),
returning ``(x, info)`` where ``info`` is an int64 GPUScalar with SciPy's meaning (0
converged, > 0 the iteration limit reached, < 0 a breakdown). The iterates are SciPy's
(``scipy/sparse/linalg/_isolve``): the same iterations, to rounding.

``A`` and ``M`` are dense device arrays, sparse matrices on ``b``'s device (``scipy.sparse`` on
NumPy, ``cupyx.scipy.sparse`` on CuPy, `gs.as_csr` on any; multiplied by `gs.spmv`), objects
with ``matvec`` and ``shape`` (SciPy's and cupyx's LinearOperators) or callables (see
`aslinearoperator`); whatever multiplies must work in a loop body (no sync, no host-to-device
copy). ``callback`` is refused: calling Python with every
iterate needs the host every iteration.
"""

from ._cg import bicgstab, cg, cgs
from ._gmres import gmres
from ._minres import minres
from ._system import LinearOperator, aslinearoperator

__all__ = ["LinearOperator", "aslinearoperator", "bicgstab", "cg", "cgs", "gmres", "minres"]

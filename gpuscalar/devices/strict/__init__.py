"""The CuPy-strict CPU device (a wing of `gpuscalar.devices`): a stand-in for a CUDA device.

Why this subpackage exists: a device owns its code. `device` is the root (strict arrays, their
namespace ``xp``, `StrictBackend` and its one instance); beside it `capture` (what CuPy refuses
while a graph is recorded), `loops` (the NumPy loops CuPy has no routine for, refused),
`random` (``xp.random.default_rng``'s generators) and `sparse`
(``cupyx.scipy.sparse.csr_matrix`` with strict arrays). Users reach it as ``gs.strict``
(`gpuscalar.strict` re-exports the public names); the registry imports `device` only.
"""

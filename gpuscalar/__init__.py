"""gpuscalar: float-like device scalars that synchronize only when Python needs the value.

The public API, re-exported from the modules that implement it (see README, "Architecture").
Importing gpuscalar never imports CuPy.
"""

# The modules that install GPUScalar's members first, in their order (operators, their array
# path, the NumPy and CuPy entry points): before anything makes a scalar
from . import operators, arrays, math  # noqa: F401, I001
from . import ad, distributed, linalg, optim, strict
from .backend import Backend
from .devices import default_backend, get_backend, gpu_available
from .capture import CapturedStep, capture
from .control import cond, while_loop
from .deferred import MetricLog, read
from .matmul import matmul
from .lazy.expr import cache_size, lazy, set_cache_size
from .math import (
    abs,
    arctan2,
    ceil,
    clip,
    cos,
    exp,
    exp2,
    expm1,
    floor,
    hypot,
    isfinite,
    isinf,
    isnan,
    log,
    log1p,
    log2,
    log10,
    maximum,
    minimum,
    power,
    sign,
    sin,
    sqrt,
    tan,
    tanh,
    where,
)
from .optim import all_finite, clip_grad_norm
from .progressbar import progress
from .promote import Rule
from .reduce import (
    all,
    any,
    count_nonzero,
    dot,
    global_norm,
    logsumexp,
    max,
    mean,
    min,
    norm,
    prod,
    std,
    sum,
    unbroadcast,
    var,
    vdot,
)
from .scalar import GPUScalar, asscalar
from .sparse import as_csr, spmv
from .sync import (
    SyncCounter,
    SyncError,
    SyncRecord,
    SyncSite,
    SyncWarning,
    count_syncs,
    sync_guard,
    total_syncs,
)

__version__ = "0.3.0"

__all__ = [
    "Backend",
    "CapturedStep",
    "GPUScalar",
    "MetricLog",
    "Rule",
    "SyncCounter",
    "SyncError",
    "SyncRecord",
    "SyncSite",
    "SyncWarning",
    "__version__",
    "abs",
    "ad",
    "arctan2",
    "all",
    "all_finite",
    "any",
    "asscalar",
    "capture",
    "ceil",
    "clip",
    "clip_grad_norm",
    "cond",
    "count_nonzero",
    "cos",
    "count_syncs",
    "distributed",
    "default_backend",
    "dot",
    "exp",
    "exp2",
    "expm1",
    "floor",
    "get_backend",
    "global_norm",
    "gpu_available",
    "hypot",
    "isfinite",
    "isinf",
    "isnan",
    "lazy",
    "linalg",
    "set_cache_size",
    "cache_size",
    "log",
    "log10",
    "log1p",
    "log2",
    "logsumexp",
    "matmul",
    "spmv",
    "as_csr",
    "max",
    "maximum",
    "mean",
    "min",
    "minimum",
    "norm",
    "optim",
    "power",
    "prod",
    "read",
    "progress",
    "sign",
    "sin",
    "sqrt",
    "std",
    "strict",
    "sum",
    "sync_guard",
    "tan",
    "tanh",
    "total_syncs",
    "unbroadcast",
    "var",
    "vdot",
    "where",
    "while_loop",
]

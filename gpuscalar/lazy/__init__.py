"""Pending scalar expressions: what a lazy GPUScalar holds, and where it is evaluated.

Why this subpackage exists: a lazy GPUScalar is a recipe, and turning recipes into as few
launches as possible is one idea in three steps, each with one home: `expr` (immutable nodes with
structural keys made when built, the size bound, the host evaluator), `codegen` (CUDA C for an
expression, written as CuPy writes each operation, with FMA barriers) and `fusion` (where an
expression is evaluated: one launch to materialize, none of its own inside an array operation;
the kernel and plan caches); `rules` builds optimizer update rules from the same nodes, with
one infix C printer and one host evaluator. Every cache here is bounded by one setting,
`set_cache_size` (entries per cache, least recently used dropped first; `cache_size` reads it,
both also `gs.` names). Nothing here
knows about GPUScalar's operators.
"""

from .expr import cache_size, set_cache_size

__all__ = ["cache_size", "set_cache_size"]

"""``cupy.random`` generators on the strict device: what ``gs.strict.xp.random.default_rng`` makes.

Why this module exists: code written for CuPy draws with ``cupy.random.default_rng()``, and the
strict device must give it strict arrays (NumPy's would be refused by the next operation) and
refuse what CuPy's generator lacks. It is a module of its own because ``device.py`` is at the
package's size limit; it knows nothing of strict arrays: the device hands each generator its
``draw`` function (unwrap the operands, one device op, a strict array back), so the strict
module imports this one and not the other way round.

What CuPy has and NumPy gives: a `Generator` has exactly the methods of ``cupy.random.Generator``
(`GENERATOR_METHODS`; not NumPy's ``normal``, ``choice``, ``permutation``, ``shuffle``...), takes
``dtype`` where CuPy takes it, returns a 0-d array for ``size=None`` as CuPy does, and fills and
returns ``out=``. The values are NumPy's for the seed; cuRAND's differ.

In a body (a `gs.while_loop`/`gs.cond` body or a `gs.capture` step: `gpuscalar.sync.in_graph_body`)
every draw is refused, as `gpuscalar.devices.strict.capture` explains (CuPy's cuRAND refuses a
capturing stream, and its generator's draws with array parameters upload a table: the conservative
side for the rest).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ... import sync
from . import capture

__all__ = ["GENERATOR_METHODS", "Generator", "default_rng_on"]

#: The methods of ``cupy.random.Generator`` (CuPy 14.2), the only ones a `Generator` has.
GENERATOR_METHODS = (
    "beta", "binomial", "chisquare", "dirichlet", "exponential", "f", "gamma", "geometric",
    "hypergeometric", "integers", "logseries", "poisson", "power", "random",
    "standard_exponential", "standard_gamma", "standard_normal", "uniform",
)
#: Methods whose ``dtype`` CuPy takes and NumPy's generator does not: cast after the draw.
_DTYPE_CAST_AFTER = frozenset({"beta", "uniform"})

#: A device's draw: ``draw(function, args, kwargs)`` calls NumPy's ``function`` on the operands
#: unwrapped, as one device op, and returns its result as a device array (0-d for a number).
Draw = Callable[[Callable[..., Any], tuple, dict], Any]


class Generator:
    """``cupy.random.Generator`` on the strict device: NumPy's generator, drawing strict arrays
    (one device op each). Made by ``xp.random.default_rng``; see the module docstring."""

    __slots__ = ("_numpy", "_draw")

    def __init__(self, numpy_generator: np.random.Generator, draw: Draw) -> None:
        self._numpy = numpy_generator
        self._draw = draw

    @property
    def bit_generator(self) -> np.random.BitGenerator:
        return self._numpy.bit_generator

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or not hasattr(np.random.Generator, name):
            raise AttributeError(f"'Generator' object has no attribute {name!r}")
        raise AttributeError(
            f"cupy.random.Generator has no method {name!r} (CuPy 14 has only "
            f"{', '.join(GENERATOR_METHODS)}); the legacy function xp.random.{name}, or "
            "loc + scale * standard_normal(...) for normal, may serve"
        )

    def __repr__(self) -> str:
        return f"<strict Generator over {self._numpy!r}>"


def _cast(function: Callable[..., Any], dtype: Any) -> Callable[..., Any]:
    def cast(*args: Any, **kwargs: Any) -> np.ndarray:
        return np.asarray(function(*args, **kwargs)).astype(dtype, copy=False)

    return cast


def _method(name: str) -> Callable[..., Any]:
    cast_after = name in _DTYPE_CAST_AFTER

    def method(self: Generator, *args: Any, **kwargs: Any) -> Any:
        capture.refuse_curand(f"Generator.{name}")
        function = getattr(self._numpy, name)
        dtype = kwargs.pop("dtype", None) if cast_after else None
        if dtype is not None:
            function = _cast(function, dtype)
        out = kwargs.get("out")
        result = self._draw(function, args, kwargs)
        return out if out is not None else result

    method.__name__ = name
    method.__doc__ = f"``cupy.random.Generator.{name}`` on the strict device (one device op)."
    return method


for _name in GENERATOR_METHODS:
    setattr(Generator, _name, _method(_name))
del _name


def default_rng_on(draw: Draw) -> Callable[..., Generator]:
    """``cupy.random.default_rng`` for the device whose draws ``draw`` makes."""

    def default_rng(seed: Any = None) -> Generator:
        """``cupy.random.default_rng``: a `Generator` (NumPy's for ``seed``); a `Generator` is
        returned as it is. Setting up its state is one device op, as in CuPy."""
        if type(seed) is Generator:
            return seed
        capture.refuse_curand("default_rng")
        with sync.one_device_op():
            return Generator(np.random.default_rng(seed), draw)

    return default_rng

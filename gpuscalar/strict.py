"""The CuPy-strict CPU device: a stand-in for a CUDA device, made of NumPy arrays.

Why this module exists: ``gs.strict`` (``import gpuscalar.strict``, ``from gpuscalar import
strict``) is public, and the device itself is a wing, `gpuscalar.devices.strict`, whose module
`gpuscalar.devices.strict.device` says what it does and why. This module only re-exports the
device's public names.
"""

from .devices.strict.device import (
    CUBLAS_CAPTURE_MESSAGE,
    CURAND_CAPTURE_MESSAGE,
    CUSOLVER_CAPTURE_MESSAGE,
    CUSPARSE_CAPTURE_MESSAGE,
    FILL_MESSAGE,
    H2D_CAPTURE_MESSAGE,
    IMPLICIT_MESSAGE,
    STRICT,
    Device,
    StrictArray,
    StrictBackend,
    device,
    xp,
)

__all__ = ["StrictArray", "StrictBackend", "STRICT", "Device", "xp", "device", "IMPLICIT_MESSAGE",
           "H2D_CAPTURE_MESSAGE", "CUBLAS_CAPTURE_MESSAGE", "CUSOLVER_CAPTURE_MESSAGE",
           "CURAND_CAPTURE_MESSAGE", "CUSPARSE_CAPTURE_MESSAGE", "FILL_MESSAGE"]

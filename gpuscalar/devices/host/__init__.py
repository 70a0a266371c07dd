"""The host device (a wing of `gpuscalar.devices`): NumPy arrays, always there.

Why this subpackage exists: every device is one folder that owns its code, the smallest one
included. `backend` is its root (`NumpyBackend` and its one instance); NumPy needs nothing
else of its own, since gpuscalar's host evaluators serve it and the strict device alike.
"""

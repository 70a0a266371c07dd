"""Logistic regression trained without a single unplanned sync.

Why this example exists: it is the smallest complete training loop that uses everything a
device-resident scalar is for, and proves it by counting. The backward pass is written by hand
with gpuscalar.ad; gradients are clipped with gpuscalar.optim.clip_grad_norm (the norm stays on
the device); Adam updates the weight arrays themselves, in place, and its learning rate follows a
warm-up schedule computed on the device from the optimizer's live step counter. The only host
reads are the logged losses, so the number of syncs printed at the end equals the number of
logged values.

Runs on CuPy when a GPU is present, else NumPy:  python examples/logistic_regression.py
"""

from __future__ import annotations

import numpy as np

import gpuscalar as gs
from gpuscalar import ad, optim

N_SAMPLES, N_FEATURES, STEPS, LOG_EVERY, WARMUP = 512, 16, 200, 10, 20
BASE_LR, MAX_NORM = 0.05, 1.0


def main() -> None:
    backend = gs.default_backend()
    xp = backend.xp
    rng = np.random.default_rng(0)
    true_w = rng.standard_normal(N_FEATURES)
    X_host = rng.standard_normal((N_SAMPLES, N_FEATURES))
    y_host = np.where(X_host @ true_w + 0.3 * rng.standard_normal(N_SAMPLES) > 0, 1.0, -1.0)
    X, y = xp.asarray(X_host, dtype=xp.float32), xp.asarray(y_host, dtype=xp.float32)

    w = xp.zeros(N_FEATURES, dtype=xp.float32)
    b = xp.zeros(1, dtype=xp.float32)
    opt = optim.Adam([w, b])  # each step updates w and b themselves, in place

    logged = 0
    with gs.count_syncs() as counter:
        for step in range(STEPS):
            # forward: loss = mean(softplus(-y * (X @ w + b)))
            xw = X @ w
            logits = xw + b
            u = -y * logits
            loss = gs.mean(xp.logaddexp(0, u))

            # backward, rule by rule
            d_softplus = ad.vjp_mean(gs.asscalar(1.0, like=X), u)
            d_u = d_softplus / (1 + xp.exp(-u))  # softplus'(u) = sigmoid(u)
            _, d_logits = ad.vjp_mul(d_u, -y, logits)
            d_xw, d_b = ad.vjp_add(d_logits, xw, b)
            d_w = X.T @ d_xw

            optim.clip_grad_norm([d_w, d_b], MAX_NORM)
            opt.lr = BASE_LR * gs.minimum(1.0, (opt.step_count + 1) / WARMUP)
            opt.step([d_w, d_b])

            if step % LOG_EVERY == 0:
                print(f"step {step:4d}  loss {loss:.4f}")  # the one deliberate sync
                logged += 1
        syncs = counter.count
    print(f"backend: {backend.name}")
    print(f"logged values: {logged}")
    print(f"syncs: {syncs}")


if __name__ == "__main__":
    main()

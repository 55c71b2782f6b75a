#!/usr/bin/env python3
"""The mean squared error of a scalar quantizer of N(0, 1) with Lloyd-Max levels (the codec's
`lloyd-max` codebook) against the best uniform levels (a constant step, symmetric about 0), at
2, 3 and 4 bits: what a codebook whose levels are computed instead of looked up would cost in
accuracy (docs/cuda-kernel-log.md, after the KV lab rows). Nearest-level quantization,
integrated numerically over [-10, 10]; needs NumPy.

Usage: python3 tools/uniform_levels.py
"""

import numpy as np

X = np.linspace(-10.0, 10.0, 400001)
W = np.exp(-X * X / 2) / np.sqrt(2 * np.pi)
DX = X[1] - X[0]


def mse(levels):
    levels = np.sort(np.asarray(levels))
    bounds = (levels[1:] + levels[:-1]) / 2
    return float(np.sum((X - levels[np.searchsorted(bounds, X)]) ** 2 * W) * DX)


def lloyd_max(n, rounds=500):
    levels = np.linspace(-2.0, 2.0, n)
    for _ in range(rounds):
        cell = np.searchsorted((levels[1:] + levels[:-1]) / 2, X)
        levels = np.bincount(cell, weights=X * W, minlength=n) / np.bincount(
            cell, weights=W, minlength=n)
    return levels


def main():
    for bits in (2, 3, 4):
        n = 2**bits
        optimal = mse(lloyd_max(n))
        steps = np.linspace(0.05, 1.5, 1451)
        uniform = [mse((np.arange(n) - (n - 1) / 2) * step) for step in steps]
        best = int(np.argmin(uniform))
        print(f"{bits} bits: Lloyd-Max MSE {optimal:.5f}, best uniform {uniform[best]:.5f} "
              f"(step {steps[best]:.3f}), ratio {uniform[best] / optimal:.3f}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Precision of the chunked GDN state pass with its products on f16 matrix units.

Emulates, on the CPU, the wgpu state pass (chunks of 32 tokens; W, U, Qd, Kd, P, decays from an
f32 prepare) with its four products (W S, Qd S, P V', Kd^T V') done as tensor cores would with
f16 operands and f32 accumulation: one product of f16-rounded operands (`f16x1`), the hi/lo
split of both operands in three products (`f16x3`: hi hi + (hi lo + lo hi) / 2^11, the low
halves stored times 2^11 so that they stay normal f16 numbers) or four (`f16x4`, with lo lo),
the split with unscaled low halves (`f16x3-unscaled`: those of |x| < 0.125 are f16
subnormals), and `mixed` (f16x3 for the state's products, f16x1 for those only o needs),
against the same pass in f32 (`f32`) and an f64 recurrence (the oracle). Prints
rel_rms of o and of the final state for each, at T tokens, one head, K = V = 128, q and k l2
normalised, beta in [0.05, 0.95), g in [-0.7, -0.01) times --gate-scale.

    python3 tools/coop-lab/emulate.py --tokens 4096 --gate-scale 1
"""
import argparse

import numpy as np

C = 32


def rel_rms(x, ref):
    return float(np.sqrt(np.mean((x - ref) ** 2) / np.mean(ref ** 2)))


# The low half is stored times 2^11 (exact), so that it stays a normal f16 down to |x| ~ 2^-14
# instead of falling into f16's subnormals below |x| ~ 0.125; the cross products are summed
# apart and scaled back once.
LO_SCALE = np.float32(2048.0)


def split(x, lo_scale):
    # The kernels' halves (split_f16 in coop_split_step.wgsl): hi is x on f16's grid, from x's
    # bits at or above f16's smallest normal (half an f16 step added to the magnitude, 13 bits
    # cleared) and rounded to a multiple of 2^-24 below it; lo from the f32 hi, as the kernel.
    x = x.astype(np.float32)
    bits = (x.view(np.uint32) + np.uint32(0x1000)) & np.uint32(0xFFFFE000)
    normal = bits.view(np.float32)
    subnormal = (np.round(x * np.float32(2.0**24)) * np.float32(2.0**-24)).astype(np.float32)
    hi = np.where(np.abs(x) < np.float32(2.0**-14), subnormal, normal).astype(np.float32)
    lo = ((x - hi) * lo_scale).astype(np.float16).astype(np.float32)
    return hi.astype(np.float16).astype(np.float32), lo


def product(form):
    """a @ b as the matrix units would give it (f16 operands exact in f32, f32 sums)."""
    if form == "f32":
        return lambda a, b: (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float32)
    lo_scale = np.float32(1.0) if form.endswith("-unscaled") else LO_SCALE

    def mm(a, b):
        ah, al = split(a.astype(np.float32), lo_scale)
        bh, bl = split(b.astype(np.float32), lo_scale)
        out = ah @ bh
        if form.startswith(("f16x3", "f16x4")):
            out = out + (ah @ bl + al @ bh) / lo_scale
        if form.startswith("f16x4"):
            out = out + (al @ bl) / (lo_scale * lo_scale)
        return out.astype(np.float32)

    return mm


def oracle(q, k, v, g, beta, s0):
    s = s0.astype(np.float64).copy()
    o = np.zeros((len(q), v.shape[1]))
    for t in range(len(q)):
        s *= np.exp(g[t])
        u = beta[t] * (v[t] - k[t] @ s)
        s += np.outer(k[t], u)
        o[t] = q[t] @ s
    return o, s


def chunked(q, k, v, g, beta, s0, mm, mm_out=None):
    """The chunked pass; `mm_out` (default `mm`) does the products only o needs (Qd S, P V')."""
    mm_out = mm_out or mm
    f = np.float32
    q, k, v, g, beta = (x.astype(f) for x in (q, k, v, g, beta))
    s = s0.astype(f).copy()
    o = np.zeros((len(q), v.shape[1]), dtype=f)
    for c0 in range(0, len(q), C):
        qc, kc, vc = q[c0:c0 + C], k[c0:c0 + C], v[c0:c0 + C]
        n = len(qc)
        gc = np.cumsum(g[c0:c0 + C]).astype(f)
        bc = beta[c0:c0 + C]
        decay = np.exp(gc[:, None] - gc[None, :]).astype(f)
        a = np.tril(bc[:, None] * decay * (kc @ kc.T), -1).astype(f)
        t = np.linalg.inv(np.eye(n, dtype=f) + a).astype(f)
        w = (t @ (kc * (bc * np.exp(gc))[:, None])).astype(f)
        u = (t @ (vc * bc[:, None])).astype(f)
        qd = (qc * np.exp(gc)[:, None]).astype(f)
        p = np.tril(decay * (qc @ kc.T)).astype(f)
        kd = (kc * np.exp(gc[-1] - gc)[:, None]).astype(f)
        v_new = u - mm(w, s)
        o[c0:c0 + n] = mm_out(qd, s) + mm_out(p, v_new)
        s = (np.exp(gc[-1]) * s + mm(kd.T, v_new)).astype(f)
    return o, s


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--gate-scale", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    t, d = args.tokens, args.dim
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
    q = unit(rng.standard_normal((t, d))) * d ** -0.5
    k = unit(rng.standard_normal((t, d)))
    v = rng.standard_normal((t, d))
    g = rng.uniform(-0.7, -0.01, t) * args.gate_scale
    beta = rng.uniform(0.05, 0.95, t)
    s0 = rng.standard_normal((d, d)) * 0.3
    ref_o, ref_s = oracle(q, k, v, g, beta, s0)
    print(f"T={t} K=V={d} gate scale {args.gate_scale}: rel_rms against the f64 recurrence")
    for form in ("f32", "f16x1", "f16x3-unscaled", "f16x3", "f16x4"):
        o, s = chunked(q, k, v, g, beta, s0, product(form))
        print(f"  {form:<14} o {rel_rms(o, ref_o):.3e}  final state {rel_rms(s, ref_s):.3e}")
    # The state's products (W S, Kd^T V') in three, o's (Qd S, P V') in one.
    o, s = chunked(q, k, v, g, beta, s0, product("f16x3"), product("f16x1"))
    print(f"  {'mixed':<14} o {rel_rms(o, ref_o):.3e}  final state {rel_rms(s, ref_s):.3e}"
          "  (W S, Kd^T V' as f16x3; Qd S, P V' as f16x1)")


if __name__ == "__main__":
    main()

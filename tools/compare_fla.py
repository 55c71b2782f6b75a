#!/usr/bin/env python3
"""Compare deltakv's CUDA GDN decode with FLA's fused_recurrent_gated_delta_rule, same GPU,
same call.

Runs FLA (0.6, Triton) at the shapes deltakv's `bench gdn --device cuda` timed, times it with
triton.testing.do_bench_cudagraph (kernel time without Python launch overhead, as deltakv's
CUDA-graph timing), measures FLA's error against an f64 recurrence on the same inputs, reads
deltakv's JSON records and prints one table with the ratios.

Usage (on the GPU machine, FLA importable):
    python3 tools/compare_fla.py --deltakv-json DK.json [--csv OUT.csv]
"""

import argparse
import csv
import json
import sys

import torch
import torch.nn.functional as F
import triton


def reference_decode(q, k, v, g, beta, state, scale):
    """The GDN recurrence in f64 (l2 norm on q and k), one step per token: returns o, state."""
    q, k, v = (x.double() for x in (q, k, v))
    g, beta, state = g.double(), beta.double(), state.double().clone()
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    batch, tokens, key_heads, _ = q.shape
    value_heads = v.shape[2]
    group = value_heads // key_heads
    q = q.repeat_interleave(group, dim=2)
    k = k.repeat_interleave(group, dim=2)
    outs = []
    for t in range(tokens):
        state = state * torch.exp(g[:, t])[..., None, None]
        kt, qt = k[:, t], q[:, t]
        v_new = beta[:, t][..., None] * (v[:, t] - torch.einsum("bhk,bhkv->bhv", kt, state))
        state = state + torch.einsum("bhk,bhv->bhkv", kt, v_new)
        outs.append(scale * torch.einsum("bhk,bhkv->bhv", qt, state))
    return torch.stack(outs, 1), state


def rel_rms(x, ref):
    x, ref = x.double(), ref.double()
    return ((x - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()


def fla_decode(batch, tokens, key_heads, value_heads, key_dim, value_dim, seed=0):
    """Times FLA's decode (fused gating, l2 norm, f32 state read and written) and measures its
    error; returns (median us, o rel_rms, state rel_rms)."""
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    torch.manual_seed(seed)
    dev = "cuda"
    q = torch.randn(batch, tokens, key_heads, key_dim, device=dev, dtype=torch.bfloat16)
    k = torch.randn(batch, tokens, key_heads, key_dim, device=dev, dtype=torch.bfloat16)
    v = torch.randn(batch, tokens, value_heads, value_dim, device=dev, dtype=torch.bfloat16)
    a = torch.randn(batch, tokens, value_heads, device=dev, dtype=torch.float32)
    b = 1.5 * torch.randn(batch, tokens, value_heads, device=dev, dtype=torch.float32)
    a_log = torch.empty(value_heads, device=dev).uniform_(0.0, 2.5)
    dt_bias = torch.empty(value_heads, device=dev).uniform_(-5.0, -1.0)
    state = 0.3 * torch.randn(batch, value_heads, key_dim, value_dim, device=dev)
    scale = key_dim ** -0.5

    def call():
        return fused_recurrent_gated_delta_rule(
            q, k, v, g=a, beta=b, scale=scale, initial_state=state,
            output_final_state=True, use_qk_l2norm_in_kernel=True,
            use_gate_in_kernel=True, A_log=a_log, dt_bias=dt_bias,
            use_beta_sigmoid_in_kernel=True,
        )

    o, final = call()
    g = -torch.exp(a_log) * F.softplus(a + dt_bias)
    beta = torch.sigmoid(b)
    o_ref, state_ref = reference_decode(q, k, v, g, beta, state, scale)
    o_err, st_err = rel_rms(o.float(), o_ref), rel_rms(final, state_ref)
    torch.cuda.synchronize()
    ms = triton.testing.do_bench_cudagraph(call, rep=200, return_mode="median")
    return ms * 1e3, o_err, st_err


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deltakv-json", required=True, help="records of `deltakv bench gdn --device cuda --json`")
    parser.add_argument("--csv", help="write the table as CSV here")
    args = parser.parse_args()
    with open(args.deltakv_json) as f:
        records = [r for r in json.load(f) if r.get("op") == "gdn_decode" and r.get("device") == "cuda"]
    if not records:
        sys.exit("error: no CUDA gdn_decode records in " + args.deltakv_json)
    print(f"GPU: {torch.cuda.get_device_name()}; FLA fused_recurrent_gated_delta_rule, do_bench_cudagraph median")
    rows = []
    fla_f32 = {}
    for r in sorted(records, key=lambda r: (r["T"], r["intermediate_states"], r["B"], r["pool_dtype"])):
        key = (r["B"], r["T"], r["Hg"], r["H"], r["K"], r["V"])
        fla = None
        if not r["intermediate_states"]:
            if key not in fla_f32:
                fla_f32[key] = fla_decode(*key)
            fla = fla_f32[key]
        row = {
            "B": r["B"], "T": r["T"], "pool": r["pool_dtype"],
            "intermediate": r["intermediate_states"],
            "deltakv_us": r["median_us"], "deltakv_state_tb_s": r["state_tb_per_s"],
            "fla_f32_us": fla[0] if fla else None,
            "ratio_vs_fla_f32": r["median_us"] / fla[0] if fla else None,
            "fla_o_rel_rms": fla[1] if fla else None,
            "fla_state_rel_rms": fla[2] if fla else None,
        }
        rows.append(row)
    print(f"{'B':>4} {'T':>2} {'pool':>5} {'inter':>5} {'deltakv us':>11} {'TB/s':>6} {'FLA f32 us':>11} {'dk/FLA':>7} {'FLA o err':>10} {'FLA st err':>10}")
    for row in rows:
        fmt = lambda x, spec: format(x, spec) if x is not None else "-"
        print(f"{row['B']:>4} {row['T']:>2} {row['pool']:>5} {str(row['intermediate'])[0]:>5} "
              f"{row['deltakv_us']:>11.2f} {row['deltakv_state_tb_s']:>6.2f} {fmt(row['fla_f32_us'], '>11.2f')} "
              f"{fmt(row['ratio_vs_fla_f32'], '>7.3f')} {fmt(row['fla_o_rel_rms'], '>10.2e')} {fmt(row['fla_state_rel_rms'], '>10.2e')}")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()

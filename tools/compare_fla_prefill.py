#!/usr/bin/env python3
"""Compare deltakv's CUDA GDN prefill with FLA's chunk_gated_delta_rule, same GPU, same call.

Two parts:
  speed     reads deltakv's records (`deltakv bench gdn --device cuda --json DK.json`), times
            FLA's chunk_gated_delta_rule at the same shapes (bf16, l2 norm in the kernel,
            initial and final state) with triton.testing.do_bench_cudagraph (kernel time, as
            deltakv's CUDA-graph timing), prints the ratios, writes a CSV and, when matplotlib is
            importable, a plot of time against sequence length.
  accuracy  draws inputs, writes them as safetensors, runs `deltakv gdn --device cuda` on them
            and FLA on the same tensors, and prints both errors against an f64 recurrence
            (rel_rms of o and final_state), at odd shapes, varlen, and T = 4k against T = 128k
            (drift).

Usage (on the GPU machine, FLA importable):
    python3 tools/compare_fla_prefill.py --deltakv-json DK.json --deltakv-bin .carry/deltakv \
        [--csv OUT.csv] [--plot OUT.png] [--skip-accuracy | --skip-speed]
"""

import argparse
import csv
import json
import time
import os
import struct
import subprocess
import sys
import tempfile

import torch
import triton

DTYPES = {torch.bfloat16: "BF16", torch.float32: "F32", torch.int32: "I32", torch.int64: "I64"}
FROM_NAME = {v: k for k, v in DTYPES.items()}


def save_safetensors(path, tensors, metadata):
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        raw = t.view(torch.uint8).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        dtype = FROM_NAME[info["dtype"]]
        buf = bytearray(data[a:b])
        out[name] = torch.frombuffer(buf, dtype=dtype).reshape(info["shape"]).clone()
    return out


def rel_rms(x, ref):
    x, ref = x.double(), ref.double()
    return ((x - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()


def reference(q, k, v, g, beta, state, scale):
    """The GDN recurrence in f64 for one sequence ([1, T, ...]; l2 norm on q and k)."""
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    state = state.double().clone()
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    group = v.shape[2] // q.shape[2]
    q, k = q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)
    outs = []
    for t in range(q.shape[1]):
        state = state * torch.exp(g[:, t])[..., None, None]
        v_new = beta[:, t][..., None] * (v[:, t] - torch.einsum("bhk,bhkv->bhv", k[:, t], state))
        state = state + torch.einsum("bhk,bhv->bhkv", k[:, t], v_new)
        outs.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, t], state))
    return torch.stack(outs, 1), state


def draw(batch, tokens, key_heads, value_heads, dim, seed):
    """Inputs like deltakv's benchmark: raw q/k (normalised in the kernel), Qwen3-Next-like
    gates (g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)), a random initial state."""
    g_ = torch.Generator(device="cuda").manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, device="cuda", generator=g_)
    q = rnd(batch, tokens, key_heads, dim).bfloat16()
    k = rnd(batch, tokens, key_heads, dim).bfloat16()
    v = rnd(batch, tokens, value_heads, dim).bfloat16()
    a_log = torch.empty(value_heads, device="cuda").uniform_(0.0, 2.5, generator=g_)
    dt_bias = torch.empty(value_heads, device="cuda").uniform_(-5.0, -1.0, generator=g_)
    g = -torch.exp(a_log) * torch.nn.functional.softplus(rnd(batch, tokens, value_heads) + dt_bias)
    beta = torch.sigmoid(rnd(batch, tokens, value_heads))
    return q, k, v, g.float(), beta.float()


def fla_call(q, k, v, g, beta, state, cu_seqlens=None):
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    return chunk_gated_delta_rule(
        q, k, v, g, beta, scale=q.shape[-1] ** -0.5, initial_state=state,
        output_final_state=True, cu_seqlens=cu_seqlens, use_qk_l2norm_in_kernel=True)


def flashinfer_ms(q, k, v, g, beta, state):
    """FlashInfer 0.7's chunk_gated_delta_rule on the same inputs, timed like FLA: packed
    varlen [B*T, heads, D] with cu_seqlens, the forget gate as alpha = exp(g), the state
    [N, H, V, K] (its transpose of FLA's; only the layout differs), the output and final
    state preallocated (it requires the latter)."""
    from flashinfer.gdn_prefill import chunk_gated_delta_rule as fi_chunk
    b, t = q.shape[0], q.shape[1]
    packed = lambda x: x.reshape(b * t, *x.shape[2:]).contiguous()
    fq, fk, fv = packed(q), packed(k), packed(v)
    alpha, fbeta = packed(torch.exp(g)), packed(beta)
    cu = torch.arange(0, (b + 1) * t, t, device="cuda", dtype=torch.int32)
    h0 = state.transpose(-1, -2).contiguous()
    out = torch.empty_like(fv)
    out_state = torch.empty_like(h0)
    call = lambda: fi_chunk(fq, fk, fv, alpha, fbeta, scale=q.shape[-1] ** -0.5, initial_state=h0,
                            output_final_state=True, cu_seqlens=cu, use_qk_l2norm_in_kernel=True,
                            output=out, output_state=out_state)
    call()
    torch.cuda.synchronize()
    try:
        return triton.testing.do_bench_cudagraph(call, rep=300, return_mode="median")
    except Exception:  # a path that syncs with the host cannot be captured
        return triton.testing.do_bench(call, rep=300, return_mode="median")


def speed(args):
    with open(args.deltakv_json) as f:
        records = [r for r in json.load(f) if r.get("op") == "gdn_prefill" and r.get("device") == "cuda"]
    if not records:
        sys.exit("error: no CUDA gdn_prefill records in " + args.deltakv_json)
    print(f"GPU: {torch.cuda.get_device_name()}; FLA chunk_gated_delta_rule, do_bench_cudagraph median "
          "(do_bench where graph capture fails)")
    rows = []
    for r in records:
        b, t, hg, h, kd = r["B"], r["T"], r["Hg"], r["H"], r["K"]
        q, k, v, g, beta = draw(b, t, hg, h, kd, 0)
        state = 0.3 * torch.randn(b, h, kd, r["V"], device="cuda")
        call = lambda: fla_call(q, k, v, g, beta, state)
        call()
        torch.cuda.synchronize()
        try:
            ms, how = triton.testing.do_bench_cudagraph(call, rep=300, return_mode="median"), "graph"
        except Exception:  # FLA paths that sync with the host cannot be captured
            ms, how = triton.testing.do_bench(call, rep=300, return_mode="median"), "eager"
        # The whole call as a Python user pays it (launches, allocations, the wait), host-timed
        # like deltakv's "whole call": the median of 10 calls after the warm ones above.
        walls = []
        for _ in range(10):
            torch.cuda.synchronize()
            start = time.perf_counter()
            call()
            torch.cuda.synchronize()
            walls.append((time.perf_counter() - start) * 1e3)
        walls.sort()
        fi_ms = flashinfer_ms(q, k, v, g, beta, state) if args.flashinfer else None
        rows.append({"shape": r["shape"], "B": b, "T": t, "Hg": hg, "H": h, "K": kd, "V": r["V"],
                     "deltakv_ms": r["median_ms"], "fla_ms": ms, "fla_timing": how,
                     "fla_over_deltakv": ms / r["median_ms"], "segments": r.get("segments"),
                     "deltakv_call_ms": r.get("whole_call_ms"), "fla_call_ms": (walls[4] + walls[5]) / 2,
                     "flashinfer_ms": fi_ms})
        del q, k, v, g, beta, state
        torch.cuda.empty_cache()
    # FlashInfer's kernel time (CUDA graphs, as FLA's) sits beside FLA's, before the host-timed
    # whole calls of deltakv and FLA.
    fi_head = f" {'FlashInfer ms':>13} {'FI/dk':>6}" if args.flashinfer else ""
    print(f"{'shape':<12} {'B':>2} {'T':>6} {'Hg':>3} {'H':>3} {'deltakv ms':>11} {'FLA ms':>9} {'FLA/dk':>7}"
          f"{fi_head} {'seg':>4}  whole call: {'dk ms':>7} {'FLA ms':>7}")
    for row in rows:
        fi = (f" {row['flashinfer_ms']:>13.3f} {row['flashinfer_ms'] / row['deltakv_ms']:>5.2f}x"
              if row['flashinfer_ms'] is not None else "")
        print(f"{row['shape']:<12} {row['B']:>2} {row['T']:>6} {row['Hg']:>3} {row['H']:>3} "
              f"{row['deltakv_ms']:>11.3f} {row['fla_ms']:>9.3f} {row['fla_over_deltakv']:>7.2f}x{fi} "
              f"{row['segments']!s:>4} ({row['fla_timing']})  {row['deltakv_call_ms'] or float('nan'):>7.3f} "
              f"{row['fla_call_ms']:>7.3f}")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
            writer.writeheader()
            writer.writerows(rows)
    if args.plot:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("plot skipped: matplotlib is not installed here")
            return
        sweep = sorted((r for r in rows if r["shape"] == "qwen3-next" and r["B"] == 1), key=lambda r: r["T"])
        seen = {}
        for r in sweep:
            seen[r["T"]] = r
        ts = sorted(seen)
        plt.figure(figsize=(6, 4))
        plt.loglog(ts, [seen[t]["deltakv_ms"] for t in ts], "o-", label="deltakv (CUDA)")
        plt.loglog(ts, [seen[t]["fla_ms"] for t in ts], "s-", label="FLA chunk_gated_delta_rule")
        plt.xlabel("sequence length T (B = 1, Hg 16, H 32, K = V = 128)")
        plt.ylabel("GPU time per call (ms)")
        plt.title(torch.cuda.get_device_name())
        plt.grid(True, which="both", alpha=0.3)
        plt.legend()
        plt.tight_layout()
        plt.savefig(args.plot, dpi=120)
        print(f"wrote {args.plot}")


def accuracy(args):
    cases = [  # (name, seq_lens, Hg, H, K=V)
        ("T=4096 Hg16 H32", [4096], 16, 32, 128),
        ("T=1000 Hg2 H6", [1000], 2, 6, 128),
        ("varlen 1,63,65,1000", [1, 63, 65, 1000], 2, 4, 128),
        ("drift T=4096 Hg1 H2", [4096], 1, 2, 128),
        ("drift T=131072 Hg1 H2", [131072], 1, 2, 128),
    ]
    print("errors against an f64 recurrence (rel_rms), the same bf16 inputs for both")
    print(f"{'case':<24} {'dk o':>9} {'dk state':>9} {'FLA o':>9} {'FLA state':>9}")
    tmp = tempfile.mkdtemp()
    for i, (name, lens, hg, h, d) in enumerate(cases):
        total = sum(lens)
        q, k, v, g, beta = draw(1, total, hg, h, d, 100 + i)
        n = len(lens)
        state = 0.3 * torch.randn(n, h, d, d, device="cuda")
        cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), device="cuda", dtype=torch.int32)
        o_ref, s_ref, start = [], [], 0
        for j, length in enumerate(lens):
            sl = slice(start, start + length)
            o_j, s_j = reference(q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], state[j:j + 1], d ** -0.5)
            o_ref.append(o_j)
            s_ref.append(s_j)
            start += length
        o_ref, s_ref = torch.cat(o_ref, 1), torch.cat(s_ref, 0)
        fo, fs = fla_call(q, k, v, g, beta, state, cu_seqlens=cu.long() if n > 1 else None)
        tensors = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "initial_state": state}
        if n > 1:
            tensors["cu_seqlens"] = cu
        inp, outp = os.path.join(tmp, f"in{i}.safetensors"), os.path.join(tmp, f"out{i}.safetensors")
        save_safetensors(inp, tensors, {"use_qk_l2norm": "true"})
        run = subprocess.run([args.deltakv_bin, "gdn", "--device", "cuda", "--input", inp, "--output", outp],
                             capture_output=True, text=True)
        if run.returncode != 0:
            print(f"{name:<24} deltakv failed: {run.stderr.strip()}")
            continue
        out = load_safetensors(outp)
        print(f"{name:<24} {rel_rms(out['o'].float(), o_ref.cpu()):>9.2e} {rel_rms(out['final_state'], s_ref.cpu()):>9.2e} "
              f"{rel_rms(fo.float(), o_ref):>9.2e} {rel_rms(fs, s_ref):>9.2e}")
        os.remove(inp)
        os.remove(outp)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deltakv-json", required=True)
    parser.add_argument("--deltakv-bin", default=".carry/deltakv")
    parser.add_argument("--csv")
    parser.add_argument("--plot")
    parser.add_argument("--skip-accuracy", action="store_true")
    parser.add_argument("--skip-speed", action="store_true", help="only the accuracy part")
    parser.add_argument("--flashinfer", action="store_true",
                        help="also time FlashInfer 0.7's chunk_gated_delta_rule (importable from PYTHONPATH)")
    args = parser.parse_args()
    if not args.skip_speed:
        speed(args)
    if not args.skip_accuracy:
        accuracy(args)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Compare deltakv's CUDA decode attention over the compressed paged cache with torch's
scaled_dot_product_attention over a bf16 cache, same GPU, same call.

For each shape (B sequences of `context` cached tokens, Hq query heads, Hkv KV heads, head dim
d, one new query per sequence) it runs `deltakv bench kv --device cuda` (CUDA-graph timing,
GPU time per launch) and times SDPA on the same shape with a CUDA graph too (bf16 q, k, v,
GQA through `enable_gqa`), plus torch's device-to-device copy of 1 GiB. It prints one table
with the times, the bytes each must read, the achieved bandwidth, the share of the copy's, the
speedups, and the issue's targets (>= 3.5x SDPA at B 8 x 32k, >= 3x at B 1 x 128k, >= 70% of
copy bandwidth, encode >= 1.5 TB/s of bf16 input).

Usage (on the GPU machine, torch importable):
    python3 tools/compare_sdpa.py --deltakv .carry/deltakv [--shapes 8x32768,1x131072]
        [--hq 32 --hkv 8 --dim 128 --bits-k 4 --bits-v 2] [--json-dir DIR] [--csv OUT.csv]
"""

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

TARGETS = {(8, 32768): 3.5, (1, 131072): 3.0}


def graph_us(fn, per_graph=20, samples=30):
    """Median GPU microseconds per call of `fn`, from replays of a CUDA graph holding
    `per_graph` calls back to back (as deltakv's `median_graph_us`)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(per_graph):
            fn()
    for _ in range(2):
        graph.replay()
    times = []
    for _ in range(samples):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / per_graph)
    times.sort()
    return times[len(times) // 2]


def copy_tb_s():
    """torch's device-to-device copy of 1 GiB: TB/s counting bytes read plus written."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = graph_us(lambda: dst.copy_(src), per_graph=5, samples=20)
    return 2 * src.numel() / (us * 1e-6) / 1e12


def sdpa_us(batch, context, hq, hkv, dim):
    """SDPA decode over a bf16 cache: q [B, Hq, 1, d], k, v [B, Hkv, context, d]."""
    torch.manual_seed(0)
    q = torch.randn(batch, hq, 1, dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, hkv, context, dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(batch, hkv, context, dim, device="cuda", dtype=torch.bfloat16)
    try:
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        fn = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
    except TypeError:
        # torch < 2.5: no enable_gqa; the heads are expanded once, outside the timed call, so
        # SDPA reads Hq / Hkv times the bytes (reported as such).
        k = k.repeat_interleave(hq // hkv, dim=1)
        v = v.repeat_interleave(hq // hkv, dim=1)
        fn = lambda: F.scaled_dot_product_attention(q, k, v)  # noqa: E731
    us = graph_us(fn)
    return us, 2 * k.numel() * k.element_size()


def run_deltakv(binary, batch, context, args, json_dir):
    path = os.path.join(json_dir, f"deltakv-kv-b{batch}-ctx{context}.json")
    command = [
        binary, "bench", "kv", "--device", "cuda", "--batch", str(batch),
        "--contexts", str(context), "--hq", str(args.hq), "--hkv", str(args.hkv),
        "--dim", str(args.dim), "--bits-k", str(args.bits_k), "--bits-v", str(args.bits_v),
        "--json", path,
    ]
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True)
    with open(path) as f:
        return json.load(f)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--deltakv", required=True, help="the deltakv binary (built with --features cuda)")
    p.add_argument("--shapes", default="8x32768,1x131072", help="BxCONTEXT,...")
    p.add_argument("--hq", type=int, default=32)
    p.add_argument("--hkv", type=int, default=8)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--bits-k", type=int, default=4)
    p.add_argument("--bits-v", type=int, default=2)
    p.add_argument("--json-dir", default=None, help="where deltakv's JSON records go")
    p.add_argument("--csv", default=None)
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("compare_sdpa: no CUDA device for torch")
    json_dir = args.json_dir or tempfile.mkdtemp()
    os.makedirs(json_dir, exist_ok=True)
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    torch_copy = copy_tb_s()
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}; torch copy {torch_copy:.2f} TB/s")
    rows = []
    encode = None
    for batch, context in shapes:
        records = run_deltakv(args.deltakv, batch, context, args, json_dir)
        decode = next(r for r in records if r["op"] == "kv_decode_attention")
        encode = next((r for r in records if r["op"] == "kv_encode"), encode)
        copy = next(r for r in records if r["op"] == "copy")
        s_us, s_bytes = sdpa_us(batch, context, args.hq, args.hkv, args.dim)
        speedup = s_us / decode["us"]
        share = decode["tb_s"] / copy["tb_s"]
        target = TARGETS.get((batch, context))
        rows.append({
            "B": batch, "context": context, "Hq": args.hq, "Hkv": args.hkv, "D": args.dim,
            "bits": f"{args.bits_k}/{args.bits_v}",
            "sdpa_us": round(s_us, 2), "sdpa_bytes": s_bytes,
            "sdpa_tb_s": round(s_bytes / (s_us * 1e-6) / 1e12, 3),
            "deltakv_us": round(decode["us"], 2), "deltakv_bytes": decode["bytes_read"],
            "deltakv_tb_s": round(decode["tb_s"], 3), "copy_tb_s": round(copy["tb_s"], 3),
            "share_of_copy": round(share, 3), "speedup_vs_sdpa": round(speedup, 3),
            "splits": decode["splits"],
            "speedup_target": target or "",
            "speedup_ok": "" if target is None else speedup >= target,
            "bandwidth_ok": share >= 0.70,
        })
    print()
    print(f"decode attention, Hq {args.hq} Hkv {args.hkv} d {args.dim}; deltakv {args.bits_k}/{args.bits_v}-bit "
          "codes + f32 norms vs SDPA over bf16 (both CUDA-graph timed, median GPU us per call)")
    print(f"{'B':>3} {'context':>8} {'SDPA us':>9} {'SDPA TB/s':>9} {'deltakv us':>10} {'TB/s':>6} "
          f"{'of copy':>7} {'speedup':>8} {'target':>7}")
    for r in rows:
        verdict = "" if r["speedup_target"] == "" else ("PASS" if r["speedup_ok"] else "FAIL")
        print(f"{r['B']:>3} {r['context']:>8} {r['sdpa_us']:>9.1f} {r['sdpa_tb_s']:>9.2f} "
              f"{r['deltakv_us']:>10.1f} {r['deltakv_tb_s']:>6.2f} {100 * r['share_of_copy']:>6.0f}% "
              f"{r['speedup_vs_sdpa']:>7.2f}x {verdict:>4} ({r['speedup_target']}x), "
              f"bandwidth {'PASS' if r['bandwidth_ok'] else 'FAIL'} (>= 70% of copy)")
    if encode:
        ok = encode["tb_s"] >= 1.5
        print(f"encode B={encode['B']} x {encode['tokens']} tokens, Hkv {encode['Hkv']} d {encode['D']}: "
              f"{encode['us']:.1f} us, {encode['tb_s']:.2f} TB/s of bf16 input "
              f"{'PASS' if ok else 'FAIL'} (>= 1.5 TB/s)")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
            writer.writeheader()
            writer.writerows(rows)
        print(f"wrote {args.csv}")


if __name__ == "__main__":
    main()

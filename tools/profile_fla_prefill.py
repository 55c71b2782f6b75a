#!/usr/bin/env python3
"""Per-kernel GPU time of FLA's chunk_gated_delta_rule (torch.profiler, CUPTI), to compare its
split with deltakv's kernels (whose per-kernel times come from ncu).

Usage (on the GPU machine, FLA importable):
    python3 tools/profile_fla_prefill.py [--shapes B:T:Hg:H,...] [--calls N]
Prints, per shape, each kernel's mean GPU time per call and its share.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_fla_prefill import draw, fla_call  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="1:16384:16:32,1:65536:2:8,1:4096:16:32")
    ap.add_argument("--calls", type=int, default=10)
    args = ap.parse_args()
    for shape in args.shapes.split(","):
        batch, tokens, key_heads, value_heads = (int(x) for x in shape.split(":"))
        q, k, v, g, beta = draw(batch, tokens, key_heads, value_heads, 128, 7)
        state = torch.randn(batch, value_heads, 128, 128, device="cuda")
        for _ in range(3):
            fla_call(q, k, v, g, beta, state)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(args.calls):
                fla_call(q, k, v, g, beta, state)
            torch.cuda.synchronize()
        rows = [(e.key, e.device_time_total / args.calls) for e in prof.key_averages()
                if e.device_time_total > 0]
        rows.sort(key=lambda r: -r[1])
        total = sum(t for _, t in rows)
        print(f"== FLA B{batch} T{tokens} Hg{key_heads} H{value_heads}: {total:.1f} us of kernels per call")
        for name, t in rows:
            print(f"  {t:9.1f} us  {100 * t / total:5.1f}%  {name[:90]}")


if __name__ == "__main__":
    main()

//! `deltakv bench kv --device wgpu`: the paged compressed cache on the wgpu device. Each figure
//! is the median device time per dispatch over samples of back-to-back dispatches in one
//! submission, timed from submission to idle (`deltakv::wgpu::timing`), beside wgpu's own
//! buffer copy measured in the same run:
//!
//! * copy: back-to-back 256 MiB copies, the better of a vec4 copy shader and
//!   `copy_buffer_to_buffer`; TB/s counts the bytes read plus the bytes
//!   written.
//! * encode: `ENCODE_B x ENCODE_T` new bf16 tokens (K and V, every KV head) encoded into their
//!   pages; TB/s counts the bf16 input read.
//! * decode: one query per sequence (Hq heads) over `context` cached tokens per sequence;
//!   TB/s counts the codes and norms the shaders must read (every cached token's K and V), and
//!   `of copy` compares that rate with the copy's. At the longest context, other split counts
//!   too.

use super::kv::KvBenchArgs;
use deltakv::kv::{KvScheme, PagedLayout};
use deltakv::rng::Rng;
use deltakv::wgpu::kv::{WgpuAttnOptions, WgpuPagedKvCache, prepare_attend};
use deltakv::wgpu::timing::{copy_rates, median_dispatch_us};
use deltakv::wgpu::{Wgpu, WgpuTensor};
use deltakv::{DType, HostTensor, Result};
use serde_json::json;

/// Sequences and tokens per sequence of the timed encode (the CUDA bench's 8 x 8192).
const ENCODE_B: usize = 8;
const ENCODE_T: usize = 8192;
/// Tokens per append while filling a cache.
const FILL: usize = 4096;
const PAGE: usize = 64;

fn random_bf16(wgpu: &Wgpu, shape: Vec<usize>, rng: &mut Rng) -> Result<WgpuTensor> {
    let n = shape.iter().product();
    WgpuTensor::upload(
        wgpu,
        &HostTensor::from_f32_as(shape, &rng.normal_vec(n, 1.0), DType::BF16)?,
    )
}

/// Times the copy, the encode and decode at each context; returns the table lines.
pub fn run(args: &KvBenchArgs, records: &mut Vec<serde_json::Value>) -> Result<Vec<String>> {
    let wgpu = Wgpu::get()?;
    let (b, hq, hkv, d) = (args.batch, args.hq, args.hkv, args.dim);
    let scheme = KvScheme::new(d, hkv, args.bits_k, args.bits_v);
    let layout = PagedLayout::new(scheme, PAGE)?;
    let mut rng = Rng::new(7);
    let mut lines = vec![format!(
        "KV on wgpu ({}): {}/{}-bit codes + f32 norms, pages of {PAGE} tokens; median device time per dispatch over batches of back-to-back dispatches",
        wgpu.describe(),
        args.bits_k,
        args.bits_v
    )];

    let rates = copy_rates(wgpu, 256 << 20)?;
    let copy_tb_s = rates.best();
    lines.push(format!(
        "copy        256 MiB buffer to buffer on wgpu {copy_tb_s:>6.3} TB/s (read + write; the better of a vec4 copy shader, {:.3}, and copy_buffer_to_buffer, {:.3})",
        rates.shader, rates.buffer
    ));
    records.push(
        json!({"op": "copy", "device": "wgpu", "adapter": wgpu.name(), "tb_s": copy_tb_s,
        "shader_tb_s": rates.shader, "buffer_tb_s": rates.buffer}),
    );

    // Encode: ENCODE_B x ENCODE_T bf16 tokens into a fresh cache.
    let pages = layout.pages_for(ENCODE_T);
    let mut fresh = WgpuPagedKvCache::new(wgpu, layout, ENCODE_B, pages, ENCODE_B * pages)?;
    let k = random_bf16(wgpu, vec![ENCODE_B, ENCODE_T, hkv, d], &mut rng)?;
    let v = random_bf16(wgpu, vec![ENCODE_B, ENCODE_T, hkv, d], &mut rng)?;
    let encode = fresh
        .prepare_append(wgpu, &k, &v, &[ENCODE_T; ENCODE_B])?
        .ok_or_else(|| deltakv::Error::InvalidValue("no tokens to encode".into()))?;
    let encode_us = median_dispatch_us(wgpu, 3, 7, |n| encode.submit(wgpu, n))?;
    let input_bytes = 2 * ENCODE_B * ENCODE_T * hkv * d * 2;
    let encode_tb_s = input_bytes as f64 / (encode_us * 1e-6) / 1e12;
    lines.push(format!(
        "encode      B={ENCODE_B} T={ENCODE_T} Hkv={hkv} D={d} bf16 {encode_us:>10.1} us {encode_tb_s:>6.3} TB/s of bf16 input ({:.1} M tokens/s)",
        (ENCODE_B * ENCODE_T) as f64 / encode_us
    ));
    records.push(json!({
        "op": "kv_encode", "device": "wgpu", "adapter": wgpu.name(), "B": ENCODE_B,
        "tokens": ENCODE_T, "Hkv": hkv, "D": d, "bits_k": args.bits_k, "bits_v": args.bits_v,
        "us": encode_us, "input_bytes": input_bytes, "tb_s": encode_tb_s,
    }));
    drop((encode, fresh, k, v));

    // Decode at each context, the cache grown chunk by chunk (one random chunk appended again
    // and again: the timing does not depend on the values).
    let mut contexts = args.contexts.clone();
    contexts.sort_unstable();
    let longest = *contexts.last().unwrap_or(&0);
    let max_pages = layout.pages_for(longest);
    let mut cache = WgpuPagedKvCache::new(wgpu, layout, b, max_pages, b * max_pages)?;
    let fill_k = random_bf16(wgpu, vec![b, FILL, hkv, d], &mut rng)?;
    let fill_v = random_bf16(wgpu, vec![b, FILL, hkv, d], &mut rng)?;
    let q = WgpuTensor::upload(
        wgpu,
        &HostTensor::from_f32(vec![b, 1, hq, d], rng.normal_vec(b * hq * d, 1.0))?,
    )?;
    let mut filled = 0;
    for &ctx in &contexts {
        while filled < ctx {
            let n = FILL.min(ctx - filled);
            cache.append_unchecked(wgpu, &fill_k, &fill_v, &vec![n; b])?;
            filled += n;
        }
        wgpu.synchronize()?;
        let read = b * ctx * hkv * scheme.bytes_per_token_head();
        let launch = prepare_attend(wgpu, &cache, &q, None, &WgpuAttnOptions::default())?;
        let us = median_dispatch_us(wgpu, 20, 15, |n| launch.submit(wgpu, n))?;
        let tb_s = read as f64 / (us * 1e-6) / 1e12;
        lines.push(format!(
            "decode      B={b} ctx={ctx:<7} Hq={hq} Hkv={hkv} D={d} {us:>10.1} us {tb_s:>6.3} TB/s of codes + norms ({:.0}% of copy), {} splits",
            100.0 * tb_s / copy_tb_s,
            launch.splits(),
        ));
        records.push(json!({
            "op": "kv_decode_attention", "device": "wgpu", "adapter": wgpu.name(), "B": b,
            "context": ctx, "Hq": hq, "Hkv": hkv, "D": d, "bits_k": args.bits_k,
            "bits_v": args.bits_v, "us": us, "bytes_read": read, "tb_s": tb_s,
            "copy_tb_s": copy_tb_s, "splits": launch.splits(),
        }));
        if ctx == longest {
            // The same call with other splits of each sequence (the default aims at about
            // 256 workgroups), to show where the split count lands.
            let default_splits = launch.splits();
            drop(launch);
            let mut timed = Vec::new();
            for splits in [default_splits / 4, default_splits / 2, 2 * default_splits] {
                let options = WgpuAttnOptions {
                    splits: Some(splits.max(1)),
                    ..Default::default()
                };
                let launch = prepare_attend(wgpu, &cache, &q, None, &options)?;
                if launch.splits() == default_splits || timed.contains(&launch.splits()) {
                    continue;
                }
                let us = median_dispatch_us(wgpu, 20, 15, |n| launch.submit(wgpu, n))?;
                timed.push(launch.splits());
                lines.push(format!(
                    "            {} splits: {us:.1} us {:.3} TB/s",
                    launch.splits(),
                    read as f64 / (us * 1e-6) / 1e12,
                ));
            }
        }
    }
    Ok(lines)
}

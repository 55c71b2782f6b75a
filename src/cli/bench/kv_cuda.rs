//! `deltakv bench kv --device cuda`: the paged compressed cache on the GPU. Each figure is the
//! median GPU time per launch over CUDA-graph replays (CUDA events; no host overhead), beside
//! the GPU's device-to-device copy measured in the same run:
//!
//! * copy: a 1 GiB device-to-device copy; TB/s counts the bytes read plus the bytes written.
//! * encode: `ENCODE_B x ENCODE_T` new bf16 tokens (K and V, every KV head) encoded into their
//!   pages; TB/s counts the bf16 input read.
//! * decode: one query per sequence (Hq heads) over `context` cached tokens per sequence;
//!   TB/s counts the codes and norms the kernel must read (every cached token's K and V), and
//!   `of copy` compares that rate with the copy's.

use super::kv::KvBenchArgs;
use deltakv::cuda::kv::{AttnKernel, CudaAttnOptions, CudaPagedKvCache, prepare_attend};
use deltakv::cuda::timing::{median_copy_us, median_graph_us};
use deltakv::cuda::{Cuda, CudaTensor};
use deltakv::kv::{KvScheme, PagedLayout};
use deltakv::rng::Rng;
use deltakv::{DType, HostTensor, Result};
use serde_json::json;

/// Sequences and tokens per sequence of the timed encode (the 8 x 8192).
const ENCODE_B: usize = 8;
const ENCODE_T: usize = 8192;
/// Tokens per append while filling a cache.
const FILL: usize = 4096;
const PAGE: usize = 64;

fn random_bf16(cuda: &Cuda, shape: Vec<usize>, rng: &mut Rng) -> Result<CudaTensor> {
    let n = shape.iter().product();
    CudaTensor::upload(
        cuda,
        &HostTensor::from_f32_as(shape, &rng.normal_vec(n, 1.0), DType::BF16)?,
    )
}

/// Times the copy, the encode and decode at each context; returns the table lines.
pub fn run(args: &KvBenchArgs, records: &mut Vec<serde_json::Value>) -> Result<Vec<String>> {
    let cuda = Cuda::get()?;
    let (b, hq, hkv, d) = (args.batch, args.hq, args.hkv, args.dim);
    let scheme = KvScheme::new(d, hkv, args.bits_k, args.bits_v);
    let layout = PagedLayout::new(scheme, PAGE)?;
    let mut rng = Rng::new(7);
    let mut lines = vec![format!(
        "KV on cuda ({}, {}): {}/{}-bit codes + f32 norms, pages of {PAGE} tokens; median GPU time per launch over CUDA-graph replays",
        cuda.name(),
        cuda.arch(),
        args.bits_k,
        args.bits_v
    )];

    // Copy bandwidth, the floor.
    let len = 1usize << 30;
    let copy_us = median_copy_us(cuda, len)?;
    let copy_tb_s = 2.0 * len as f64 / (copy_us * 1e-6) / 1e12;
    lines.push(format!(
        "copy        {:>5} MiB device to device {copy_us:>10.1} us {copy_tb_s:>6.2} TB/s (read + write)",
        len >> 20
    ));
    records.push(
        json!({"op": "copy", "device": "cuda", "bytes": len, "us": copy_us, "tb_s": copy_tb_s}),
    );

    // Encode: ENCODE_B x ENCODE_T bf16 tokens into a fresh cache.
    let pages = layout.pages_for(ENCODE_T);
    let mut fresh = CudaPagedKvCache::new(cuda, layout, ENCODE_B, pages, ENCODE_B * pages)?;
    let k = random_bf16(cuda, vec![ENCODE_B, ENCODE_T, hkv, d], &mut rng)?;
    let v = random_bf16(cuda, vec![ENCODE_B, ENCODE_T, hkv, d], &mut rng)?;
    let encode = fresh
        .prepare_append(cuda, &k, &v, &[ENCODE_T; ENCODE_B])?
        .expect("tokens to encode");
    // SAFETY: the cache and the chunks live through the timing, and nothing else appends to
    // the cache or changes its table (each replay writes the same tokens again).
    let encode_us = median_graph_us(cuda, 5, 20, || unsafe { encode.launch(cuda) })?;
    let input_bytes = 2 * ENCODE_B * ENCODE_T * hkv * d * 2;
    let encode_tb_s = input_bytes as f64 / (encode_us * 1e-6) / 1e12;
    lines.push(format!(
        "encode      B={ENCODE_B} T={ENCODE_T} Hkv={hkv} D={d} bf16 {encode_us:>10.1} us {encode_tb_s:>6.2} TB/s of bf16 input ({:.0} M tokens/s)",
        (ENCODE_B * ENCODE_T) as f64 / encode_us
    ));
    records.push(json!({
        "op": "kv_encode", "device": "cuda", "B": ENCODE_B, "tokens": ENCODE_T, "Hkv": hkv, "D": d,
        "bits_k": args.bits_k, "bits_v": args.bits_v, "us": encode_us,
        "input_bytes": input_bytes, "tb_s": encode_tb_s,
    }));
    drop((encode, fresh, k, v));

    // Decode at each context, the cache grown chunk by chunk (one random chunk appended again
    // and again: the timing does not depend on the values).
    let mut contexts = args.contexts.clone();
    contexts.sort_unstable();
    let longest = *contexts.last().unwrap_or(&0);
    let max_pages = layout.pages_for(longest);
    let mut cache = CudaPagedKvCache::new(cuda, layout, b, max_pages, b * max_pages)?;
    let fill_k = random_bf16(cuda, vec![b, FILL, hkv, d], &mut rng)?;
    let fill_v = random_bf16(cuda, vec![b, FILL, hkv, d], &mut rng)?;
    let q = CudaTensor::upload(
        cuda,
        &HostTensor::from_f32(vec![b, 1, hq, d], rng.normal_vec(b * hq * d, 1.0))?,
    )?;
    let mut filled = 0;
    for &ctx in &contexts {
        while filled < ctx {
            let n = FILL.min(ctx - filled);
            cache.append_unchecked(cuda, &fill_k, &fill_v, &vec![n; b])?;
            filled += n;
        }
        cuda.synchronize()?;
        // The default kernel, then (where that is a tensor-core one) the other tensor-core
        // form and the scalar kernel for comparison, each recorded under its own op.
        let first = prepare_attend(cuda, &cache, &q, None, &CudaAttnOptions::default())?;
        let tensor_cores = !first.kernel_name().starts_with("kv_attend_rows");
        let default_name = first.kernel_name();
        let mut launches = vec![("kv_decode_attention", first)];
        if tensor_cores {
            for (op, kernel) in [
                ("kv_decode_attention_tiles", AttnKernel::Mma),
                ("kv_decode_attention_pages", AttnKernel::MmaPages),
                ("kv_decode_attention_scalar", AttnKernel::Scalar),
            ] {
                let options = CudaAttnOptions {
                    kernel,
                    ..CudaAttnOptions::default()
                };
                // A form whose ring does not fit this GPU is left out.
                if let Ok(launch) = prepare_attend(cuda, &cache, &q, None, &options)
                    && launch.kernel_name() != default_name
                {
                    launches.push((op, launch));
                }
            }
        }
        for (op, launch) in launches {
            // SAFETY: the cache and q live through this loop, the cache unchanged.
            let us = median_graph_us(cuda, 20, 30, || unsafe { launch.launch(cuda) })?;
            let read = b * ctx * hkv * scheme.bytes_per_token_head();
            let tb_s = read as f64 / (us * 1e-6) / 1e12;
            lines.push(format!(
                "decode      B={b} ctx={ctx:<7} Hq={hq} Hkv={hkv} D={d} {us:>10.1} us {tb_s:>6.2} TB/s of codes + norms ({:.0}% of copy), {} splits, {}",
                100.0 * tb_s / copy_tb_s,
                launch.splits(),
                launch.kernel_name()
            ));
            records.push(json!({
                "op": op, "device": "cuda", "B": b, "context": ctx, "Hq": hq,
                "Hkv": hkv, "D": d, "bits_k": args.bits_k, "bits_v": args.bits_v, "us": us,
                "bytes_read": read, "tb_s": tb_s, "copy_tb_s": copy_tb_s, "splits": launch.splits(),
                "kernel": launch.kernel_name(), "gpu": cuda.name(),
            }));
        }
    }
    Ok(lines)
}

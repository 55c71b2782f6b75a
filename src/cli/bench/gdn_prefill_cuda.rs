//! `deltakv bench gdn --device cuda` (prefill part): GPU time of one chunked prefill at the
//! shapes that serving engines run (bf16 q/k/v, l2 norm in the kernel, initial and final
//! state), each figure the median over replays of a CUDA graph of back-to-back calls, timed
//! with CUDA events (kernel time, no host launch overhead; FLA's side of
//! `tools/compare_fla.py` is timed the same way). Beside it, the whole call as an API user
//! pays it: validation, the call's tables and scratch, the launches and the wait for the
//! results, timed on the host (median of 10 calls after a warm one). With `--checkpoint-every
//! N`, the GPU time of the same call storing its state checkpoints too.

use super::gdn::PrefillShape;
use deltakv::cuda::gdn::{PrefillExtras, PrefillLaunch, PrefillStates};
use deltakv::cuda::timing::median_graph_us;
use deltakv::cuda::{Cuda, CudaTensor};
use deltakv::gdn::random::{GdnCase, GdnSpec};
use deltakv::gdn::{GdnInputs, GdnOptions};
use deltakv::{DType, HostTensor, Result};
use serde_json::json;

/// Times each shape on the GPU and returns the table lines; appends JSON records.
pub fn run(
    shapes: &[PrefillShape],
    checkpoint_every: Option<usize>,
    records: &mut Vec<serde_json::Value>,
) -> Result<Vec<String>> {
    let cuda = Cuda::get()?;
    let mut lines = vec![format!(
        "GDN prefill on cuda ({}, {}), bf16 q/k/v, l2 norm, initial + final state; median GPU time per call over CUDA-graph replays; whole call: host time of one API call to its results",
        cuda.name(),
        cuda.arch()
    )];
    let bar = super::progress(shapes.len());
    for &(name, batch, tokens, key_heads, value_heads, key_dim, value_dim) in shapes {
        bar.set_message(format!("{name} B={batch} T={tokens}"));
        let mut spec = GdnSpec::new(tokens, key_heads, value_heads, key_dim, value_dim);
        spec.batch = batch;
        spec.raw_qk = true;
        spec.with_initial_state = true;
        let case = GdnCase::random(&spec, 42)?;
        let up = |t: &HostTensor| CudaTensor::upload(cuda, t);
        let (q, k, v, g, beta) = (
            up(&case.q)?,
            up(&case.k)?,
            up(&case.v)?,
            up(&case.g)?,
            up(&case.beta)?,
        );
        let initial_state = case.initial_state.as_ref().map(up).transpose()?;
        let inputs = GdnInputs {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            beta: &beta,
            initial_state: initial_state.as_ref(),
            cu_seqlens: None,
        };
        let mut o = CudaTensor::zeros(cuda, case.v.shape().to_vec(), DType::BF16)?;
        let mut final_state = CudaTensor::zeros(
            cuda,
            vec![batch, value_heads, key_dim, value_dim],
            DType::F32,
        )?;
        let options = GdnOptions {
            scale: None,
            use_qk_l2norm: true,
        };
        // The call's launch with `extras` (the same inputs and outputs each time).
        let mut new_launch = |extras: PrefillExtras| {
            PrefillLaunch::new(
                cuda,
                &inputs,
                &options,
                &mut PrefillStates::Separate {
                    output_final_state: true,
                },
                &mut o,
                Some(&mut final_state),
                extras,
            )
        };
        let mut whole_call = || -> Result<(PrefillLaunch, f64)> {
            cuda.synchronize()?;
            let start = std::time::Instant::now();
            let launch = new_launch(PrefillExtras::default())?;
            // SAFETY: the inputs, o and final_state outlive every launch of this shape.
            unsafe { launch.launch(cuda) }?;
            cuda.synchronize()?;
            Ok((launch, start.elapsed().as_secs_f64() * 1e3))
        };
        let (launch, _) = whole_call()?;
        let mut call_ms = Vec::with_capacity(10);
        for _ in 0..10 {
            call_ms.push(whole_call()?.1);
        }
        call_ms.sort_by(f64::total_cmp);
        let call_ms = (call_ms[4] + call_ms[5]) / 2.0;
        // SAFETY: as above.
        let us = median_graph_us(cuda, 5, 20, || unsafe { launch.launch(cuda) })?;
        let ms = us / 1e3;
        let tokens_per_s = (batch * tokens) as f64 / (ms / 1e3);
        lines.push(format!(
            "{name:<12} B={batch:<2} T={tokens:<6} Hg={key_heads:<2} H={value_heads:<2} {ms:>9.3} ms {:>8.1} Mtok/s  segments {}  whole call {call_ms:.3} ms",
            tokens_per_s / 1e6,
            launch.segments()
        ));
        records.push(json!({
            "op": "gdn_prefill", "device": "cuda", "gpu": cuda.name(), "shape": name,
            "B": batch, "T": tokens, "Hg": key_heads, "H": value_heads, "K": key_dim,
            "V": value_dim, "dtype": "bf16", "use_qk_l2norm": true, "initial_state": true,
            "median_ms": ms, "whole_call_ms": call_ms, "tokens_per_s": tokens_per_s, "segments": launch.segments(),
        }));
        if let Some(every) = checkpoint_every {
            let launch = new_launch(PrefillExtras {
                checkpoint_every: Some(every),
                ..PrefillExtras::default()
            })?;
            // SAFETY: as above.
            let us = median_graph_us(cuda, 5, 20, || unsafe { launch.launch(cuda) })?;
            let with_ms = us / 1e3;
            lines.push(format!(
                "{:<12} with checkpoints every {every} tokens: {with_ms:>9.3} ms ({:+.1}%)  segments {}",
                "",
                100.0 * (with_ms / ms - 1.0),
                launch.segments()
            ));
            records.push(json!({
                "op": "gdn_prefill", "device": "cuda", "gpu": cuda.name(), "shape": name,
                "B": batch, "T": tokens, "Hg": key_heads, "H": value_heads, "K": key_dim,
                "V": value_dim, "dtype": "bf16", "use_qk_l2norm": true, "initial_state": true,
                "checkpoint_every": every, "median_ms": with_ms, "segments": launch.segments(),
            }));
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(lines)
}

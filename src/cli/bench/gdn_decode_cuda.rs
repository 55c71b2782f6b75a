//! `deltakv bench gdn --device cuda` (decode part): GPU time of one decode call at the
//! Qwen3-Next shape, the pool resident on the GPU and updated in place call after call. Each
//! figure is the median over replays of a CUDA graph of back-to-back launches, timed with CUDA
//! events (kernel time, no host launch overhead).
//!
//! `state TB/s` counts the pool bytes a call must move at least once (each addressed slot read
//! and written once); the H100's device-to-device copy runs at about 3.0 TB/s.

use deltakv::cuda::gdn::prepare_decode_launch;
use deltakv::cuda::timing::median_graph_us;
use deltakv::cuda::{Cuda, CudaTensor};
use deltakv::gdn::{DecodeTensors, GdnOptions};
use deltakv::{DType, Result};
use serde_json::json;

/// One timed configuration: (B, T, pool dtype, intermediate states).
pub type DecodeConfig = (usize, usize, DType, bool);

/// Times each configuration on the GPU and returns the table lines; appends JSON records.
pub fn run(
    shape: (&str, usize, usize, usize, usize),
    configs: &[DecodeConfig],
    records: &mut Vec<serde_json::Value>,
) -> Result<Vec<String>> {
    let cuda = Cuda::get()?;
    let (name, key_heads, value_heads, key_dim, value_dim) = shape;
    let mut lines = vec![format!(
        "GDN decode on cuda ({}, {}), bf16 q/k/v, fused gating, l2 norm, pool of B slots updated in place; median GPU time per call over CUDA-graph replays",
        cuda.name(),
        cuda.arch()
    )];
    for &(batch, tokens, pool_dtype, intermediate) in configs {
        let case = super::gdn_decode::bench_case(batch, tokens, pool_dtype)?;
        let uploaded = DecodeTensors::copied(&case.inputs()?, |t| CudaTensor::upload(cuda, t))?;
        let inputs = uploaded.inputs();
        let mut pool = CudaTensor::upload(cuda, &case.state_pool)?;
        let dims = [batch, tokens, value_heads];
        let mut o = CudaTensor::zeros(cuda, [&dims[..], &[value_dim]].concat(), DType::BF16)?;
        let mut states = if intermediate {
            Some(CudaTensor::zeros(
                cuda,
                [&dims[..], &[key_dim, value_dim]].concat(),
                DType::F32,
            )?)
        } else {
            None
        };
        let options = GdnOptions {
            scale: None,
            use_qk_l2norm: true,
        };
        let launch =
            prepare_decode_launch(cuda, &inputs, &mut pool, &options, &mut o, states.as_mut())?;
        let per_graph = if batch >= 64 { 20 } else { 100 };
        // SAFETY: every tensor of the launch lives through this loop body and the slot
        // indices are not written after the preparation.
        let us = median_graph_us(cuda, per_graph, 30, || unsafe { launch.launch(cuda) })?;
        let pool_bytes =
            (batch * value_heads * key_dim * value_dim * pool_dtype.size_in_bytes()) as f64;
        let state_tb_s = 2.0 * pool_bytes / (us * 1e-6) / 1e12;
        lines.push(format!(
            "{name:<12} B={batch:<4} T={tokens:<2} pool {pool_dtype:<4} {:<13} {us:>10.2} us/call {:>8.2} us/token {state_tb_s:>6.2} state TB/s",
            if intermediate { "+intermediate" } else { "" },
            us / tokens as f64
        ));
        records.push(json!({
            "op": "gdn_decode", "device": "cuda", "gpu": cuda.name(), "shape": name, "B": batch,
            "T": tokens, "Hg": key_heads, "H": value_heads, "K": key_dim, "V": value_dim,
            "dtype": "bf16", "pool_dtype": pool_dtype.to_string(),
            "intermediate_states": intermediate, "fused_gating": true, "use_qk_l2norm": true,
            "median_us": us, "launches_per_graph": per_graph, "state_tb_per_s": state_tb_s,
        }));
    }
    Ok(lines)
}

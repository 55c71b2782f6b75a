//! `deltakv bench gdn --device wgpu` (decode part): device time of one decode call at the
//! Qwen3-Next shape, the pool resident on the device and updated in place call after call.
//! Each figure is the median over samples of back-to-back dispatches in one submission, timed
//! from submission to idle (`deltakv::wgpu::timing`).
//!
//! After the table, the two decode kernels side by side at B = 1 and 256, f32 and bf16 pools
//! (`tile` lines, one per `DecodeTile::COMPARED`: `bands`, the default where V is a multiple of
//! 4, and `pairs`, the column-pair kernel of `recurrent.wgsl`).
//!
//! `state TB/s` counts the pool bytes a call must move at least once (each addressed slot read
//! and written once); the H100's device-to-device copy runs at about 3.0 TB/s.

use deltakv::gdn::decode::random::DecodeCase;
use deltakv::gdn::{DecodeTensors, GdnOptions};
use deltakv::wgpu::gdn::{DecodeTile, prepare_decode_launch_tiled};
use deltakv::wgpu::timing::{copy_rates, median_dispatch_us};
use deltakv::wgpu::{Wgpu, WgpuTensor};
use deltakv::{DType, Error, Result};
use serde_json::json;

/// Times each configuration on the device and returns the table lines; appends JSON records.
pub fn run(
    shape: (&str, usize, usize, usize, usize),
    configs: &[(usize, usize, DType, bool)],
    records: &mut Vec<serde_json::Value>,
) -> Result<Vec<String>> {
    let wgpu = Wgpu::get()?;
    let mut lines = vec![format!(
        "GDN decode on wgpu ({}), bf16 q/k/v, fused gating, l2 norm, pool of B slots updated in place; median device time per call over batches of back-to-back dispatches",
        wgpu.describe()
    )];
    let rates = copy_rates(wgpu, 256 << 20)?;
    let copy = rates.best();
    lines.push(format!(
        "device-to-device copy on wgpu: {copy:.3} TB/s (the better of a vec4 copy shader, {:.3}, and copy_buffer_to_buffer, {:.3}; 256 MiB buffers, bytes read + written)",
        rates.shader, rates.buffer
    ));
    records.push(
        json!({"op": "copy", "device": "wgpu", "adapter": wgpu.name(), "tb_per_s": copy,
        "shader_tb_per_s": rates.shader, "buffer_tb_per_s": rates.buffer}),
    );
    // The matrix units where the device has them (DELTAKV_WGPU_COOP=1; an experimental wgpu
    // path: a failure is reported on its line and the bench goes on).
    if wgpu.has_coop16() {
        match deltakv::wgpu::coop::peak_tflops(wgpu) {
            Ok(tflops) => {
                lines.push(format!(
                    "cooperative matrices on wgpu: {tflops:.1} TFLOP/s (16x16x16 f16 operands, f32 accumulation, constant operands in registers)"
                ));
                records.push(
                    json!({"op": "coop_peak", "device": "wgpu", "adapter": wgpu.name(),
                    "tflop_per_s": tflops}),
                );
            }
            Err(e) => lines.push(format!("cooperative matrices on wgpu: failed: {e}")),
        }
        // The state pass's product shape from memory, split into f16 halves (8192 entries).
        match deltakv::wgpu::coop::split_tflops(wgpu, 8192) {
            Ok(tflops) => {
                lines.push(format!(
                    "cooperative matrices on wgpu, 32x128 by 128x16 f32 products as f16 hi/lo in three steps from memory: {tflops:.1} TFLOP/s of f32 product"
                ));
                records.push(
                    json!({"op": "coop_split", "device": "wgpu", "adapter": wgpu.name(),
                    "tflop_per_s": tflops, "entries": 8192}),
                );
            }
            Err(e) => lines.push(format!("cooperative split products on wgpu: failed: {e}")),
        }
    }
    for &(batch, tokens, pool_dtype, intermediate) in configs {
        let config = (batch, tokens, pool_dtype, intermediate);
        let case = super::gdn_decode::bench_case(batch, tokens, pool_dtype)?;
        match time_config(shape, config, &case, DecodeTile::Auto, "") {
            Ok((line, record)) => {
                lines.push(line);
                records.push(record);
            }
            // A configuration the adapter cannot hold (its intermediate states beyond one
            // storage binding, say) gets its line, and the others go on.
            Err(Error::Unsupported(why)) => lines.push(format!(
                "{:<12} B={batch:<4} T={tokens:<2} pool {pool_dtype:<4}{}: not run: {why}",
                shape.0,
                if intermediate { " +intermediate" } else { "" }
            )),
            Err(e) => return Err(e),
        }
    }
    let compared = [(1, DType::F32), (256, DType::F32), (256, DType::BF16)];
    for (batch, pool_dtype) in compared
        .into_iter()
        .filter(|_| configs.iter().any(|c| c.0 == 256))
    {
        // The same inputs (a 512 MiB pool at B = 256, made once) for every tile.
        let case = super::gdn_decode::bench_case(batch, 1, pool_dtype)?;
        for tile in DecodeTile::COMPARED {
            let config = (batch, 1, pool_dtype, false);
            let label = format!("tile {}", tile.label());
            let (line, mut record) = time_config(shape, config, &case, tile, &label)?;
            record["tile"] = json!(label);
            lines.push(line);
            records.push(record);
        }
    }
    Ok(lines)
}

/// Times one configuration (its inputs `case`) with `tile`; the table line (its label after the
/// pool) and the JSON record.
fn time_config(
    shape: (&str, usize, usize, usize, usize),
    (batch, tokens, pool_dtype, intermediate): (usize, usize, DType, bool),
    case: &DecodeCase,
    tile: DecodeTile,
    label: &str,
) -> Result<(String, serde_json::Value)> {
    let wgpu = Wgpu::get()?;
    let (name, key_heads, value_heads, key_dim, value_dim) = shape;
    let uploaded = DecodeTensors::copied(&case.inputs()?, |t| WgpuTensor::upload(wgpu, t))?;
    let inputs = uploaded.inputs();
    let mut pool = WgpuTensor::upload(wgpu, &case.state_pool)?;
    let dims = [batch, tokens, value_heads];
    let mut o = WgpuTensor::zeros(wgpu, [&dims[..], &[value_dim]].concat(), DType::BF16)?;
    let mut states = if intermediate {
        Some(WgpuTensor::zeros(
            wgpu,
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
    let launch = prepare_decode_launch_tiled(
        wgpu,
        &inputs,
        &mut pool,
        &options,
        &mut o,
        states.as_mut(),
        tile,
    )?;
    let per_sample = if batch >= 64 { 20 } else { 100 };
    let us = median_dispatch_us(wgpu, per_sample, 15, |n| launch.submit(wgpu, n))?;
    let pool_bytes =
        (batch * value_heads * key_dim * value_dim * pool_dtype.size_in_bytes()) as f64;
    let state_tb_s = 2.0 * pool_bytes / (us * 1e-6) / 1e12;
    let label = if intermediate { "+intermediate" } else { label };
    let line = format!(
        "{name:<12} B={batch:<4} T={tokens:<2} pool {pool_dtype:<4} {label:<21} {us:>10.2} us/call {:>8.2} us/token {state_tb_s:>6.3} state TB/s",
        us / tokens as f64
    );
    let record = json!({
        "op": "gdn_decode", "device": "wgpu", "adapter": wgpu.name(), "shape": name,
        "B": batch, "T": tokens, "Hg": key_heads, "H": value_heads, "K": key_dim,
        "V": value_dim, "dtype": "bf16", "pool_dtype": pool_dtype.to_string(),
        "intermediate_states": intermediate, "fused_gating": true, "use_qk_l2norm": true,
        "median_us": us, "dispatches_per_sample": per_sample, "state_tb_per_s": state_tb_s,
    });
    Ok((line, record))
}

//! Cooperative matrices: wgpu's experimental `EXPERIMENTAL_COOPERATIVE_MATRIX`
//! (`VK_KHR_cooperative_matrix` on Vulkan), the matrix units (NVIDIA's tensor cores) that plain
//! WGSL cannot reach. The device asks for it only with `DELTAKV_WGPU_COOP=1` and where the
//! adapter reports a 16 x 16 x 16 configuration with f16 operands and f32 accumulation and
//! subgroups of 32 ([`Wgpu::has_coop16`]); Mesa's lavapipe has none, so CI translates these
//! shaders to SPIR-V with naga but runs them only on a GPU that has the configuration.
//!
//! [`matmul_tiles`] runs the probe kernel (`coop_probe.wgsl`): `C = A B` over a batch of
//! 16 x 16 tiles, which tells whether the path works on an adapter before kernels rely on it;
//! [`peak_tflops`] times the matrix units with operands in registers (`bench gdn --device
//! wgpu` prints it beside the copy rate); [`split_products`] runs the state pass's product
//! shape (32 x 128 by 128 x 16) to f32 accuracy with both operands split into f16 high and low
//! halves (the low one scaled by 2^11), three products per step, the numerics
//! `tools/coop-lab/emulate.py` found as accurate as f32 for the prefill.

use crate::Constants;
use crate::runtime::{ShaderSource, Wgpu, backend_error};
use crate::tensor::WgpuTensor;
use crate::timing::median_dispatch_us;
use deltakv_contract::{DType, Error, HostTensor, Result};
use half::f16;

/// The probe kernel.
pub const PROBE: ShaderSource = ShaderSource {
    name: "coop_probe",
    text: concat!(
        include_str!("coop_enable.wgsl"),
        include_str!("coop_probe.wgsl")
    ),
    entry_point: "coop_probe",
};

/// The throughput kernel (the same source's `coop_peak`).
pub const PEAK: ShaderSource = ShaderSource {
    name: "coop_peak",
    text: concat!(
        include_str!("coop_enable.wgsl"),
        include_str!("coop_probe.wgsl")
    ),
    entry_point: "coop_peak",
};

/// The split-operand product (`coop_split.wgsl`).
pub const SPLIT: ShaderSource = ShaderSource {
    name: "coop_split_product",
    text: concat!(
        include_str!("coop_enable.wgsl"),
        include_str!("coop_split_step.wgsl"),
        include_str!("coop_split.wgsl")
    ),
    entry_point: "coop_split_product",
};

/// The split-operand product from host-split halves in storage (`coop_split_storage.wgsl`).
pub const SPLIT_STORAGE: ShaderSource = ShaderSource {
    name: "coop_split_product_storage",
    text: concat!(
        include_str!("coop_enable.wgsl"),
        include_str!("coop_split_step.wgsl"),
        include_str!("coop_split_storage.wgsl")
    ),
    entry_point: "coop_split_product_storage",
};

/// Every cooperative-matrix shader with the sets of `override` constants its launcher uses
/// (each set one pipeline; translated to SPIR-V by a test; Metal's simdgroup matrices are
/// 8 x 8, so these have no Metal form).
pub const SHADERS: &[(ShaderSource, &[Constants])] = &[
    (PROBE, &[&[]]),
    (PEAK, &[&[]]),
    (SPLIT, &[&[]]),
    (SPLIT_STORAGE, &[&[]]),
    (
        crate::gdn::chunks::STATE_COOP,
        &[
            &[("STATE_KP4", 16.0), ("WALK", 0.0)],
            &[("STATE_KP4", 16.0), ("WALK", 1.0)],
            &[("STATE_KP4", 32.0), ("WALK", 0.0)],
            &[("STATE_KP4", 32.0), ("WALK", 1.0)],
        ],
    ),
];

/// Where [`split_products`] splits its operands into f16 halves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitStaging {
    /// In the kernel, into workgroup memory (`coop_split.wgsl`), as a state pass would.
    Workgroup,
    /// On the host, read from storage (`coop_split_storage.wgsl`): no workgroup memory.
    Storage,
}

/// The low half's scale: x = hi + lo / LO_SCALE (`LO_SCALE` in `coop_split_step.wgsl`).
const LO_SCALE: f32 = 2048.0;

/// Multiply-add steps per subgroup in [`peak_tflops`] (`PEAK_STEPS`), and its workgroups.
const PEAK_STEPS: u32 = 1024;
const PEAK_GROUPS: u32 = 4096;

/// Whether `config` is the one the kernels use: 16 x 16 x 16, f16 operands, f32 accumulation
/// (not saturating: naga writes no saturation operand).
pub fn is_f16_16x16x16(config: &wgpu::CooperativeMatrixProperties) -> bool {
    config.m_size == 16
        && config.n_size == 16
        && config.k_size == 16
        && config.ab_type == wgpu::CooperativeScalarType::F16
        && config.cr_type == wgpu::CooperativeScalarType::F32
        && !config.saturating_accumulation
}

/// The f16 -> f32 multiply-add rate of the matrix units in TFLOP/s: 4096 subgroups, each 4096
/// products of register-resident 16 x 16 tiles, timed as the median of dispatches after the
/// timer's warm-up; an upper bound (constant operands, no memory traffic). An error on a
/// device without cooperative matrices.
pub fn peak_tflops(wgpu: &Wgpu) -> Result<f64> {
    check_device(wgpu)?;
    let ones = upload_f16(wgpu, vec![16, 16], &[f16::ONE; 256])?;
    let c = WgpuTensor::zeros(wgpu, vec![PEAK_GROUPS as usize, 4, 256], DType::F32)?;
    let launch = Launch::new(
        wgpu,
        &PEAK,
        &[("PEAK_STEPS", PEAK_STEPS)],
        [&ones, &ones, &c],
        PEAK_GROUPS as usize,
    )?;
    let us = median_dispatch_us(wgpu, 4, 5, |n| launch.submit(wgpu, n))?;
    let flops = 2.0 * 16f64.powi(3) * 4.0 * f64::from(PEAK_STEPS) * f64::from(PEAK_GROUPS);
    Ok(flops / (us * 1e-6) / 1e12)
}

/// The rate of [`split_products`]'s kernel over `entries` entries (operands from memory, split
/// and staged in workgroup memory, three products per step) in TFLOP/s of the f32 product it
/// computes (2 x 32 x 128 x 16 flops per entry): the median of dispatches after the timer's
/// warm-up. An error on a device without cooperative matrices.
pub fn split_tflops(wgpu: &Wgpu, entries: usize) -> Result<f64> {
    check_device(wgpu)?;
    let x = WgpuTensor::zeros(wgpu, vec![entries, 32, 128], DType::F32)?;
    let b = WgpuTensor::zeros(wgpu, vec![entries, 128, 16], DType::F32)?;
    let out = WgpuTensor::zeros(wgpu, vec![entries, 32, 16], DType::F32)?;
    let launch = Launch::new(wgpu, &SPLIT, &[], [&x, &b, &out], entries)?;
    let us = median_dispatch_us(wgpu, 4, 5, |n| launch.submit(wgpu, n))?;
    Ok(2.0 * 32.0 * 128.0 * 16.0 * entries as f64 / (us * 1e-6) / 1e12)
}

/// `C_t = A_t B_t` for each tile t of `a` and `b` (`[tiles, 16, 16]` row-major f16) on the
/// cooperative matrices, f32 results in the same layout; an error naming what is missing on a
/// device without them.
pub fn matmul_tiles(wgpu: &Wgpu, a: &[f16], b: &[f16]) -> Result<Vec<f32>> {
    check_device(wgpu)?;
    if a.len() != b.len() || a.is_empty() || !a.len().is_multiple_of(256) {
        return Err(Error::InvalidValue(format!(
            "a and b must hold the same whole number of 16 x 16 tiles, got {} and {} elements",
            a.len(),
            b.len()
        )));
    }
    let shape = vec![a.len() / 256, 16, 16];
    let (a, b) = (
        upload_f16(wgpu, shape.clone(), a)?,
        upload_f16(wgpu, shape.clone(), b)?,
    );
    run_per_entry(wgpu, &PROBE, &a, &b, shape)
}

/// `values` as an f16 tensor of `shape` on the device.
fn upload_f16(wgpu: &Wgpu, shape: Vec<usize>, values: &[f16]) -> Result<WgpuTensor> {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    WgpuTensor::upload(wgpu, &HostTensor::from_le_bytes(shape, DType::F16, &bytes)?)
}

/// `Y_e = X_e B_e / 2` for each entry e of `x` (`[entries, 32, 128]`) and `b`
/// (`[entries, 128, 16]`), row-major f32, on the cooperative matrices with both operands split
/// into f16 halves (`x = hi + lo / 2^11`, three products per step), split where `staging`
/// says: the state pass's product shape, to f32 accuracy. An error on a device without
/// cooperative matrices.
pub fn split_products(
    wgpu: &Wgpu,
    x: &[f32],
    b: &[f32],
    staging: SplitStaging,
) -> Result<Vec<f32>> {
    check_device(wgpu)?;
    let entries = x.len() / 4096;
    if x.is_empty() || x.len() != entries * 4096 || b.len() != entries * 2048 {
        return Err(Error::InvalidValue(format!(
            "x must hold whole [32, 128] entries and b as many [128, 16] ones, got {} and {} elements",
            x.len(),
            b.len()
        )));
    }
    let out_shape = vec![entries, 32, 16];
    match staging {
        SplitStaging::Workgroup => {
            let upload = |v: &[f32], rows: usize, cols: usize| {
                WgpuTensor::upload(
                    wgpu,
                    &HostTensor::from_f32(vec![entries, rows, cols], v.to_vec())?,
                )
            };
            let (x, b) = (upload(x, 32, 128)?, upload(b, 128, 16)?);
            run_per_entry(wgpu, &SPLIT, &x, &b, out_shape)
        }
        SplitStaging::Storage => {
            // Per entry: the high halves, then the low halves times LO_SCALE.
            let halves = |v: &[f32], size: usize| -> Vec<f16> {
                v.chunks(size)
                    .flat_map(|entry| {
                        let high: Vec<f16> = entry.iter().map(|&e| f16::from_f32(e)).collect();
                        let low: Vec<f16> = entry
                            .iter()
                            .zip(&high)
                            .map(|(&e, h)| f16::from_f32((e - h.to_f32()) * LO_SCALE))
                            .collect();
                        high.into_iter().chain(low)
                    })
                    .collect()
            };
            let x = upload_f16(wgpu, vec![entries, 2, 32, 128], &halves(x, 4096))?;
            let b = upload_f16(wgpu, vec![entries, 2, 128, 16], &halves(b, 2048))?;
            run_per_entry(wgpu, &SPLIT_STORAGE, &x, &b, out_shape)
        }
    }
}

/// The refusal of a device without the configuration.
fn check_device(wgpu: &Wgpu) -> Result<()> {
    if wgpu.has_coop16() {
        return Ok(());
    }
    Err(Error::Unsupported(format!(
        "{}: no cooperative matrices with 16 x 16 x 16 f16 operands and f32 accumulation (they are off unless DELTAKV_WGPU_COOP=1)",
        wgpu.name()
    )))
}

/// Runs `source` (bindings 0 and 1 the inputs, 2 the output) with one workgroup per entry of
/// the output (`out_shape[0]` of them) into a poisoned f32 output, and downloads it.
fn run_per_entry(
    wgpu: &Wgpu,
    source: &ShaderSource,
    first: &WgpuTensor,
    second: &WgpuTensor,
    out_shape: Vec<usize>,
) -> Result<Vec<f32>> {
    let entries = out_shape[0];
    let out = WgpuTensor::poisoned(wgpu, out_shape, DType::F32)?;
    Launch::new(wgpu, source, &[], [first, second, &out], entries)?.submit(wgpu, 1)?;
    out.download(wgpu)?
        .as_f32()
        .map(<[f32]>::to_vec)
        .ok_or_else(|| backend_error(source.name, "the output is not f32"))
}

/// A kernel of this module with its constants, bound to its three buffers, one workgroup per
/// entry.
struct Launch {
    pipeline: wgpu::ComputePipeline,
    group: wgpu::BindGroup,
    entries: u32,
}

impl Launch {
    fn new(
        wgpu: &Wgpu,
        source: &ShaderSource,
        constants: &[(&'static str, u32)],
        buffers: [&WgpuTensor; 3],
        entries: usize,
    ) -> Result<Self> {
        if entries > wgpu.device().limits().max_compute_workgroups_per_dimension as usize {
            return Err(Error::InvalidValue(format!(
                "{entries} entries: more than one dispatch row holds"
            )));
        }
        let pipeline = wgpu.pipeline(source, constants)?;
        let group = wgpu.bind_group(
            source.name,
            &pipeline,
            &[
                (0, "first input", buffers[0].buffer()),
                (1, "second input", buffers[1].buffer()),
                (2, "output", buffers[2].buffer()),
            ],
        )?;
        Ok(Self {
            pipeline,
            group,
            entries: entries as u32,
        })
    }

    /// Queues `repeat` dispatches in one submission (without waiting).
    fn submit(&self, wgpu: &Wgpu, repeat: usize) -> Result<()> {
        wgpu.submit_pass("running a cooperative-matrix kernel", |pass| {
            pass.set_pipeline(&self.pipeline);
            pass.set_bind_group(0, &self.group, &[]);
            for _ in 0..repeat {
                pass.dispatch_workgroups(self.entries, 1, 1);
            }
        })
    }
}

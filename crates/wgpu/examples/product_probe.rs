//! The rates behind the chunked prefill's state pass, measured apart from it: the device's f32
//! multiply-add rate through WGSL, and the W S product (32 chunk rows x 128 by 128 x 16 or 32
//! value columns, both operands in workgroup memory) in each thread layout the state kernels
//! use or could use, repeated with a barrier after each repetition as the walk does.
//!
//! ```text
//! cargo run --release -p deltakv-wgpu --example product_probe [-- WORKGROUPS]
//! ```
//!
//! Each line gives the median time of one dispatch (`deltakv_wgpu::timing`, after its warm-up)
//! and the multiply-add rate it implies; WORKGROUPS (default 1056) workgroups of 256 threads.
//! The 2- and 4-row probes hold 33 KiB of workgroup memory (W and S with W's padding), a little
//! more than the 32 KiB every adapter is sure to have (the H100 has 48; lavapipe ran them).

use deltakv_wgpu::timing::median_dispatch_us;
use deltakv_wgpu::{ShaderSource, Wgpu};
use wgpu::util::DeviceExt;

/// The probes, with the staged state kernel's own product function (`staged_half_products`).
const TEXT: &str = concat!(
    include_str!("product_probe.wgsl"),
    include_str!("../src/gdn/staged_s_columns.wgsl")
);
const REPS: u32 = 256;

/// (entry point, multiply-adds per workgroup and repetition, what it is).
const PROBES: &[(&str, f64, &str)] = &[
    (
        "fma_peak",
        256.0 * 8.0 * 4.0 * 64.0,
        "f32 multiply-add chains in registers (8 vec4 per thread)",
    ),
    (
        "ws_pairs",
        32.0 * 16.0 * 128.0,
        "W S, 16 columns: the staged kernel's own products (2 rows x 2 columns x half of K per thread, 256 threads)",
    ),
    (
        "ws_rows2",
        32.0 * 32.0 * 128.0,
        "W S, 32 columns: 2 rows x 4 columns x K per thread, 128 threads (tuning log row 24's layout)",
    ),
    (
        "ws_rows2_halves",
        32.0 * 32.0 * 128.0,
        "W S, 32 columns: 2 rows x 4 columns x half of K per thread, 256 threads (halves not joined)",
    ),
    (
        "ws_rows4",
        32.0 * 32.0 * 128.0,
        "W S, 32 columns: 4 rows x 4 columns x K per thread, 64 threads",
    ),
];

fn main() {
    if let Err(e) = run() {
        eprintln!("product_probe: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let groups: u32 = match std::env::args().nth(1) {
        Some(arg) => arg
            .parse()
            .map_err(|_| format!("WORKGROUPS must be a number, got {arg}"))?,
        None => 1056,
    };
    let wgpu = Wgpu::get()?;
    println!("{}", wgpu.describe());
    let values: Vec<f32> = (0..256).map(|i| 1.0 + (i % 7) as f32 * 1e-3).collect();
    let src = wgpu
        .device()
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("probe src"),
            contents: &values
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
            usage: wgpu::BufferUsages::STORAGE,
        });
    let dst = wgpu.device().create_buffer(&wgpu::BufferDescriptor {
        label: Some("probe dst"),
        size: u64::from(groups) * 256 * 16,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    for &(entry, madds, what) in PROBES {
        let source = ShaderSource {
            name: entry,
            text: TEXT,
            entry_point: entry,
        };
        // SAFETY: every loop of product_probe.wgsl has a constant trip count.
        let pipeline = unsafe { wgpu.pipeline_without_loop_bounding(&source, &[("REPS", REPS)])? };
        let group = wgpu.bind_group(entry, &pipeline, &[(0, "src", &src), (1, "dst", &dst)])?;
        let us = median_dispatch_us(wgpu, 4, 5, |n| {
            let mut encoder = wgpu
                .device()
                .create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
            {
                let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
                pass.set_pipeline(&pipeline);
                pass.set_bind_group(0, &group, &[]);
                for _ in 0..n {
                    pass.dispatch_workgroups(groups, 1, 1);
                }
            }
            wgpu.queue().submit([encoder.finish()]);
            wgpu.check(entry)
        })?;
        let total = madds * f64::from(REPS) * f64::from(groups);
        println!(
            "{entry:16} {us:10.1} us  {:8.2} T multiply-adds/s  ({what}; {groups} workgroups x {REPS} repetitions)",
            total / (us * 1e-6) / 1e12,
        );
    }
    Ok(())
}

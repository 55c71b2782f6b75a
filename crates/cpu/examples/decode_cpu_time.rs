//! Measures one GDN decode step by process CPU time (robust on a busy machine):
//! `cargo run --release -p deltakv-cpu --example decode_cpu_time -- [batch] [iters] [f32|bf16]`.
//! Run with RAYON_NUM_THREADS=1 for per-core cost; HEADS=n sets the value heads (key heads n/2),
//! TOKENS=t the tokens per sequence (default 1), SIMD=avx2|baseline the widest kernels used.

use deltakv_contract::gdn::decode::random::{DecodeCase, DecodeSpec};
use deltakv_contract::gdn::{DecodeInputs, DecodeOptions, Gating, GdnOptions};
use deltakv_cpu::gdn::gdn_decode;

#[path = "common/cpu_time.rs"]
mod cpu_time;
use cpu_time::cpu_seconds;

fn main() -> deltakv_contract::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    // SIMD=avx2 (or baseline) caps the kernels' instruction set, to time the other builds.
    match std::env::var("SIMD").as_deref() {
        Ok("avx2") => deltakv_cpu::simd::set_simd_limit(deltakv_cpu::simd::SimdLimit::Avx2),
        Ok("baseline") => deltakv_cpu::simd::set_simd_limit(deltakv_cpu::simd::SimdLimit::Baseline),
        _ => {}
    }
    let batch: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1);
    let iters: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2000);
    let value_heads: usize = std::env::var("HEADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(32);
    let tokens: usize = std::env::var("TOKENS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let mut spec = DecodeSpec::new(batch, tokens, value_heads / 2, value_heads, 128, 128);
    if args.get(3).map(String::as_str) == Some("bf16") {
        spec.pool_dtype = deltakv_contract::DType::BF16;
    }
    let case = DecodeCase::random(&spec, 1)?;
    let mut pool = case.state_pool.clone();
    let inputs = DecodeInputs {
        q: &case.q,
        k: &case.k,
        v: &case.v,
        gating: Gating::Direct {
            g: case.gate("g").expect("g"),
            beta: case.gate("beta").expect("beta"),
        },
        slot_indices: &case.slot_indices,
    };
    let options = DecodeOptions {
        gdn: GdnOptions {
            scale: None,
            use_qk_l2norm: true,
        },
        intermediate_states: false,
    };
    gdn_decode(&inputs, &mut pool, &options)?;
    let start = cpu_seconds();
    let wall = std::time::Instant::now();
    for _ in 0..iters {
        gdn_decode(&inputs, &mut pool, &options)?;
    }
    let cpu = (cpu_seconds() - start) / iters as f64;
    let wall = wall.elapsed().as_secs_f64() / iters as f64;
    println!(
        "decode B={batch} T={tokens}: {:.1} us CPU, {:.1} us wall per step",
        cpu * 1e6,
        wall * 1e6
    );
    Ok(())
}

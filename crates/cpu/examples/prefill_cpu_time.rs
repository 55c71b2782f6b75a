//! Measures GDN prefill by process CPU time rather than wall time, so that figures stay
//! comparable on a busy machine: `cargo run --release -p deltakv-cpu --example prefill_cpu_time
//! -- [chunk|recurrent] [tokens] [iters]`. Run with RAYON_NUM_THREADS=1 for per-core cost.

use deltakv_contract::gdn::random::{GdnCase, GdnSpec};
use deltakv_contract::gdn::{GdnOptions, PrefillMode};
use deltakv_cpu::gdn::gdn_prefill;

#[path = "common/cpu_time.rs"]
mod cpu_time;
use cpu_time::cpu_seconds;

fn main() -> deltakv_contract::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let mode = match args.get(1).map(String::as_str) {
        Some("recurrent") => PrefillMode::Recurrent,
        _ => PrefillMode::Chunk,
    };
    let tokens: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(4096);
    let iters: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(5);
    let mut spec = GdnSpec::new(tokens, 16, 32, 128, 128);
    spec.raw_qk = true;
    let case = GdnCase::random(&spec, 1)?;
    let options = GdnOptions {
        scale: None,
        use_qk_l2norm: true,
    };
    gdn_prefill(&case.inputs(), &options, mode)?;
    let start = cpu_seconds();
    for _ in 0..iters {
        gdn_prefill(&case.inputs(), &options, mode)?;
    }
    let per_iter = (cpu_seconds() - start) / iters as f64;
    println!(
        "{mode:?} T={tokens}: {:.1} ms CPU per prefill -> {:.0} tokens/s per core-second",
        per_iter * 1e3,
        tokens as f64 / per_iter
    );
    Ok(())
}

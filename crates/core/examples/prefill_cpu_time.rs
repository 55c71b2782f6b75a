//! Measures GDN prefill by process CPU time rather than wall time, so that figures stay
//! comparable on a busy machine: `cargo run --release -p deltakv-core --example prefill_cpu_time
//! -- [chunk|recurrent] [tokens] [iters]`. Run with RAYON_NUM_THREADS=1 for per-core cost.

use deltakv_core::gdn::random::{GdnCase, GdnSpec};
use deltakv_core::gdn::{GdnOptions, PrefillMode, gdn_prefill};

/// utime + stime of this process, in seconds (from /proc/self/stat; 10 ms ticks).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|s| s.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

fn main() -> deltakv_core::Result<()> {
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

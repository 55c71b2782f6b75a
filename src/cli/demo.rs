//! `deltakv demo`: the main job. A Qwen3-Next GDN layer (Hg = 16, H = 32, K = V = 128) on
//! random bf16 inputs: a 4096-token chunked prefill, timed, and checked against the f64 oracle
//! on a subset of heads (the full oracle is slow).

use clap::Args;
use deltakv::gdn::oracle::gdn_reference_heads;
use deltakv::gdn::random::{GdnCase, GdnSpec};
use deltakv::gdn::{GdnOptions, PrefillMode};
use deltakv::metrics::rel_rms;
use deltakv::{Device, Result, gdn_prefill};
use std::time::Instant;

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Prompt length.
    #[arg(long, default_value_t = 4096)]
    pub tokens: usize,
    /// Random seed.
    #[arg(long, default_value_t = 2026)]
    pub seed: u64,
}

/// Value heads checked against the oracle (spread over the key-head groups).
const ORACLE_HEADS: [usize; 4] = [0, 9, 22, 31];

pub fn run(args: DemoArgs) -> Result<()> {
    let (key_heads, value_heads, dim) = (16, 32, 128);
    println!(
        "deltakv demo: one Qwen3-Next Gated DeltaNet layer on the CPU ({} threads)",
        rayon::current_num_threads()
    );
    println!(
        "  shape: T = {}, Hg = {key_heads}, H = {value_heads}, K = V = {dim}, bf16 inputs, l2-normalised q/k",
        args.tokens
    );
    let mut spec = GdnSpec::new(args.tokens, key_heads, value_heads, dim, dim);
    spec.raw_qk = true;
    let case = GdnCase::random(&spec, args.seed)?;
    let options = GdnOptions {
        scale: None,
        use_qk_l2norm: true,
    };

    let mut times = Vec::new();
    let mut out = None;
    for _ in 0..3 {
        let t = Instant::now();
        out = Some(gdn_prefill(
            Device::Cpu,
            &case.inputs(),
            &options,
            PrefillMode::Chunk,
        )?);
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let out = out.expect("ran three times");
    let chunk_s = times[1];

    let t = Instant::now();
    let recurrent = gdn_prefill(
        Device::Cpu,
        &case.inputs(),
        &options,
        PrefillMode::Recurrent,
    )?;
    let recurrent_s = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let reference = gdn_reference_heads(&case.inputs(), &options, &ORACLE_HEADS)?;
    let oracle_s = t.elapsed().as_secs_f64();
    let pick = |o: &deltakv::HostTensor| -> Result<Vec<f32>> {
        let all = o.to_f32_vec("o")?;
        let mut picked = Vec::with_capacity(reference.o.len());
        for row in all.chunks_exact(value_heads * dim) {
            for &h in &ORACLE_HEADS {
                picked.extend_from_slice(&row[h * dim..(h + 1) * dim]);
            }
        }
        Ok(picked)
    };
    let pick_state = |s: &deltakv::HostTensor| -> Vec<f32> {
        let all = s.as_f32().expect("final_state is f32");
        ORACLE_HEADS
            .iter()
            .flat_map(|&h| all[h * dim * dim..(h + 1) * dim * dim].iter().copied())
            .collect()
    };
    let chunk_o_err = rel_rms(&pick(&out.o)?, &reference.o);
    let chunk_s_err = rel_rms(&pick_state(&out.final_state), &reference.final_state);
    let rec_o_err = rel_rms(&pick(&recurrent.o)?, &reference.o);
    let rec_s_err = rel_rms(&pick_state(&recurrent.final_state), &reference.final_state);

    println!();
    println!(
        "prefill (chunked WY, 64-token chunks): {:.1} ms  -> {:.0} tokens/s",
        chunk_s * 1e3,
        args.tokens as f64 / chunk_s
    );
    println!(
        "prefill (recurrent):                   {:.1} ms  -> {:.0} tokens/s",
        recurrent_s * 1e3,
        args.tokens as f64 / recurrent_s
    );
    println!(
        "error against the f64 oracle (value heads {ORACLE_HEADS:?}, oracle took {oracle_s:.1} s):"
    );
    println!(
        "  chunked:   o rel_rms {chunk_o_err:.2e} (bf16 output; bf16 rounding alone costs ~1.7e-3), final_state {chunk_s_err:.2e}"
    );
    println!("  recurrent: o rel_rms {rec_o_err:.2e}, final_state {rec_s_err:.2e}");
    let ok = chunk_o_err < 2e-3 && chunk_s_err < 1e-4 && rec_o_err < 2e-3 && rec_s_err < 1e-4;
    #[cfg(feature = "cuda")]
    let ok = super::demo_prefill_cuda::run(&case, &options, &pick, &pick_state, &reference)? && ok;
    println!();
    println!(
        "summary: {} — {:.0} tokens/s chunked prefill, {:.1}x the recurrent path",
        if ok {
            "PASS (o < 2e-3, state < 1e-4)"
        } else {
            "FAIL: error above tolerance"
        },
        args.tokens as f64 / chunk_s,
        recurrent_s / chunk_s
    );
    let ok = super::demo_decode::run(&case, &options, &out.final_state, args.seed)? && ok;
    if !ok {
        return Err(deltakv::Error::InvalidValue(
            "demo error above tolerance".into(),
        ));
    }
    super::demo_kv::run(args.seed)?;
    Ok(())
}

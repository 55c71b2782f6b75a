//! The chunked prefill's state pass in every shape its environment variables select (column
//! tiles of 16 or 32, 8, 16 or 32 row groups, the row width fixed in the pipeline or read at run
//! time, the one-block kernel or the general one, Kd staged or not, the prepare's inverse by
//! blocks or serial, with or without wgpu's loop bounding), not only the default one, against the f64 oracle:
//! K = 128 (one 4-row block per thread at 32 groups) and K = 64 / V = 96 (row groups past K,
//! a partial column tile), with initial states, l2 norm and odd lengths. Its own test binary,
//! so setting the variables between calls reaches no other test.

mod common;

use deltakv_contract::gdn::oracle::gdn_reference;
use deltakv_contract::gdn::random::{GdnCase, GdnSpec};
use deltakv_contract::gdn::{GdnOptions, PrefillMode};
use deltakv_contract::metrics::rel_rms;
use deltakv_wgpu::gdn::chunks::{
    FIXED_WIDTH_ENV, GROUPS_ENV, INVERSE_ENV, LOOP_BOUNDING_ENV, STAGE_KD_ENV, STATE_KERNEL_ENV,
    TILE_ENV,
};
use deltakv_wgpu::gdn::gdn_prefill;

#[test]
fn every_state_tile_and_row_group_count_against_the_oracle() {
    let Some(wgpu) = common::device("state pass shapes") else {
        return;
    };
    println!("device: {}", wgpu.describe());
    let options = GdnOptions {
        scale: None,
        use_qk_l2norm: true,
    };
    let cases: Vec<(GdnSpec, u64)> = [(130, 2, 128, 128, 900), (65, 1, 64, 96, 901)]
        .into_iter()
        .map(|(tokens, heads, kd, vd, seed)| {
            let mut spec = GdnSpec::new(tokens, 1, heads, kd, vd);
            spec.raw_qk = true;
            spec.with_initial_state = true;
            (spec, seed)
        })
        .collect();
    let mut worst = [0f64; 2];
    let shapes = [
        ("16", "8", "1", "block"),
        ("16", "16", "1", "block"),
        ("16", "32", "1", "block"),
        ("16", "32", "0", "block"),
        ("16", "32", "1", "loops"),
        ("16", "32", "1", "block, Kd not staged"),
        ("16", "32", "1", "block, serial inverse"),
        ("16", "32", "1", "block, loop bounding"),
        ("16", "32", "1", "loops, loop bounding"),
        ("32", "8", "1", "block"),
        ("32", "16", "1", "block"),
        ("32", "16", "0", "block"),
    ];
    for (tile, groups, fixed_width, kernel) in shapes {
        // SAFETY: this binary's only test sets the variables; the prefill reads them per call.
        unsafe {
            std::env::set_var(TILE_ENV, tile);
            std::env::set_var(GROUPS_ENV, groups);
            std::env::set_var(FIXED_WIDTH_ENV, fixed_width);
            std::env::set_var(STATE_KERNEL_ENV, kernel);
            let stage_kd = if kernel.ends_with("not staged") {
                "0"
            } else {
                "1"
            };
            std::env::set_var(STAGE_KD_ENV, stage_kd);
            let inverse = if kernel.ends_with("serial inverse") {
                "serial"
            } else {
                "blocked"
            };
            std::env::set_var(INVERSE_ENV, inverse);
            let bounded = if kernel.ends_with(", loop bounding") {
                "1"
            } else {
                "0"
            };
            std::env::set_var(LOOP_BOUNDING_ENV, bounded);
        }
        for (spec, seed) in &cases {
            let case = GdnCase::random(spec, *seed).unwrap();
            let reference = gdn_reference(&case.inputs(), &options).unwrap();
            let out = gdn_prefill(wgpu, &case.inputs(), &options, PrefillMode::Chunk)
                .unwrap_or_else(|e| panic!("tile {tile}, {groups} groups: {e}"));
            let o_err = rel_rms(&out.o.to_f32_vec("o").unwrap(), &reference.o);
            let s_err = rel_rms(out.final_state.as_f32().unwrap(), &reference.final_state);
            println!(
                "tile {tile}, {groups} row groups, fixed width {fixed_width}, kernel {kernel}, T={} K={} V={}: o {o_err:.3e}, final_state {s_err:.3e}",
                spec.tokens, spec.key_dim, spec.value_dim
            );
            assert!(
                o_err < 2e-3 && s_err < 1e-4,
                "tile {tile}, {groups} groups, K={}: o {o_err:.3e}, state {s_err:.3e}",
                spec.key_dim
            );
            worst = [worst[0].max(o_err), worst[1].max(s_err)];
        }
    }
    println!(
        "worst rel_rms: o {:.3e}, final_state {:.3e}",
        worst[0], worst[1]
    );
}

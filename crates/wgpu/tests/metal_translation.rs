//! Every shader of the backend, with every set of `override` constants its launchers use,
//! parsed and validated by naga and translated to Metal Shading Language by naga's MSL writer
//! (the path wgpu takes on Apple hardware), and the decode kernel also with its row loops
//! written out, as the launcher builds it. Runs without any adapter; it checks translation
//! only, not execution on a Mac.

use deltakv_wgpu::gdn::decode_sources::{BANDS_BF16, BANDS_F32};
use deltakv_wgpu::kv::attend::attend_loops;
use deltakv_wgpu::kv::{SOURCE_ATTEND_SHARED, SOURCE_ATTEND_SUBGROUP};
use deltakv_wgpu::unroll::unrolled;
use deltakv_wgpu::{BANDS_CONSTANTS, Constants, KV_ATTEND_CONSTANTS, SHADERS, ShaderSource};

#[test]
fn every_shader_translates_to_metal() {
    for (source, constant_sets) in SHADERS {
        translate(source, constant_sets);
    }
}

/// The decode kernel with its row loops written out, as the launcher builds it: each with the
/// constants whose ROWS it was written out for.
#[test]
fn unrolled_decode_kernels_translate_to_metal() {
    let kernels = [(BANDS_F32, BANDS_CONSTANTS), (BANDS_BF16, BANDS_CONSTANTS)];
    for (source, constant_sets) in kernels {
        for &constants in constant_sets {
            let rows = constants
                .iter()
                .find(|(name, _)| *name == "ROWS")
                .map(|&(_, rows)| rows as u32)
                .expect("the decode constants set ROWS");
            let written_out = deltakv_wgpu::gdn::decode_sources::unrolled(&source, rows).unwrap();
            assert!(
                !written_out.text.contains("i < ROWS"),
                "{}: a row loop is left",
                written_out.name
            );
            translate(&written_out, &[constants]);
        }
    }
}

/// The attention's pass 1 with its loops written out as the launcher builds it, for each key
/// bit width with the constants of that width.
#[test]
fn unrolled_attention_kernels_translate_to_metal() {
    for source in [SOURCE_ATTEND_SUBGROUP, SOURCE_ATTEND_SHARED] {
        for bits_k in [2u32, 3, 4, 8] {
            let written_out = unrolled(&source, &attend_loops(bits_k)).unwrap();
            assert!(
                !written_out.text.contains("c < 16u; c++")
                    && !written_out.text.contains("r < 4u; r++"),
                "{}: a loop is left",
                written_out.name
            );
            let sets: Vec<Constants> = KV_ATTEND_CONSTANTS
                .iter()
                .copied()
                .filter(|set| {
                    set.iter()
                        .any(|&(name, v)| name == "BITS_K" && v == f64::from(bits_k))
                })
                .collect();
            assert!(!sets.is_empty());
            translate(&written_out, &sets);
        }
    }
}

fn translate(source: &ShaderSource, constant_sets: &[Constants]) {
    let module = naga::front::wgsl::parse_str(source.text)
        .unwrap_or_else(|e| panic!("{}: {}", source.name, e.emit_to_string(source.text)));
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .unwrap_or_else(|e| panic!("{}: validation: {e:?}", source.name));
    for constants in constant_sets.iter() {
        let mut values = naga::back::PipelineConstants::default();
        for &(name, value) in constants.iter() {
            values.insert(name.to_string(), value);
        }
        let entry = (naga::ShaderStage::Compute, source.entry_point);
        let (module, info) =
            naga::back::pipeline_constants::process_overrides(&module, &info, Some(entry), &values)
                .unwrap_or_else(|e| panic!("{} {constants:?}: {e:?}", source.name));
        let options = naga::back::msl::Options {
            lang_version: (2, 4),
            ..Default::default()
        };
        let pipeline = naga::back::msl::PipelineOptions {
            entry_point: Some((naga::ShaderStage::Compute, source.entry_point.to_string())),
            ..Default::default()
        };
        let (msl, _) = naga::back::msl::write_string(&module, &info, &options, &pipeline)
            .unwrap_or_else(|e| panic!("{} {constants:?}: MSL: {e:?}", source.name));
        assert!(
            msl.contains("kernel void") && msl.contains(source.entry_point),
            "{}: no kernel in the MSL",
            source.name
        );
        println!(
            "{} {constants:?}: {} lines of MSL",
            source.name,
            msl.lines().count()
        );
    }
}

//! SPIR-V as wgpu's Vulkan backend writes it, for the tests and tools that look at the code the
//! driver receives (spirv-val in `coop_matrix`, the driver's own statistics in the
//! `pipeline_stats` example).

use deltakv_wgpu::ShaderSource;

/// `source`'s entry point with `constants` as SPIR-V, written by naga with the options wgpu's
/// Vulkan backend uses on a Vulkan 1.3 device for the runtime's pipelines (SPIR-V 1.6, clamped
/// indices, 16-bit I/O, workgroup memory not zeroed), with loop bounding where `loop_bounding`
/// says (the runtime turns it off for the pipelines it builds through
/// `Wgpu::pipeline_without_loop_bounding`).
pub fn spirv_of(
    source: &ShaderSource,
    constants: &[(&str, f64)],
    loop_bounding: bool,
) -> Result<Vec<u32>, String> {
    let module =
        naga::front::wgsl::parse_str(source.text).map_err(|e| e.emit_to_string(source.text))?;
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| format!("validation: {e:?}"))?;
    let mut values = naga::back::PipelineConstants::default();
    for &(name, value) in constants {
        values.insert(name.to_string(), value);
    }
    let entry = (naga::ShaderStage::Compute, source.entry_point);
    let (module, info) =
        naga::back::pipeline_constants::process_overrides(&module, &info, Some(entry), &values)
            .map_err(|e| format!("constants: {e:?}"))?;
    let options = naga::back::spv::Options {
        lang_version: (1, 6),
        bounds_check_policies: naga::proc::BoundsCheckPolicies {
            index: naga::proc::BoundsCheckPolicy::Restrict,
            buffer: naga::proc::BoundsCheckPolicy::Unchecked,
            image_load: naga::proc::BoundsCheckPolicy::Unchecked,
            binding_array: naga::proc::BoundsCheckPolicy::Unchecked,
        },
        force_loop_bounding: loop_bounding,
        use_storage_input_output_16: true,
        // The runtime builds every pipeline without wgpu's zeroing of workgroup memory.
        zero_initialize_workgroup_memory: naga::back::spv::ZeroInitializeWorkgroupMemoryMode::None,
        ..Default::default()
    };
    let pipeline = naga::back::spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: source.entry_point.to_string(),
    };
    naga::back::spv::write_vec(&module, &info, &options, Some(&pipeline))
        .map_err(|e| format!("SPIR-V: {e:?}"))
}

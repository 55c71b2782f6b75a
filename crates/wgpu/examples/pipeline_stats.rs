//! What the Vulkan driver made of each WGSL shader: registers, spills, shared memory and
//! whatever else it reports through `VK_KHR_pipeline_executable_properties` (NVIDIA's answer to
//! `ptxas -v`, for the code wgpu hands it).
//!
//! ```text
//! cargo run --release --example pipeline_stats -p deltakv-wgpu [-- NAME_PART ...]
//! ```
//!
//! Each shader of `deltakv_wgpu::SHADERS` and `deltakv_wgpu::coop::SHADERS`, with each of its
//! constant sets, is written to SPIR-V by naga with wgpu's Vulkan options (`tests/spirv`), built
//! into a compute pipeline on the first Vulkan device (or the first whose name contains
//! `DELTAKV_WGPU_ADAPTER`), with every feature the device offers enabled, and the driver's
//! statistics printed one line per pipeline. Arguments keep only the shaders whose names
//! contain one of them. Cooperative-matrix shaders are skipped on a device without
//! `VK_KHR_cooperative_matrix`.

#[path = "../tests/spirv/mod.rs"]
mod spirv;

use ash::vk;
use deltakv_wgpu::{Constants, ShaderSource};
use std::ffi::CStr;

type Failure = Box<dyn std::error::Error>;

fn main() {
    if let Err(e) = run() {
        eprintln!("pipeline_stats: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Failure> {
    let filters: Vec<String> = std::env::args().skip(1).collect();
    let mut builds: Vec<(&ShaderSource, Constants, bool)> = Vec::new();
    for (source, sets) in deltakv_wgpu::SHADERS {
        for &set in *sets {
            builds.push((source, set, false));
        }
    }
    for source in deltakv_wgpu::coop::SHADERS {
        builds.push((source, &[], true));
    }
    for set in STATE_COOP_CONSTANTS {
        builds.push((&deltakv_wgpu::gdn::chunks::STATE_COOP, set, true));
    }
    builds.retain(|(source, _, _)| {
        filters.is_empty() || filters.iter().any(|f| source.name.contains(f.as_str()))
    });

    // SAFETY: every Vulkan object below is created, used and destroyed on this thread, from
    // handles the calls before returned, and outlives no parent.
    unsafe {
        let entry = ash::Entry::load()?;
        let app = vk::ApplicationInfo::default().api_version(vk::API_VERSION_1_3);
        let instance = entry.create_instance(
            &vk::InstanceCreateInfo::default().application_info(&app),
            None,
        )?;
        let wanted = std::env::var("DELTAKV_WGPU_ADAPTER").unwrap_or_default();
        let physical = instance
            .enumerate_physical_devices()?
            .into_iter()
            .find(|&p| {
                let props = instance.get_physical_device_properties(p);
                let name = props
                    .device_name_as_c_str()
                    .unwrap_or_default()
                    .to_string_lossy();
                name.contains(wanted.as_str())
            })
            .ok_or("no Vulkan device (or none whose name contains DELTAKV_WGPU_ADAPTER)")?;
        let props = instance.get_physical_device_properties(physical);
        let name = props
            .device_name_as_c_str()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let extensions: Vec<String> = instance
            .enumerate_device_extension_properties(physical)?
            .iter()
            .map(|e| {
                e.extension_name_as_c_str()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        let has = |ext: &CStr| {
            extensions
                .iter()
                .any(|e| e.as_str() == ext.to_string_lossy())
        };
        if !has(ash::khr::pipeline_executable_properties::NAME) {
            return Err(
                format!("{name}: the driver has no VK_KHR_pipeline_executable_properties").into(),
            );
        }
        let coop = has(ash::khr::cooperative_matrix::NAME);

        let mut exec_offered = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default();
        let mut probe = vk::PhysicalDeviceFeatures2::default().push_next(&mut exec_offered);
        instance.get_physical_device_features2(physical, &mut probe);
        if exec_offered.pipeline_executable_info == vk::FALSE {
            return Err(format!("{name}: pipelineExecutableInfo is not offered").into());
        }
        // Every feature the device offers, enabled as offered.
        let mut v11 = vk::PhysicalDeviceVulkan11Features::default();
        let mut v12 = vk::PhysicalDeviceVulkan12Features::default();
        let mut v13 = vk::PhysicalDeviceVulkan13Features::default();
        let mut exec = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default();
        let mut coop_features = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
        let mut features = vk::PhysicalDeviceFeatures2::default()
            .push_next(&mut v11)
            .push_next(&mut v12)
            .push_next(&mut v13)
            .push_next(&mut exec);
        if coop {
            features = features.push_next(&mut coop_features);
        }
        instance.get_physical_device_features2(physical, &mut features);
        let mut enabled = vec![ash::khr::pipeline_executable_properties::NAME.as_ptr()];
        if coop {
            enabled.push(ash::khr::cooperative_matrix::NAME.as_ptr());
        }
        let family = instance
            .get_physical_device_queue_family_properties(physical)
            .iter()
            .position(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE))
            .ok_or("no compute queue family")? as u32;
        let priorities = [1.0];
        let queues = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(family)
            .queue_priorities(&priorities)];
        let device = instance.create_device(
            physical,
            &vk::DeviceCreateInfo::default()
                .queue_create_infos(&queues)
                .enabled_extension_names(&enabled)
                .push_next(&mut features),
            None,
        )?;
        let stats = ash::khr::pipeline_executable_properties::Device::new(&instance, &device);
        println!(
            "{name}: driver statistics per pipeline (SPIR-V from naga with wgpu's Vulkan options)"
        );
        for (source, constants, needs_coop) in builds {
            let label = format!("{} {constants:?}", source.name);
            if needs_coop && !coop {
                println!("{label}: skipped (no VK_KHR_cooperative_matrix)");
                continue;
            }
            match pipeline_statistics(&device, &stats, source, constants) {
                Ok(line) => println!("{label}: {line}"),
                Err(e) => println!("{label}: failed: {e}"),
            }
        }
        device.destroy_device(None);
        instance.destroy_instance(None);
    }
    Ok(())
}

/// The coop state kernel's constant sets (as the launcher sets them).
const STATE_COOP_CONSTANTS: &[Constants] = &[
    &[("STATE_KP4", 32.0), ("WALK", 0.0)],
    &[("STATE_KP4", 32.0), ("WALK", 1.0)],
];

/// One pipeline of `source` with `constants`, its statistics as `name value` pairs.
///
/// # Safety
/// `device` and `stats` must be live and belong together.
unsafe fn pipeline_statistics(
    device: &ash::Device,
    stats: &ash::khr::pipeline_executable_properties::Device,
    source: &ShaderSource,
    constants: Constants,
) -> Result<String, Failure> {
    let words = spirv::spirv_of(source, constants)?;
    let module = naga::front::wgsl::parse_str(source.text)?;
    // One descriptor set layout per group, the bindings as the module declares them.
    let mut groups: Vec<Vec<vk::DescriptorSetLayoutBinding>> = Vec::new();
    for (_, var) in module.global_variables.iter() {
        let Some(binding) = &var.binding else {
            continue;
        };
        let kind = match var.space {
            naga::AddressSpace::Uniform => vk::DescriptorType::UNIFORM_BUFFER,
            naga::AddressSpace::Storage { .. } => vk::DescriptorType::STORAGE_BUFFER,
            _ => continue,
        };
        let group = binding.group as usize;
        if groups.len() <= group {
            groups.resize(group + 1, Vec::new());
        }
        groups[group].push(
            vk::DescriptorSetLayoutBinding::default()
                .binding(binding.binding)
                .descriptor_type(kind)
                .descriptor_count(1)
                .stage_flags(vk::ShaderStageFlags::COMPUTE),
        );
    }
    // SAFETY: every handle made here is destroyed before returning; the caller vouches for
    // `device` and `stats`.
    unsafe {
        let mut layouts = Vec::new();
        for bindings in &groups {
            layouts.push(device.create_descriptor_set_layout(
                &vk::DescriptorSetLayoutCreateInfo::default().bindings(bindings),
                None,
            )?);
        }
        let layout = device.create_pipeline_layout(
            &vk::PipelineLayoutCreateInfo::default().set_layouts(&layouts),
            None,
        )?;
        let shader = device
            .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&words), None)?;
        let entry = std::ffi::CString::new(source.entry_point)?;
        let stage = vk::PipelineShaderStageCreateInfo::default()
            .stage(vk::ShaderStageFlags::COMPUTE)
            .module(shader)
            .name(&entry);
        let info = vk::ComputePipelineCreateInfo::default()
            .stage(stage)
            .layout(layout)
            .flags(vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR);
        let made = device.create_compute_pipelines(vk::PipelineCache::null(), &[info], None);
        let result = match made {
            Ok(pipelines) => {
                let pipeline = pipelines[0];
                let line = describe(stats, pipeline);
                device.destroy_pipeline(pipeline, None);
                line
            }
            Err((_, e)) => Err(format!("pipeline creation: {e}").into()),
        };
        device.destroy_shader_module(shader, None);
        device.destroy_pipeline_layout(layout, None);
        for l in layouts {
            device.destroy_descriptor_set_layout(l, None);
        }
        result
    }
}

/// Every statistic of every executable of `pipeline`, as `name value` pairs.
///
/// # Safety
/// `pipeline` must be live and built with statistics capture on `stats`'s device.
unsafe fn describe(
    stats: &ash::khr::pipeline_executable_properties::Device,
    pipeline: vk::Pipeline,
) -> Result<String, Failure> {
    let mut parts = Vec::new();
    // SAFETY: as the caller vouches.
    unsafe {
        let executables = stats.get_pipeline_executable_properties(
            &vk::PipelineInfoKHR::default().pipeline(pipeline),
        )?;
        for index in 0..executables.len() as u32 {
            let info = vk::PipelineExecutableInfoKHR::default()
                .pipeline(pipeline)
                .executable_index(index);
            for stat in stats.get_pipeline_executable_statistics(&info)? {
                let name = stat.name_as_c_str().unwrap_or_default().to_string_lossy();
                let value = match stat.format {
                    vk::PipelineExecutableStatisticFormatKHR::BOOL32 => stat.value.b32.to_string(),
                    vk::PipelineExecutableStatisticFormatKHR::INT64 => stat.value.i64.to_string(),
                    vk::PipelineExecutableStatisticFormatKHR::UINT64 => stat.value.u64.to_string(),
                    vk::PipelineExecutableStatisticFormatKHR::FLOAT64 => {
                        format!("{:.3}", stat.value.f64)
                    }
                    _ => "?".to_string(),
                };
                parts.push(format!("{name} {value}"));
            }
        }
    }
    Ok(parts.join(", "))
}

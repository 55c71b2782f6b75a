//! What the Vulkan driver made of each WGSL shader: registers, shared memory and whatever else
//! it reports through `VK_KHR_pipeline_executable_properties` (NVIDIA's answer to `ptxas -v`,
//! for the code wgpu hands it).
//!
//! ```text
//! cargo run --release --example pipeline_stats -p deltakv-wgpu [-- NAME_PART ...]
//! ```
//!
//! Each shader of `deltakv_wgpu::SHADERS` and `deltakv_wgpu::coop::SHADERS`, with each of its
//! constant sets, is written to SPIR-V by naga with wgpu's Vulkan options (`tests/spirv`), built
//! into a compute pipeline on the device `DELTAKV_WGPU_ADAPTER` names (else the first discrete
//! GPU, else the first device), with every Vulkan 1.1-1.3 feature the device offers enabled,
//! and the driver's statistics printed one line per pipeline. Where the runtime launches a
//! shader in another form (its loops written out by `deltakv_wgpu::unroll`, and for the
//! attention built without loop bounding), that form follows as a second line marked `as
//! launched`: the registers and local memory of the code that runs. Arguments keep only the
//! shaders whose names contain one of them. Cooperative-matrix shaders are skipped on a device
//! without `VK_KHR_cooperative_matrix`.

#[path = "../tests/spirv/mod.rs"]
mod spirv;

use ash::vk;
use deltakv_wgpu::runtime::ADAPTER_ENV;
use deltakv_wgpu::{Constants, ShaderSource};
use std::ffi::{CStr, CString};

type Failure = Box<dyn std::error::Error>;

fn main() {
    if let Err(e) = run() {
        eprintln!("pipeline_stats: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Failure> {
    let filters: Vec<String> = std::env::args().skip(1).collect();
    let mut builds: Vec<Build> = Vec::new();
    for (source, sets) in deltakv_wgpu::SHADERS {
        for &set in *sets {
            builds.push(Build::table(source, set, false));
            if let Some(launched) = launched_form(source, set)? {
                builds.push(launched);
            }
        }
    }
    for (source, sets) in deltakv_wgpu::coop::SHADERS {
        for &set in *sets {
            builds.push(Build::table(source, set, true));
        }
    }
    builds.retain(|build| {
        filters.is_empty() || filters.iter().any(|f| build.label.contains(f.as_str()))
    });

    let vk = Vulkan::open()?;
    println!(
        "{}: driver statistics per pipeline (SPIR-V from naga with wgpu's Vulkan options)",
        vk.name
    );
    for build in builds {
        let label = &build.label;
        if build.needs_coop && !vk.coop {
            println!("{label}: skipped (no VK_KHR_cooperative_matrix)");
            continue;
        }
        match vk.statistics(&build.source, build.constants, build.loop_bounding) {
            Ok(line) => println!("{label}: {line}"),
            Err(e) => println!("{label}: failed: {e}"),
        }
    }
    Ok(())
}

/// One pipeline to build: a shader, its constants, and how the runtime builds it.
struct Build {
    label: String,
    source: ShaderSource,
    constants: Constants,
    needs_coop: bool,
    loop_bounding: bool,
}

impl Build {
    /// A shader of the tables as written, with loop bounding.
    fn table(source: &ShaderSource, constants: Constants, needs_coop: bool) -> Self {
        Self {
            label: format!("{} {constants:?}", source.name),
            source: *source,
            constants,
            needs_coop,
            loop_bounding: true,
        }
    }
}

/// The form the runtime launches `source` in, where it is not the table's: the attention's
/// loops written out (`kv::attend::attend_loops`) and built without loop bounding, the bands
/// decode's row loops written out (`gdn::decode_sources::unrolled`).
fn launched_form(source: &ShaderSource, constants: Constants) -> Result<Option<Build>, Failure> {
    let constant = |name: &str| {
        constants
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, value)| value as u32)
            .ok_or_else(|| format!("{}: no constant {name}", source.name))
    };
    use deltakv_wgpu::kv::{SOURCE_ATTEND_SHARED, SOURCE_ATTEND_SUBGROUP};
    let attention = [SOURCE_ATTEND_SUBGROUP.name, SOURCE_ATTEND_SHARED.name];
    let (launched, loop_bounding) = if attention.contains(&source.name) {
        let loops = deltakv_wgpu::kv::attend::attend_loops(constant("BITS_K")?);
        (deltakv_wgpu::unroll::unrolled(source, &loops)?, false)
    } else if source.name.starts_with("gdn_decode_bands") {
        let rows = constant("ROWS")?;
        (
            deltakv_wgpu::gdn::decode_sources::unrolled(source, rows)?,
            true,
        )
    } else {
        return Ok(None);
    };
    Ok(Some(Build {
        label: format!("{} {constants:?} as launched", source.name),
        source: launched,
        constants,
        needs_coop: false,
        loop_bounding,
    }))
}

/// The instance and a device with pipeline statistics, destroyed on drop.
struct Vulkan {
    _entry: ash::Entry,
    instance: ash::Instance,
    device: Option<ash::Device>,
    stats: Option<ash::khr::pipeline_executable_properties::Device>,
    name: String,
    coop: bool,
}

impl Drop for Vulkan {
    fn drop(&mut self) {
        // SAFETY: the device's children are destroyed by `Objects` before `statistics`
        // returns, so the device and then the instance have none left.
        unsafe {
            if let Some(device) = &self.device {
                device.destroy_device(None);
            }
            self.instance.destroy_instance(None);
        }
    }
}

impl Vulkan {
    fn open() -> Result<Self, Failure> {
        // SAFETY: loads the system's Vulkan loader; its entry points are used as Vulkan defines.
        let entry = unsafe { ash::Entry::load()? };
        let app = vk::ApplicationInfo::default().api_version(vk::API_VERSION_1_3);
        // SAFETY: a valid create info; the instance is destroyed by `Drop`.
        let instance = unsafe {
            entry.create_instance(
                &vk::InstanceCreateInfo::default().application_info(&app),
                None,
            )?
        };
        let mut vk = Vulkan {
            _entry: entry,
            instance,
            device: None,
            stats: None,
            name: String::new(),
            coop: false,
        };
        vk.open_device()?;
        Ok(vk)
    }

    fn open_device(&mut self) -> Result<(), Failure> {
        let instance = &self.instance;
        let wanted = std::env::var(ADAPTER_ENV)
            .unwrap_or_default()
            .trim()
            .to_string();
        // SAFETY: queries on a live instance and the physical devices it returned.
        unsafe {
            let devices = instance.enumerate_physical_devices()?;
            let name_of = |p: vk::PhysicalDevice| {
                let props = instance.get_physical_device_properties(p);
                props
                    .device_name_as_c_str()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned()
            };
            let physical = if wanted.is_empty() {
                devices
                    .iter()
                    .copied()
                    .find(|&p| {
                        instance.get_physical_device_properties(p).device_type
                            == vk::PhysicalDeviceType::DISCRETE_GPU
                    })
                    .or(devices.first().copied())
            } else {
                devices
                    .iter()
                    .copied()
                    .find(|&p| name_of(p).contains(wanted.as_str()))
            }
            .ok_or_else(|| format!("no Vulkan device (wanted: {ADAPTER_ENV}={wanted:?})"))?;
            self.name = name_of(physical);
            let name = &self.name;
            let api = instance
                .get_physical_device_properties(physical)
                .api_version;
            if vk::api_version_major(api) == 1 && vk::api_version_minor(api) < 3 {
                return Err(format!(
                    "{name}: Vulkan 1.3 is needed, the device has 1.{}",
                    vk::api_version_minor(api)
                )
                .into());
            }
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
                return Err(format!(
                    "{name}: the driver has no VK_KHR_pipeline_executable_properties"
                )
                .into());
            }
            self.coop = has(ash::khr::cooperative_matrix::NAME);

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
            if self.coop {
                features = features.push_next(&mut coop_features);
            }
            instance.get_physical_device_features2(physical, &mut features);
            let mut enabled = vec![ash::khr::pipeline_executable_properties::NAME.as_ptr()];
            if self.coop {
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
            if exec.pipeline_executable_info == vk::FALSE {
                device.destroy_device(None);
                return Err(format!("{name}: pipelineExecutableInfo is not offered").into());
            }
            self.stats = Some(ash::khr::pipeline_executable_properties::Device::new(
                instance, &device,
            ));
            self.device = Some(device);
        }
        Ok(())
    }

    /// One pipeline of `source` with `constants` (loop bounding as `loop_bounding` says), its
    /// statistics as `name value` pairs.
    fn statistics(
        &self,
        source: &ShaderSource,
        constants: Constants,
        loop_bounding: bool,
    ) -> Result<String, Failure> {
        let (Some(device), Some(stats)) = (&self.device, &self.stats) else {
            return Err("no device".into());
        };
        let words = spirv::spirv_of(source, constants, loop_bounding)?;
        let module = naga::front::wgsl::parse_str(source.text)?;
        let entry = CString::new(source.entry_point)?;
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
        let mut made = Objects {
            device,
            layouts: Vec::new(),
            layout: None,
            shader: None,
            pipeline: None,
        };
        // SAFETY: every handle is made on the live `device` from valid create infos and recorded
        // in `made`, which destroys them (in reverse) when this function returns.
        unsafe {
            for bindings in &groups {
                made.layouts.push(device.create_descriptor_set_layout(
                    &vk::DescriptorSetLayoutCreateInfo::default().bindings(bindings),
                    None,
                )?);
            }
            let layout = device.create_pipeline_layout(
                &vk::PipelineLayoutCreateInfo::default().set_layouts(&made.layouts),
                None,
            )?;
            made.layout = Some(layout);
            let shader = device
                .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&words), None)?;
            made.shader = Some(shader);
            let stage = vk::PipelineShaderStageCreateInfo::default()
                .stage(vk::ShaderStageFlags::COMPUTE)
                .module(shader)
                .name(&entry);
            let info = vk::ComputePipelineCreateInfo::default()
                .stage(stage)
                .layout(layout)
                .flags(vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR);
            let pipeline = device
                .create_compute_pipelines(vk::PipelineCache::null(), &[info], None)
                .map_err(|(_, e)| format!("pipeline creation: {e}"))?[0];
            made.pipeline = Some(pipeline);
            describe(stats, pipeline)
        }
    }
}

/// The Vulkan objects of one pipeline, destroyed in reverse on drop.
struct Objects<'a> {
    device: &'a ash::Device,
    layouts: Vec<vk::DescriptorSetLayout>,
    layout: Option<vk::PipelineLayout>,
    shader: Option<vk::ShaderModule>,
    pipeline: Option<vk::Pipeline>,
}

impl Drop for Objects<'_> {
    fn drop(&mut self) {
        // SAFETY: each handle was made on `device` and is used by nothing else by now.
        unsafe {
            if let Some(pipeline) = self.pipeline {
                self.device.destroy_pipeline(pipeline, None);
            }
            if let Some(shader) = self.shader {
                self.device.destroy_shader_module(shader, None);
            }
            if let Some(layout) = self.layout {
                self.device.destroy_pipeline_layout(layout, None);
            }
            for &layout in &self.layouts {
                self.device.destroy_descriptor_set_layout(layout, None);
            }
        }
    }
}

/// Every statistic of every executable of `pipeline`, as `name value` pairs (NVIDIA's "Local
/// Memory Size" is printed as the driver gives it: a value past 2^36 is not a byte count).
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

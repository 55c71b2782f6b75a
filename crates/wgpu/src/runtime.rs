//! The wgpu runtime of deltakv: one adapter, device and queue per process, and the compute
//! pipelines built from the WGSL shaders at first use.
//!
//! The adapter is the high-performance one wgpu offers (a discrete GPU before an integrated one
//! before a software rasteriser), or the first whose name contains `DELTAKV_WGPU_ADAPTER`
//! (case-insensitive; `lavapipe` and `llvmpipe` both pick Mesa's software Vulkan). Opening it
//! never panics: a machine without a Vulkan or Metal driver gets a one-line
//! `DeviceUnavailable` error ("no wgpu adapter: ..."). The wgpu calls of each operation run in
//! error scopes of the calling thread, so a validation or out-of-memory error comes back as
//! `Err` from the call that caused it, on its thread; a lost device is reported by every call
//! from then on.

use crate::scope::ErrorScope;
use deltakv_contract::{Error, Result, env};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// The environment variable that names the adapter to use (a substring of its name).
pub const ADAPTER_ENV: &str = "DELTAKV_WGPU_ADAPTER";

/// Set to `0`, the environment variable that keeps the shaders off subgroup operations (the
/// workgroup-memory path, as on an adapter without them); `1` or unset: subgroups where the
/// adapter has them. Other values are an error (as for every `DELTAKV_*` switch).
pub const SUBGROUPS_ENV: &str = "DELTAKV_WGPU_SUBGROUPS";

/// A size in MiB, the environment variable that caps the scratch buffer the runtime keeps
/// between calls (the chunked prefill's; default 2048, `0` keeps none): a call whose scratch
/// fits reuses it instead of allocating (and wgpu zero-filling) a new one.
pub const SCRATCH_CACHE_ENV: &str = "DELTAKV_WGPU_SCRATCH_CACHE_MIB";

const SCRATCH_CACHE_DEFAULT_MIB: u64 = 2048;

/// Set to `1`, the environment variable that opens the device with cooperative matrices (wgpu's
/// experimental `EXPERIMENTAL_COOPERATIVE_MATRIX`) where the adapter has the configuration the
/// kernels of [`crate::coop`] use. Off by default: wgpu marks the feature experimental, and on
/// the H100 the state pass built on it is slower than the f32 one (`0` or unset).
pub const COOP_ENV: &str = "DELTAKV_WGPU_COOP";

/// The GPU (or software device) that deltakv's wgpu ops run on.
pub struct Wgpu {
    device: wgpu::Device,
    queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    subgroups: bool,
    /// The device was opened with cooperative matrices and f16 shaders: the adapter has a
    /// 16 x 16 x 16 configuration with f16 operands and f32 accumulation (see [`crate::coop`]).
    coop16: bool,
    /// Why the device has no cooperative matrices when they were asked for.
    coop_note: Option<String>,
    /// Errors wgpu raised outside any error scope (wgpu calls a caller made through
    /// [`Wgpu::device`] or [`Wgpu::queue`] without one), in order, until [`Wgpu::check`].
    uncaptured: Arc<Mutex<Vec<String>>>,
    /// Why the device was lost, once it is: a lost device stays lost, so every later check
    /// and error scope reports it.
    lost: Arc<OnceLock<String>>,
    pipelines: Mutex<HashMap<PipelineKey, wgpu::ComputePipeline>>,
    /// Distinct 16-byte storage buffers that no shader reads ([`Wgpu::placeholder`]).
    placeholders: [wgpu::Buffer; PLACEHOLDERS],
    scratch: Mutex<Option<wgpu::Buffer>>,
}

/// Placeholders a bind group may need at once ([`Wgpu::placeholder`]).
const PLACEHOLDERS: usize = 3;

/// The backends deltakv uses: Vulkan (Linux, Windows, Android) and Metal (Apple).
const BACKENDS: wgpu::Backends = wgpu::Backends::VULKAN.union(wgpu::Backends::METAL);

/// The shader's name, its constants, and whether wgpu bounds its loops.
type PipelineKey = (&'static str, Vec<(&'static str, u64)>, bool);

impl std::fmt::Debug for Wgpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wgpu")
            .field("adapter", &self.info.name)
            .field("backend", &self.info.backend)
            .finish()
    }
}

fn unavailable(reason: impl Into<String>) -> Error {
    Error::DeviceUnavailable {
        device: "wgpu".to_string(),
        reason: reason.into(),
    }
}

/// A failure of the wgpu device, naming what was being done.
pub fn backend_error(what: &str, message: impl std::fmt::Display) -> Error {
    Error::Backend {
        device: "wgpu".to_string(),
        message: format!("{what} failed: {message}"),
    }
}

/// One compute shader: its WGSL text (preludes included) and its entry point.
#[derive(Clone, Copy, Debug)]
pub struct ShaderSource {
    pub name: &'static str,
    pub text: &'static str,
    pub entry_point: &'static str,
}

/// The longest the process waits at exit for the device's queued work.
const EXIT_DRAIN: std::time::Duration = std::time::Duration::from_secs(30);

unsafe extern "C" {
    /// The C library's exit hook (every platform wgpu runs on has it).
    fn atexit(callback: extern "C" fn()) -> std::ffi::c_int;
}

/// Makes the process wait, when it exits, until the device has finished the work queued on
/// it (at most [`EXIT_DRAIN`]: a device that never finishes does not hold the exit). Mesa's
/// lavapipe runs a queue's work, and compiles its shaders with LLVM, on threads of its own; a
/// process that exits while one of them compiles (a call refused after its output was
/// poisoned, say, and a test that ends there) had LLVM's exit-time destructors run under that
/// thread, which crashed in `exit` now and then with a cold shader cache. Exit hooks run in the
/// reverse order of registration and this one is registered after the driver loaded LLVM, so
/// the queue is drained first. Registered once, by [`Wgpu::get`]'s first success.
fn drain_at_exit() {
    extern "C" fn drain() {
        // A panic must not cross the C boundary; a poll that fails has nothing to wait for.
        let _ = std::panic::catch_unwind(|| {
            if let Ok(wgpu) = Wgpu::get() {
                let _ = wgpu.device.poll(wgpu::PollType::Wait {
                    submission_index: None,
                    timeout: Some(EXIT_DRAIN),
                });
            }
        });
    }
    // SAFETY: `drain` is a plain function with no arguments, callable at any time, as atexit
    // requires; a failed registration (no slot left) only leaves the exit as it was.
    unsafe {
        atexit(drain);
    }
}

impl Wgpu {
    /// The process's wgpu device, opened on first use. A machine without an adapter gets
    /// `DeviceUnavailable` with the reason, every time it asks.
    pub fn get() -> Result<&'static Wgpu> {
        static DEVICE: OnceLock<std::result::Result<Wgpu, String>> = OnceLock::new();
        DEVICE
            .get_or_init(|| {
                let opened = Wgpu::open().map_err(|e| e.to_string());
                if opened.is_ok() {
                    drain_at_exit();
                }
                opened
            })
            .as_ref()
            .map_err(|message| {
                let prefix = "device `wgpu` is not available: ";
                unavailable(message.strip_prefix(prefix).unwrap_or(message))
            })
    }

    fn open() -> Result<Wgpu> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends: BACKENDS,
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        let wanted = std::env::var(ADAPTER_ENV)
            .ok()
            .filter(|s| !s.trim().is_empty());
        let adapter = match wanted {
            Some(name) => pick_named(&instance, name.trim())?,
            None => pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                ..Default::default()
            }))
            .map_err(|e| {
                unavailable(format!(
                    "no wgpu adapter: {e} (no Vulkan or Metal driver found; on Linux install a Vulkan driver, e.g. Debian's mesa-vulkan-drivers)"
                ))
            })?,
        };
        let info = adapter.get_info();
        // The largest buffers the adapter allows (a state pool of B = 256 Qwen3-Next rows is
        // 512 MiB), and subgroup operations where it has them.
        let subgroups_allowed = env::choice(SUBGROUPS_ENV, &[("0", false), ("1", true)], true)?;
        let subgroups = adapter.features().contains(wgpu::Features::SUBGROUP)
            && info.subgroup_min_size >= 8
            && subgroups_allowed;
        let required_features = if subgroups {
            wgpu::Features::SUBGROUP
        } else {
            wgpu::Features::empty()
        };
        // Cooperative matrices (tensor cores on NVIDIA) where the adapter has the configuration
        // the kernels use; an experimental wgpu feature, so only asked for then.
        let coop_features =
            wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SHADER_F16;
        // The kernels take subgroups of exactly 32 invocations.
        let asked = env::choice(COOP_ENV, &[("0", false), ("1", true)], false)?;
        let coop_missing = if !adapter.features().contains(coop_features) {
            Some("the adapter has no cooperative matrices or f16 shaders".to_string())
        } else if !adapter
            .cooperative_matrix_properties()
            .iter()
            .any(crate::coop::is_f16_16x16x16)
        {
            Some("no 16x16x16 f16 -> f32 configuration".to_string())
        } else if (info.subgroup_min_size, info.subgroup_max_size) != (32, 32) {
            Some(format!(
                "subgroups of {}..={}, not 32",
                info.subgroup_min_size, info.subgroup_max_size
            ))
        } else {
            None
        };
        let wants_coop = asked && coop_missing.is_none();
        let open = |coop: bool| {
            let (features, experimental_features) = if coop {
                // SAFETY: asked for explicitly (`DELTAKV_WGPU_COOP=1`); wgpu's experimental
                // cooperative matrices are used only by the kernels of `crate::coop` and by
                // `gdn_chunk_state_coop`, with the one configuration the adapter reports (16 x
                // 16 x 16, f16 operands, f32 accumulation), subgroups of 32, every operand
                // uniform in its subgroup. Known hazard: naga 30 declares the Vulkan memory
                // model for such modules without the availability and visibility operations
                // that hand data between plain and cooperative accesses across a barrier (wgpu
                // issue 8805); `coop_split.wgsl` and `gdn_chunk_state_coop` rely on such
                // hand-offs, and the split product's test compares its staged form with one
                // that reads storage only.
                (required_features | coop_features, unsafe {
                    wgpu::ExperimentalFeatures::enabled()
                })
            } else {
                (required_features, wgpu::ExperimentalFeatures::disabled())
            };
            pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
                label: Some("deltakv"),
                required_features: features,
                required_limits: adapter.limits(),
                experimental_features,
                ..Default::default()
            }))
        };
        // A device refused with the experimental feature is asked for again without it.
        let (coop16, opened, coop_note) = match wants_coop.then(|| open(true)) {
            Some(Ok(opened)) => (true, Ok(opened), None),
            Some(Err(e)) => (
                false,
                open(false),
                Some(format!("the device was refused with them: {e}")),
            ),
            None => (false, open(false), coop_missing.filter(|_| asked)),
        };
        let (device, queue) = opened.map_err(|e| {
            unavailable(format!(
                "no wgpu adapter: {} refused a device: {e}",
                info.name
            ))
        })?;
        let uncaptured = Arc::new(Mutex::new(Vec::new()));
        let sink = uncaptured.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            lock(&sink).push(e.to_string());
        }));
        let lost = Arc::new(OnceLock::new());
        let sink = lost.clone();
        device.set_device_lost_callback(move |reason, message| {
            // The first report stands: it says why.
            let _ = sink.set(format!("device lost ({reason:?}): {message}"));
        });
        let placeholders = std::array::from_fn(|_| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("deltakv placeholder"),
                size: 16,
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            })
        });
        Ok(Wgpu {
            device,
            queue,
            info,
            subgroups,
            coop16,
            coop_note,
            uncaptured,
            lost,
            pipelines: Mutex::new(HashMap::new()),
            placeholders,
            scratch: Mutex::new(None),
        })
    }

    /// The adapter's name, e.g. "NVIDIA H100 80GB HBM3" or "llvmpipe (LLVM 15.0.6, 256 bits)".
    pub fn name(&self) -> &str {
        &self.info.name
    }

    /// The adapter's name, backend, driver and reduction path in one line.
    pub fn describe(&self) -> String {
        format!(
            "{} ({:?}, {:?}, driver {} {}; {} KiB of workgroup memory; {}{})",
            self.info.name,
            self.info.backend,
            self.info.device_type,
            self.info.driver,
            self.info.driver_info,
            self.device.limits().max_compute_workgroup_storage_size / 1024,
            if self.subgroups {
                format!(
                    "subgroups of {}..={}",
                    self.info.subgroup_min_size, self.info.subgroup_max_size
                )
            } else {
                "no subgroups: workgroup-memory sums".to_string()
            },
            match (&self.coop16, &self.coop_note) {
                (true, _) => "; cooperative matrices 16x16x16 f16 -> f32".to_string(),
                (false, Some(why)) => format!("; no cooperative matrices: {why}"),
                (false, None) => String::new(),
            }
        )
    }

    /// True when the device has cooperative matrices with 16 x 16 x 16 f16 operands and f32
    /// accumulation (tensor cores on NVIDIA): `DELTAKV_WGPU_COOP=1` and an adapter with them
    /// and subgroups of 32.
    pub fn has_coop16(&self) -> bool {
        self.coop16
    }

    /// True when the shaders use subgroup operations: the adapter has them, in subgroups of at
    /// least 8 invocations, and `DELTAKV_WGPU_SUBGROUPS` is not `0`.
    pub fn has_subgroups(&self) -> bool {
        self.subgroups
    }

    /// The adapter's smallest subgroup size (meaningful where [`Wgpu::has_subgroups`]).
    pub fn subgroup_min_size(&self) -> u32 {
        self.info.subgroup_min_size
    }

    pub fn device(&self) -> &wgpu::Device {
        &self.device
    }

    pub fn queue(&self) -> &wgpu::Queue {
        &self.queue
    }

    /// A zeroed buffer of `bytes` rounded up to whole 4-byte words (at least one), `usage`. A
    /// size past the adapter's largest buffer, out of memory or a lost device is an `Err`.
    pub fn zeroed_buffer(
        &self,
        label: &str,
        bytes: usize,
        usage: wgpu::BufferUsages,
    ) -> Result<wgpu::Buffer> {
        let size = (bytes.max(1).div_ceil(4) * 4) as u64;
        let max = self.device.limits().max_buffer_size;
        if size > max {
            return Err(backend_error(
                &format!("allocating {bytes} bytes"),
                format!("the adapter's largest buffer is {max} bytes"),
            ));
        }
        // wgpu zero-fills new buffers.
        let scope = self.error_scope();
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage,
            mapped_at_creation: false,
        });
        scope.finish(&format!("allocating {bytes} bytes on the device"))?;
        Ok(buffer)
    }

    /// A buffer holding `contents` (zero-padded to whole words), `usage` plus `COPY_DST`; errors
    /// as [`Wgpu::zeroed_buffer`] (wgpu's `create_buffer_init` panics on a buffer that failed
    /// to be created).
    pub fn buffer_with(
        &self,
        label: &str,
        contents: &[u8],
        usage: wgpu::BufferUsages,
    ) -> Result<wgpu::Buffer> {
        let buffer =
            self.zeroed_buffer(label, contents.len(), usage | wgpu::BufferUsages::COPY_DST)?;
        // write_buffer takes whole words; the tail past `contents` stays zero.
        let scope = self.error_scope();
        let whole = contents.len() / 4 * 4;
        if whole > 0 {
            self.queue.write_buffer(&buffer, 0, &contents[..whole]);
        }
        if whole < contents.len() {
            let mut tail = [0u8; 4];
            tail[..contents.len() - whole].copy_from_slice(&contents[whole..]);
            self.queue.write_buffer(&buffer, whole as u64, &tail);
        }
        scope.finish(&format!("writing {label}"))?;
        Ok(buffer)
    }

    /// A 16-byte storage buffer that no shader reads, bound where a kernel's optional output is
    /// not asked for (made once, so a call allocates nothing for it). `index` (below
    /// `PLACEHOLDERS`) tells them apart: a bind group with several such bindings takes a
    /// different one for each, since wgpu refuses a buffer bound writable twice in one dispatch.
    pub(crate) fn placeholder(&self, index: usize) -> &wgpu::Buffer {
        &self.placeholders[index]
    }

    /// A storage buffer of at least `bytes` for a call's scratch: the one kept from an earlier
    /// call where it is large enough, else a new one, kept for later calls when it is within
    /// `DELTAKV_WGPU_SCRATCH_CACHE_MIB`. Calls share it, so a submission must write every
    /// scratch word it reads before reading it (the queue orders submissions, and wgpu the
    /// passes within one).
    pub(crate) fn scratch(&self, bytes: u64) -> Result<wgpu::Buffer> {
        let mut kept = lock(&self.scratch);
        if let Some(buffer) = kept.as_ref().filter(|b| b.size() >= bytes) {
            return Ok(buffer.clone());
        }
        let cap_mib = env::number(SCRATCH_CACHE_ENV, |_: &u64| true, "a size in MiB")?
            .unwrap_or(SCRATCH_CACHE_DEFAULT_MIB);
        let scope = self.error_scope();
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("deltakv scratch"),
            size: bytes.max(16),
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        scope.finish(&format!("allocating {bytes} bytes of scratch"))?;
        // A smaller kept buffer is released here (and freed once the launches holding it are).
        *kept = (bytes <= cap_mib << 20).then(|| buffer.clone());
        Ok(buffer)
    }

    /// The bind group of `pipeline`'s group 0 over `entries` (binding, name, buffer): a buffer
    /// larger than the adapter's largest storage binding is refused by name, then any error
    /// wgpu reports while binding comes back naming `label`.
    pub fn bind_group(
        &self,
        label: &str,
        pipeline: &wgpu::ComputePipeline,
        entries: &[(u32, &str, &wgpu::Buffer)],
    ) -> Result<wgpu::BindGroup> {
        let largest = self.device.limits().max_storage_buffer_binding_size;
        for &(_, name, buffer) in entries {
            if buffer.size() > largest {
                return Err(Error::Unsupported(format!(
                    "{label}: {name} takes {} bytes, more than the adapter's largest storage binding ({largest} bytes); split the call",
                    buffer.size()
                )));
            }
        }
        let bound: Vec<wgpu::BindGroupEntry> = entries
            .iter()
            .map(|&(binding, _, buffer)| wgpu::BindGroupEntry {
                binding,
                resource: buffer.as_entire_binding(),
            })
            .collect();
        let scope = self.error_scope();
        let group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(label),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &bound,
        });
        scope.finish(&format!("binding {label}'s buffers"))?;
        Ok(group)
    }

    /// The error scopes of one operation's wgpu calls on this thread; its
    /// [`ErrorScope::finish`] returns what they raised (see [`crate::scope`]).
    pub(crate) fn error_scope(&self) -> ErrorScope<'_> {
        ErrorScope::new(self)
    }

    /// Records commands into one command buffer with `record`, submits it (without waiting)
    /// and returns what wgpu raised doing so, naming `what`.
    pub(crate) fn submit_commands(
        &self,
        what: &str,
        record: impl FnOnce(&mut wgpu::CommandEncoder),
    ) -> Result<()> {
        let scope = self.error_scope();
        let mut encoder = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
        record(&mut encoder);
        self.queue.submit([encoder.finish()]);
        scope.finish(what)
    }

    /// [`Wgpu::submit_commands`] of one compute pass that `record` fills.
    pub(crate) fn submit_pass(
        &self,
        what: &str,
        record: impl FnOnce(&mut wgpu::ComputePass<'_>),
    ) -> Result<()> {
        self.submit_commands(what, |encoder| {
            record(&mut encoder.begin_compute_pass(&wgpu::ComputePassDescriptor::default()));
        })
    }

    /// Why the device was lost, if it was.
    pub(crate) fn lost(&self) -> Option<&str> {
        self.lost.get().map(String::as_str)
    }

    /// `Err` naming `what` was being done when the device is lost, else with the first error
    /// wgpu raised outside any error scope since the last check (validation, out of memory),
    /// clearing them. deltakv's own operations report their errors themselves, each to its
    /// caller; what is left here comes from wgpu calls made directly on [`Wgpu::device`] or
    /// [`Wgpu::queue`] outside a scope, which have no owner: whichever thread checks next sees
    /// them (wgpu's `Device::push_error_scope` keeps such calls' errors on their own thread).
    pub fn check(&self, what: &str) -> Result<()> {
        if let Some(lost) = self.lost() {
            return Err(one_line_error(what, lost));
        }
        let mut uncaptured = lock(&self.uncaptured);
        if uncaptured.is_empty() {
            return Ok(());
        }
        let first = uncaptured.remove(0);
        uncaptured.clear();
        Err(one_line_error(what, &first))
    }

    /// Waits until the queue is idle; a lost device, or an error raised outside any error
    /// scope ([`Wgpu::check`]), shows up here.
    pub fn synchronize(&self) -> Result<()> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| backend_error("waiting for the device", e))?;
        self.check("waiting for the device")
    }

    /// The compute pipeline of `source` with its `override` constants set to `constants`,
    /// built on first use.
    pub fn pipeline(
        &self,
        source: &ShaderSource,
        constants: &[(&'static str, u32)],
    ) -> Result<wgpu::ComputePipeline> {
        self.build_pipeline(source, constants, true)
    }

    /// [`Wgpu::pipeline`] without wgpu's loop bounding (a counter naga adds to every loop so
    /// that no shader loops forever, which can keep a driver's compiler from unrolling them).
    ///
    /// # Safety
    ///
    /// Every loop of `source` must end for every input (wgpu's rule for
    /// `ShaderRuntimeChecks::force_loop_bounding`); bounds checks stay on.
    pub unsafe fn pipeline_without_loop_bounding(
        &self,
        source: &ShaderSource,
        constants: &[(&'static str, u32)],
    ) -> Result<wgpu::ComputePipeline> {
        self.build_pipeline(source, constants, false)
    }

    fn build_pipeline(
        &self,
        source: &ShaderSource,
        constants: &[(&'static str, u32)],
        loop_bounding: bool,
    ) -> Result<wgpu::ComputePipeline> {
        let key: PipelineKey = (
            source.name,
            constants.iter().map(|&(n, v)| (n, u64::from(v))).collect(),
            loop_bounding,
        );
        if let Some(p) = lock(&self.pipelines).get(&key) {
            return Ok(p.clone());
        }
        let descriptor = wgpu::ShaderModuleDescriptor {
            label: Some(source.name),
            source: wgpu::ShaderSource::Wgsl(source.text.into()),
        };
        let scope = self.error_scope();
        let module = if loop_bounding {
            self.device.create_shader_module(descriptor)
        } else {
            let mut checks = wgpu::ShaderRuntimeChecks::checked();
            checks.force_loop_bounding = false;
            // SAFETY: the caller's promise (`pipeline_without_loop_bounding`): every loop of
            // the shader ends; every other check stays on.
            unsafe { self.device.create_shader_module_trusted(descriptor, checks) }
        };
        scope.finish(&format!("compiling shader `{}`", source.name))?;
        let values: Vec<(&str, f64)> = constants.iter().map(|&(n, v)| (n, f64::from(v))).collect();
        let scope = self.error_scope();
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(source.name),
                layout: None,
                module: &module,
                entry_point: Some(source.entry_point),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &values,
                    zero_initialize_workgroup_memory: false,
                },
                cache: None,
            });
        scope.finish(&format!("building pipeline `{}`", source.name))?;
        lock(&self.pipelines).insert(key, pipeline.clone());
        Ok(pipeline)
    }
}

/// The first adapter whose name contains `name` (case-insensitive; `lavapipe` also matches
/// Mesa's `llvmpipe`), else an error listing the adapters there are.
fn pick_named(instance: &wgpu::Instance, name: &str) -> Result<wgpu::Adapter> {
    let adapters = pollster::block_on(instance.enumerate_adapters(BACKENDS));
    let needle = name.to_lowercase();
    let matches = |adapter_name: &str| {
        let adapter_name = adapter_name.to_lowercase();
        adapter_name.contains(&needle)
            || (needle == "lavapipe" && adapter_name.contains("llvmpipe"))
    };
    let names: Vec<String> = adapters.iter().map(|a| a.get_info().name).collect();
    adapters
        .into_iter()
        .find(|a| matches(&a.get_info().name))
        .ok_or_else(|| {
            unavailable(format!(
                "no wgpu adapter: none is named like {ADAPTER_ENV}={name} (adapters here: {})",
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            ))
        })
}

/// [`backend_error`] with wgpu's `message` folded onto one line: its messages span lines (an
/// error, then "Caused by:" and its causes), joined here by ": ".
pub(crate) fn one_line_error(what: &str, message: &str) -> Error {
    let lines: Vec<&str> = message
        .lines()
        .map(|l| l.trim().trim_end_matches(':'))
        .filter(|l| !l.is_empty())
        .collect();
    backend_error(what, lines.join(": "))
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

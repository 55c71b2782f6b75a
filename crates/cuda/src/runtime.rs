//! The CUDA runtime of deltakv: one context on one GPU per process, one stream that every op
//! and copy is ordered on, and the kernels compiled at first use. [`Cuda::on_stream`] gives a
//! handle that launches the same kernels on a caller's stream instead (an engine's current
//! stream, handed over through DLPack). An op that runs two kernels side by side forks a
//! second stream off the op's stream and joins it back before returning
//! ([`Cuda::fork_side`], [`Cuda::join_side`]), so to a caller every op is still one stream's work.
//!
//! Opening the device never panics: libcuda is probed before cudarc touches it (cudarc panics
//! when the library is missing), and every failure becomes a one-line `Err`.

use crate::compile::{self, Compiled, KernelSource};
use cudarc::driver::sys::{self, CUevent_flags};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaStream, DeviceRepr, DriverError, LaunchConfig,
};
use deltakv_contract::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// The GPU that deltakv's CUDA ops run on, with its stream and compiled kernels.
pub struct Cuda {
    context: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    name: String,
    arch: String,
    multiprocessors: usize,
    /// The second stream of [`Cuda::fork_side`], made on first use and shared with the
    /// handles of [`Cuda::on_stream`].
    side: Arc<OnceLock<Arc<CudaStream>>>,
    /// Shared with the handles of [`Cuda::on_stream`]: a kernel is compiled once per process.
    modules: Arc<Mutex<HashMap<&'static str, Arc<CudaModule>>>>,
    functions: Arc<Mutex<HashMap<(&'static str, &'static str), CudaFunction>>>,
}

impl std::fmt::Debug for Cuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cuda")
            .field("name", &self.name)
            .field("arch", &self.arch)
            .finish()
    }
}

/// True when libcuda can be opened: probed when cudarc loads it at run time (cudarc panics
/// on a missing library), always when it was linked at build time (feature `dynamic-linking`:
/// the loader started the process with it).
fn driver_present() -> bool {
    #[cfg(not(feature = "dynamic-linking"))]
    // SAFETY: only tries to open the library by its usual names.
    return unsafe { cudarc::driver::sys::is_culib_present() };
    #[cfg(feature = "dynamic-linking")]
    return true;
}

/// Wraps a driver failure in deltakv's error, naming what was being done.
pub fn driver_error(what: &str, e: DriverError) -> Error {
    Error::Backend {
        device: "cuda".to_string(),
        message: format!("{what} failed: {e}"),
    }
}

fn unavailable(reason: impl Into<String>) -> Error {
    Error::DeviceUnavailable {
        device: "cuda".to_string(),
        reason: reason.into(),
    }
}

/// Buffers are stream-ordered allocations from the device's default memory pool, which by
/// default hands its memory back to the system at every synchronisation, so each prefill call
/// would map its scratch (hundreds of MB at serving shapes) again. The pool keeps up to
/// `DELTAKV_CUDA_POOL_KEEP_BYTES` (default: all it holds) for reuse instead, as PyTorch's
/// caching allocator does with its own.
fn keep_pool_memory(context: &CudaContext, ordinal: usize) -> Result<()> {
    use cudarc::driver::sys;
    // Without memory pools (some older or virtualised GPUs) allocations are plain ones.
    let pools = context
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)
        .map_err(|e| driver_error("reading the memory-pool support", e))?;
    if pools == 0 {
        return Ok(());
    }
    let keep = deltakv_contract::env::number(
        "DELTAKV_CUDA_POOL_KEEP_BYTES",
        |_: &u64| true,
        "a byte count",
    )?
    .unwrap_or(u64::MAX);
    let device = cudarc::driver::result::device::get(ordinal as i32)
        .map_err(|e| driver_error("opening the device", e))?;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut threshold = keep;
    // SAFETY: `device` is a valid device handle; both calls write or read only the locals
    // passed to them.
    unsafe {
        sys::cuDeviceGetDefaultMemPool(&mut pool, device)
            .result()
            .map_err(|e| driver_error("reading the device's memory pool", e))?;
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
        .result()
        .map_err(|e| driver_error("setting the memory pool's release threshold", e))?;
    }
    Ok(())
}

/// The `--gpu-architecture` NVRTC is asked for on a device of compute capability
/// `major.minor`: the arch-specific target on Hopper and later (`sm_90a`, `sm_100a`), where
/// the kernels use what that target has (the prefill's state walks take wgmma on `sm_90a` only,
/// mma.sync elsewhere).
pub fn arch_for(major: i32, minor: i32) -> String {
    if major >= 9 {
        format!("sm_{major}{minor}a")
    } else {
        format!("sm_{major}{minor}")
    }
}

/// `DELTAKV_CUDA_ARCH` (for tests and comparisons): the target to compile for instead of
/// [`arch_for`]'s, e.g. `sm_90` on an H100 to run the kernels' portable forms. It must be the
/// device's own compute capability, with or without the `a`.
fn arch_from_env(major: i32, minor: i32) -> Result<String> {
    let own = format!("sm_{major}{minor}");
    match deltakv_contract::env::text("DELTAKV_CUDA_ARCH")? {
        None => Ok(arch_for(major, minor)),
        Some(arch) if arch == own || arch == format!("{own}a") => Ok(arch),
        Some(arch) => Err(Error::InvalidValue(format!(
            "DELTAKV_CUDA_ARCH={arch}: expected {own} or {own}a for this device"
        ))),
    }
}

impl Cuda {
    /// The process's CUDA device (the first GPU, or `DELTAKV_CUDA_DEVICE`), opened on first
    /// use. A machine without libcuda, without a GPU or without NVRTC gets
    /// `DeviceUnavailable` with the reason, every time it asks.
    pub fn get() -> Result<&'static Cuda> {
        static DEVICE: OnceLock<std::result::Result<Cuda, String>> = OnceLock::new();
        DEVICE
            .get_or_init(|| Cuda::open().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|message| {
                // Keep the reason alone: the Display of DeviceUnavailable adds the prefix.
                let prefix = "device `cuda` is not available: ";
                unavailable(message.strip_prefix(prefix).unwrap_or(message))
            })
    }

    fn open() -> Result<Cuda> {
        if !driver_present() {
            return Err(unavailable(
                "no CUDA device: libcuda.so (the NVIDIA driver) was not found",
            ));
        }
        cudarc::driver::result::init()
            .map_err(|e| unavailable(format!("no CUDA device: cuInit failed: {e}")))?;
        let count =
            CudaContext::device_count().map_err(|e| unavailable(format!("no CUDA device: {e}")))?;
        if count < 1 {
            return Err(unavailable("no CUDA device: the driver reports no GPU"));
        }
        let ordinal = deltakv_contract::env::number(
            "DELTAKV_CUDA_DEVICE",
            |&o: &usize| o < count as usize,
            &format!("a GPU index below {count}"),
        )
        .map_err(|e| unavailable(e.to_string()))?
        .unwrap_or(0);
        if !compile::nvrtc_present() {
            return Err(unavailable(compile::nvrtc_missing()));
        }
        let context = CudaContext::new(ordinal)
            .map_err(|e| unavailable(format!("no CUDA device: opening GPU {ordinal}: {e}")))?;
        // One stream orders every op and copy (a side stream only ever runs between a fork from
        // it and a join back), so cudarc's per-buffer event tracking would only add an event
        // record to every launch.
        // SAFETY: no buffer exists yet, and all work is ordered on the stream below.
        unsafe { context.disable_event_tracking() };
        let (major, minor) = context
            .compute_capability()
            .map_err(|e| driver_error("reading the compute capability", e))?;
        let name = context
            .name()
            .map_err(|e| driver_error("reading the GPU name", e))?;
        let multiprocessors = context
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(|e| driver_error("reading the multiprocessor count", e))?
            as usize;
        let stream = context
            .new_stream()
            .map_err(|e| driver_error("creating a stream", e))?;
        keep_pool_memory(&context, ordinal)?;
        Ok(Cuda {
            context,
            stream,
            name,
            arch: arch_from_env(major, minor)?,
            multiprocessors,
            side: Arc::default(),
            modules: Arc::default(),
            functions: Arc::default(),
        })
    }

    /// A handle on the same GPU and kernels whose ops, copies and allocations are all queued on
    /// `cu_stream`, a stream that another library owns (PyTorch's current stream, CuPy's), so
    /// deltakv's work is ordered with the caller's without events or waits. Buffers allocated
    /// through the handle are freed on that stream too (stream-ordered), after the work the
    /// caller queued there before dropping them. A null `cu_stream` is the legacy default
    /// stream.
    ///
    /// # Safety
    /// `cu_stream` must be a live stream of this device's primary context (the one PyTorch and
    /// CuPy use), outliving the handle and every buffer allocated through it.
    pub unsafe fn on_stream(&self, cu_stream: cudarc::driver::sys::CUstream) -> Cuda {
        // SAFETY: the caller's contract; the wrapper never destroys the stream.
        let stream = unsafe { self.context.wrap_borrowed_stream(cu_stream) };
        Cuda {
            context: self.context.clone(),
            stream,
            name: self.name.clone(),
            arch: self.arch.clone(),
            multiprocessors: self.multiprocessors,
            side: self.side.clone(),
            modules: self.modules.clone(),
            functions: self.functions.clone(),
        }
    }

    /// The device's index (what `DELTAKV_CUDA_DEVICE` chose; 0 by default).
    pub fn ordinal(&self) -> usize {
        self.context.ordinal()
    }

    /// The GPU's name, e.g. "NVIDIA H100 80GB HBM3".
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The architecture kernels are compiled for, e.g. `sm_90a`.
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// Streaming multiprocessors on the GPU.
    pub fn multiprocessors(&self) -> usize {
        self.multiprocessors
    }

    /// The stream every deltakv op and copy of this handle runs on: deltakv's own, or the
    /// caller's (see [`Cuda::on_stream`]).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The driver context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.context
    }

    /// The side stream, made to wait for everything queued on [`Cuda::stream`] so far: work
    /// queued on it next runs beside what the stream runs next. Every fork must be followed by
    /// [`Cuda::join_side`] before the op returns. The side stream is shared by the handles of
    /// one GPU, so two threads forking at once order their side work one after the other
    /// (correct, not concurrent); while one stream is being captured into a CUDA graph, a
    /// second thread's op that forks would be drawn into that capture (or refused by the
    /// driver), so capture on one thread at a time. The stream is made at the first fork: make
    /// one call that forks (a relayed prefill) before capturing, as a warm-up launch does.
    pub fn fork_side(&self) -> Result<Arc<CudaStream>> {
        let side = match self.side.get() {
            Some(side) => side.clone(),
            None => {
                let made = self
                    .context
                    .new_stream()
                    .map_err(|e| driver_error("creating a second stream", e))?;
                self.side.get_or_init(|| made).clone()
            }
        };
        let event = self
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(|e| driver_error("recording an event", e))?;
        side.wait(&event)
            .map_err(|e| driver_error("ordering the second stream", e))?;
        Ok(side)
    }

    /// Makes [`Cuda::stream`] wait for everything queued on `side` (from [`Cuda::fork_side`]).
    pub fn join_side(&self, side: &CudaStream) -> Result<()> {
        let event = side
            .record_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(|e| driver_error("recording an event", e))?;
        self.stream
            .wait(&event)
            .map_err(|e| driver_error("joining the second stream", e))
    }

    /// Queues `function` on `stream` as the programmatic dependent of the kernel queued there
    /// before it (`cuLaunchKernelEx` with programmatic stream serialization, kept by CUDA graph
    /// capture): it may launch once every block of that kernel has run
    /// `griddepcontrol.launch_dependents` (or ended), and its blocks must run
    /// `griddepcontrol.wait` before reading what that kernel writes. `param` is the kernel's
    /// one argument, a parameter struct (plain data the kernel reads by value).
    ///
    /// # Safety
    ///
    /// As for any kernel launch: `param` must be the struct `function` takes, pointing at live
    /// buffers of the sizes the kernel indexes under `config`.
    pub unsafe fn launch_programmatic_dependent<P: DeviceRepr>(
        &self,
        stream: &CudaStream,
        function: &CudaFunction,
        config: LaunchConfig,
        param: &P,
    ) -> std::result::Result<(), DriverError> {
        self.context.bind_to_thread()?;
        // SAFETY: an all-zero launch attribute is a valid value of the C struct; the id and
        // the one union field this id reads are set below.
        let mut attribute: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attribute.id =
            sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attribute.value.programmaticStreamSerializationAllowed = 1;
        let launch = sys::CUlaunchConfig {
            gridDimX: config.grid_dim.0,
            gridDimY: config.grid_dim.1,
            gridDimZ: config.grid_dim.2,
            blockDimX: config.block_dim.0,
            blockDimY: config.block_dim.1,
            blockDimZ: config.block_dim.2,
            sharedMemBytes: config.shared_mem_bytes,
            hStream: stream.cu_stream(),
            attrs: &mut attribute,
            numAttrs: 1,
        };
        let mut args = [(param as *const P).cast_mut().cast::<std::ffi::c_void>()];
        // SAFETY: the configuration and its attribute live through the call, which copies them
        // and the argument it points at; the argument is the caller's (see # Safety).
        unsafe {
            sys::cuLaunchKernelEx(
                &launch,
                function.cu_function(),
                args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
    }

    /// Waits for all work queued on deltakv's stream; a kernel fault shows up here.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| driver_error("waiting for the GPU", e))
    }

    /// The kernel `function` of `source`, compiling and loading the source on first use.
    pub fn function(&self, source: &KernelSource, function: &'static str) -> Result<CudaFunction> {
        let key = (source.name, function);
        if let Some(f) = lock(&self.functions).get(&key) {
            return Ok(f.clone());
        }
        let module = self.module(source)?;
        let f = module
            .load_function(function)
            .map_err(|e| driver_error(&format!("loading kernel `{function}`"), e))?;
        // Every kernel may take as much dynamic shared memory as the device allows a block
        // (beyond the 48 KB default), once, here: launches then just name what they use.
        use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
        let optin = self
            .context
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .map_err(|e| driver_error("reading the shared-memory limit", e))?;
        let static_bytes = f
            .get_attribute(CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
            .map_err(|e| driver_error(&format!("reading kernel `{function}`"), e))?;
        f.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            optin - static_bytes,
        )
        .map_err(|e| {
            driver_error(
                &format!("raising kernel `{function}`'s shared-memory limit"),
                e,
            )
        })?;
        lock(&self.functions).insert(key, f.clone());
        Ok(f)
    }

    /// Registers and local memory per thread (spills and stack) of every kernel of `source`,
    /// as the driver reports them once the image is loaded: the check that holds where NVRTC
    /// gives no ptxas report.
    pub fn kernel_local_memory(&self, source: &KernelSource) -> Result<Vec<(String, i32, i32)>> {
        let module = self.module(source)?;
        let names = compile::compile(source, &self.arch)?.kernel_names();
        let mut kernels = Vec::with_capacity(names.len());
        for name in names {
            let reading = |e| driver_error(&format!("reading kernel `{name}`"), e);
            let f = module.load_function(&name).map_err(reading)?;
            let registers = f.num_regs().map_err(reading)?;
            let local = f.local_size_bytes().map_err(reading)?;
            kernels.push((name, registers, local));
        }
        Ok(kernels)
    }

    fn module(&self, source: &KernelSource) -> Result<Arc<CudaModule>> {
        if let Some(m) = lock(&self.modules).get(source.name) {
            return Ok(m.clone());
        }
        let Compiled { cubin, .. } = compile::compile(source, &self.arch)?;
        let module = self
            .context
            .load_module(cudarc::nvrtc::Ptx::from_binary(cubin))
            .map_err(|e| driver_error(&format!("loading module `{}`", source.name), e))?;
        lock(&self.modules).insert(source.name, module.clone());
        Ok(module)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

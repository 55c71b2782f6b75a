//! Tensors whose storage is on the GPU: a shape, a dtype and device memory, either owned by
//! deltakv or borrowed from the caller (an engine's own activations and state pool, used in
//! place with no copy). Copies between host and device happen only through
//! [`CudaTensor::upload`] and [`CudaTensor::download`]; ops take and return `CudaTensor`s.

use crate::runtime::{Cuda, driver_error};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use deltakv_contract::tensor::TensorMeta;
use deltakv_contract::{DType, Error, HostTensor, Result};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

static POISON_SCRATCH: AtomicBool = AtomicBool::new(false);

/// Makes [`CudaTensor::scratch`] fill new scratch memory with 0xFF bytes (NaN in every float
/// type), so a kernel that reads an element it never wrote shows it: the GPU test suites turn
/// it on. `DELTAKV_POISON_SCRATCH=1` turns it on for a whole process (`0` or unset: off; any
/// other value makes every scratch allocation an error naming the values it takes).
pub fn poison_scratch(on: bool) {
    POISON_SCRATCH.store(on, Ordering::Relaxed);
}

fn scratch_poisoned() -> Result<bool> {
    static FROM_ENV: OnceLock<std::result::Result<bool, String>> = OnceLock::new();
    // The variable is checked even where `poison_scratch(true)` already decided, so that a
    // value it does not take is never ignored.
    let from_env = FROM_ENV
        .get_or_init(|| {
            let choices = [("1", true), ("0", false)];
            deltakv_contract::env::choice("DELTAKV_POISON_SCRATCH", &choices, false)
                .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(Error::InvalidValue)?;
    Ok(from_env || POISON_SCRATCH.load(Ordering::Relaxed))
}

enum Storage {
    /// Allocated by deltakv, freed on drop.
    Owned(CudaSlice<u8>),
    /// A caller's allocation: read and written in place, never freed here.
    Borrowed { address: u64 },
}

/// A dense, row-major tensor in GPU memory.
pub struct CudaTensor {
    shape: Vec<usize>,
    dtype: DType,
    storage: Storage,
}

impl std::fmt::Debug for CudaTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaTensor")
            .field("shape", &self.shape)
            .field("dtype", &self.dtype)
            .field(
                "borrowed",
                &matches!(self.storage, Storage::Borrowed { .. }),
            )
            .finish()
    }
}

fn byte_len(shape: &[usize], dtype: DType) -> Result<usize> {
    shape
        .iter()
        .try_fold(dtype.size_in_bytes(), |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| Error::InvalidValue(format!("tensor shape {shape:?} is too large")))
}

impl CudaTensor {
    /// Copies a host tensor to the GPU.
    pub fn upload(cuda: &Cuda, host: &HostTensor) -> Result<Self> {
        let bytes = cuda
            .stream()
            .clone_htod(&host.to_le_bytes())
            .map_err(|e| driver_error("copying a tensor to the GPU", e))?;
        Ok(Self {
            shape: host.shape().to_vec(),
            dtype: host.dtype(),
            storage: Storage::Owned(bytes),
        })
    }

    /// A view of a caller's device buffer at `address` as a tensor of `shape` and `dtype`, with
    /// no copy: ops read it, and an op that updates its argument in place (decode's pool)
    /// writes it. deltakv never frees it. The address must be non-null and aligned to the
    /// element size (a state pool, read with vector accesses, to 16 bytes: decode checks).
    ///
    /// # Safety
    /// `address` must be a live allocation of at least `shape x dtype` bytes in deltakv's CUDA
    /// context (the device's primary context: what PyTorch, CuPy and the runtime API use),
    /// outliving the view, and no other work may write it while deltakv's stream uses it
    /// (order the caller's stream with [`Cuda::synchronize`] or events).
    pub unsafe fn from_device_ptr(address: u64, shape: Vec<usize>, dtype: DType) -> Result<Self> {
        byte_len(&shape, dtype)?;
        let align = dtype.size_in_bytes() as u64;
        if address == 0 || !address.is_multiple_of(align) {
            return Err(Error::InvalidValue(format!(
                "device address {address:#x} must be non-null and aligned to its {align}-byte {dtype} elements"
            )));
        }
        Ok(Self {
            shape,
            dtype,
            storage: Storage::Borrowed { address },
        })
    }

    /// A tensor of `shape` and `dtype` with every byte zero.
    pub fn zeros(cuda: &Cuda, shape: Vec<usize>, dtype: DType) -> Result<Self> {
        let len = byte_len(&shape, dtype)?;
        let bytes = cuda
            .stream()
            .alloc_zeros::<u8>(len.max(1))
            .map_err(|e| driver_error(&format!("allocating {len} bytes on the GPU"), e))?;
        Ok(Self {
            shape,
            dtype,
            storage: Storage::Owned(bytes),
        })
    }

    /// Device memory for a call's intermediate results, which its kernels write in full before
    /// they read them: not cleared, since a clear would be one more pass over device memory on
    /// every call. Poisoned instead (every byte 0xFF) when [`poison_scratch`] is on.
    pub fn scratch(cuda: &Cuda, shape: Vec<usize>, dtype: DType) -> Result<Self> {
        if scratch_poisoned()? {
            return Self::poisoned(cuda, shape, dtype);
        }
        let len = byte_len(&shape, dtype)?;
        // SAFETY: the bytes are not read before a kernel ordered on this stream writes them
        // (the contract of `scratch` stated above, which its callers keep).
        let bytes = unsafe { cuda.stream().alloc::<u8>(len.max(1)) }
            .map_err(|e| driver_error(&format!("allocating {len} bytes on the GPU"), e))?;
        Ok(Self {
            shape,
            dtype,
            storage: Storage::Owned(bytes),
        })
    }

    /// A tensor of `shape` and `dtype` whose every byte is 0xFF (NaN for the float types), so
    /// an element a kernel forgets to write shows up.
    pub fn poisoned(cuda: &Cuda, shape: Vec<usize>, dtype: DType) -> Result<Self> {
        let mut t = Self::zeros(cuda, shape, dtype)?;
        let len = t.byte_len();
        let address = t.device_address_mut(cuda);
        // SAFETY: `address` is the start of a live allocation of at least `len` bytes, and the
        // fill is ordered on deltakv's stream like every other use of the buffer.
        unsafe {
            cudarc::driver::result::memset_d8_async(address, 0xFF, len, cuda.stream().cu_stream())
        }
        .map_err(|e| driver_error("filling a GPU buffer", e))?;
        Ok(t)
    }

    /// A copy in new device memory, made on the GPU (no host round trip), ordered on
    /// deltakv's stream like every use of either buffer.
    pub fn copy(&self, cuda: &Cuda) -> Result<Self> {
        let mut copy = Self::zeros(cuda, self.shape.clone(), self.dtype)?;
        let len = self.byte_len();
        if len > 0 {
            let (src, dst) = (self.device_address(cuda), copy.device_address_mut(cuda));
            // SAFETY: both buffers hold at least `len` bytes (allocated so, or promised by
            // `from_device_ptr`'s caller) and do not overlap (`copy` is a new allocation).
            unsafe {
                cudarc::driver::result::memcpy_dtod_async(dst, src, len, cuda.stream().cu_stream())
            }
            .map_err(|e| driver_error("copying a tensor on the GPU", e))?;
        }
        Ok(copy)
    }

    /// Overwrites the tensor's memory with `host` (same shape and dtype), in place: device
    /// addresses captured earlier (a prepared launch, a CUDA graph) see the new values. Waits
    /// for the copy.
    pub fn copy_from_host(&mut self, cuda: &Cuda, host: &HostTensor) -> Result<()> {
        if host.shape() != self.shape.as_slice() || host.dtype() != self.dtype {
            return Err(Error::InvalidValue(format!(
                "copying a {:?} {} host tensor into a {:?} {} device tensor",
                host.shape(),
                host.dtype(),
                self.shape,
                self.dtype
            )));
        }
        let bytes = host.to_le_bytes();
        let address = self.device_address_mut(cuda);
        // SAFETY: the tensor's memory holds `byte_len` = `bytes.len()` bytes; the copy is
        // ordered on deltakv's stream and `bytes` lives until the synchronize below.
        unsafe {
            cudarc::driver::result::memcpy_htod_async(address, &bytes, cuda.stream().cu_stream())
        }
        .map_err(|e| driver_error("copying a tensor to the GPU", e))?;
        cuda.synchronize()
    }

    /// Copies the tensor back to the host (waits for the GPU).
    pub fn download(&self, cuda: &Cuda) -> Result<HostTensor> {
        let mut bytes = vec![0u8; self.byte_len()];
        let address = self.device_address(cuda);
        // SAFETY: the tensor's memory holds at least `byte_len` bytes (allocated so, or
        // promised by `from_device_ptr`'s caller); the copy is ordered on deltakv's stream and
        // completes before `bytes` is read, at the synchronize below.
        unsafe {
            cudarc::driver::result::memcpy_dtoh_async(
                &mut bytes,
                address,
                cuda.stream().cu_stream(),
            )
        }
        .map_err(|e| driver_error("copying a tensor from the GPU", e))?;
        cuda.synchronize()?;
        HostTensor::from_le_bytes(self.shape.clone(), self.dtype, &bytes)
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// True when the memory is a caller's (see [`CudaTensor::from_device_ptr`]).
    pub fn is_borrowed(&self) -> bool {
        matches!(self.storage, Storage::Borrowed { .. })
    }

    /// Bytes of the tensor's elements.
    pub fn byte_len(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size_in_bytes()
    }

    /// The device address of the first element, for a caller that hands the memory on
    /// (DLPack, another library's kernel).
    pub fn device_ptr(&self, cuda: &Cuda) -> u64 {
        self.device_address(cuda)
    }

    /// The buffer's device address, for passing to a kernel that reads it.
    pub(crate) fn device_address(&self, cuda: &Cuda) -> u64 {
        match &self.storage {
            Storage::Owned(bytes) => bytes.device_ptr(cuda.stream()).0,
            Storage::Borrowed { address } => *address,
        }
    }

    /// Refuses the tensor when its device address is not a multiple of `align` bytes, naming
    /// it and `why` the kernel needs that (buffers deltakv allocates always are; a borrowed
    /// view may start anywhere its elements may). A kernel's misaligned wide access would
    /// fault and poison the context.
    pub(crate) fn check_aligned(
        &self,
        cuda: &Cuda,
        name: &str,
        align: u64,
        why: &str,
    ) -> Result<()> {
        let address = self.device_address(cuda);
        if address.is_multiple_of(align) {
            return Ok(());
        }
        Err(Error::InvalidValue(format!(
            "tensor `{name}`: device address {address:#x} must be {align}-byte aligned ({why}); a view starting {} bytes past such an address needs a copy",
            address % align
        )))
    }

    /// The buffer's device address, for passing to a kernel that writes it.
    pub(crate) fn device_address_mut(&mut self, cuda: &Cuda) -> u64 {
        match &mut self.storage {
            Storage::Owned(bytes) => bytes.device_ptr_mut(cuda.stream()).0,
            Storage::Borrowed { address } => *address,
        }
    }
}

impl TensorMeta for CudaTensor {
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
}

//! Tensors whose storage is on the GPU: a shape, a dtype and a device buffer of bytes.
//! Copies between host and device happen only through [`CudaTensor::upload`] and
//! [`CudaTensor::download`]; ops take and return `CudaTensor`s.

use crate::runtime::{Cuda, driver_error};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use deltakv_core::tensor::TensorMeta;
use deltakv_core::{DType, Error, HostTensor, Result};

/// A dense, row-major tensor in GPU memory.
pub struct CudaTensor {
    shape: Vec<usize>,
    dtype: DType,
    bytes: CudaSlice<u8>,
}

impl std::fmt::Debug for CudaTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaTensor")
            .field("shape", &self.shape)
            .field("dtype", &self.dtype)
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
            bytes,
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
            bytes,
        })
    }

    /// A tensor of `shape` and `dtype` whose every byte is 0xFF (NaN for the float types), so
    /// an element a kernel forgets to write shows up.
    pub fn poisoned(cuda: &Cuda, shape: Vec<usize>, dtype: DType) -> Result<Self> {
        let mut t = Self::zeros(cuda, shape, dtype)?;
        let len = t.bytes.len();
        let address = t.device_address_mut(cuda);
        // SAFETY: `address` is the start of a live allocation of `len` bytes, and the fill is
        // ordered on deltakv's stream like every other use of the buffer.
        unsafe {
            cudarc::driver::result::memset_d8_async(address, 0xFF, len, cuda.stream().cu_stream())
        }
        .map_err(|e| driver_error("filling a GPU buffer", e))?;
        Ok(t)
    }

    /// Copies the tensor back to the host (waits for the GPU).
    pub fn download(&self, cuda: &Cuda) -> Result<HostTensor> {
        let bytes = cuda
            .stream()
            .clone_dtoh(&self.bytes)
            .map_err(|e| driver_error("copying a tensor from the GPU", e))?;
        cuda.synchronize()?;
        let len = byte_len(&self.shape, self.dtype)?;
        HostTensor::from_le_bytes(self.shape.clone(), self.dtype, &bytes[..len])
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The buffer's device address, for passing to a kernel that reads it.
    pub(crate) fn device_address(&self, cuda: &Cuda) -> u64 {
        let (ptr, _sync) = self.bytes.device_ptr(cuda.stream());
        ptr
    }

    /// The buffer's device address, for passing to a kernel that writes it.
    pub(crate) fn device_address_mut(&mut self, cuda: &Cuda) -> u64 {
        let (ptr, _sync) = self.bytes.device_ptr_mut(cuda.stream());
        ptr
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

//! Tensors that live on a device. A [`Tensor`] holds its storage in host memory (a
//! [`HostTensor`]) or, with the cargo feature `cuda`, in GPU memory (a
//! [`deltakv_cuda::CudaTensor`]), or with the feature `wgpu` in a wgpu buffer (a
//! [`deltakv_wgpu::WgpuTensor`]). Data moves between devices only when the caller asks:
//! [`Tensor::copy_from_host`], [`Tensor::to_device`], [`Tensor::to_host`] and
//! [`Tensor::into_host`] are the copies; ops that take `Tensor`s run on the device their
//! tensors are on and return their results there.

use crate::Device;
use deltakv_contract::{DType, Error, HostTensor, Result, TensorMeta};

/// A dense, row-major tensor on one device.
#[derive(Debug)]
pub enum Tensor {
    /// In host memory; ops run on the CPU backend.
    Host(HostTensor),
    /// In GPU memory; ops run on the CUDA backend.
    #[cfg(feature = "cuda")]
    Cuda(deltakv_cuda::CudaTensor),
    /// In a wgpu storage buffer; ops run on the wgpu backend.
    #[cfg(feature = "wgpu")]
    Wgpu(deltakv_wgpu::WgpuTensor),
}

impl From<HostTensor> for Tensor {
    fn from(host: HostTensor) -> Self {
        Tensor::Host(host)
    }
}

#[cfg(feature = "cuda")]
impl From<deltakv_cuda::CudaTensor> for Tensor {
    fn from(gpu: deltakv_cuda::CudaTensor) -> Self {
        Tensor::Cuda(gpu)
    }
}

#[cfg(feature = "wgpu")]
impl From<deltakv_wgpu::WgpuTensor> for Tensor {
    fn from(t: deltakv_wgpu::WgpuTensor) -> Self {
        Tensor::Wgpu(t)
    }
}

impl Tensor {
    /// A host tensor as a `Tensor` on the CPU (no copy).
    pub fn from_host(host: HostTensor) -> Self {
        Tensor::Host(host)
    }

    /// A copy of `host` on `device`: a clone for the CPU, an upload for CUDA. Errors when the
    /// device is not built in or not present (see [`Device::ensure_available`]).
    pub fn copy_from_host(host: &HostTensor, device: Device) -> Result<Self> {
        match device {
            Device::Cpu => Ok(Tensor::Host(host.clone())),
            #[cfg(feature = "cuda")]
            Device::Cuda => {
                let cuda = deltakv_cuda::Cuda::get()?;
                Ok(Tensor::Cuda(deltakv_cuda::CudaTensor::upload(cuda, host)?))
            }
            #[cfg(feature = "wgpu")]
            Device::Wgpu => {
                let wgpu = deltakv_wgpu::Wgpu::get()?;
                Ok(Tensor::Wgpu(deltakv_wgpu::WgpuTensor::upload(wgpu, host)?))
            }
            #[allow(unreachable_patterns)]
            other => Err(no_tensors_on(other)),
        }
    }

    /// The device the storage is on.
    pub fn device(&self) -> Device {
        match self {
            Tensor::Host(_) => Device::Cpu,
            #[cfg(feature = "cuda")]
            Tensor::Cuda(_) => Device::Cuda,
            #[cfg(feature = "wgpu")]
            Tensor::Wgpu(_) => Device::Wgpu,
        }
    }

    pub fn shape(&self) -> &[usize] {
        match self {
            Tensor::Host(t) => t.shape(),
            #[cfg(feature = "cuda")]
            Tensor::Cuda(t) => t.shape(),
            #[cfg(feature = "wgpu")]
            Tensor::Wgpu(t) => t.shape(),
        }
    }

    pub fn dtype(&self) -> DType {
        match self {
            Tensor::Host(t) => t.dtype(),
            #[cfg(feature = "cuda")]
            Tensor::Cuda(t) => t.dtype(),
            #[cfg(feature = "wgpu")]
            Tensor::Wgpu(t) => t.dtype(),
        }
    }

    /// A copy on `device`: an upload, a download, or a copy within the device when it is
    /// already there (on the GPU without passing through the host); between the CUDA and wgpu
    /// backends, a download then an upload.
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        match self {
            Tensor::Host(host) => Self::copy_from_host(host, device),
            #[cfg(feature = "cuda")]
            Tensor::Cuda(gpu) => match device {
                Device::Cpu => Ok(Tensor::Host(gpu.download(deltakv_cuda::Cuda::get()?)?)),
                Device::Cuda => Ok(Tensor::Cuda(gpu.copy(deltakv_cuda::Cuda::get()?)?)),
                // Another GPU backend: through the host.
                other => Self::copy_from_host(&gpu.download(deltakv_cuda::Cuda::get()?)?, other),
            },
            #[cfg(feature = "wgpu")]
            Tensor::Wgpu(t) => match device {
                Device::Cpu => Ok(Tensor::Host(t.download(deltakv_wgpu::Wgpu::get()?)?)),
                Device::Wgpu => Ok(Tensor::Wgpu(t.copy(deltakv_wgpu::Wgpu::get()?)?)),
                other => Self::copy_from_host(&t.download(deltakv_wgpu::Wgpu::get()?)?, other),
            },
        }
    }

    /// A host copy (a download from a GPU; a clone on the CPU).
    pub fn to_host(&self) -> Result<HostTensor> {
        match self {
            Tensor::Host(host) => Ok(host.clone()),
            #[cfg(feature = "cuda")]
            Tensor::Cuda(gpu) => gpu.download(deltakv_cuda::Cuda::get()?),
            #[cfg(feature = "wgpu")]
            Tensor::Wgpu(t) => t.download(deltakv_wgpu::Wgpu::get()?),
        }
    }

    /// The tensor in host memory: the storage itself on the CPU, a download from a GPU.
    pub fn into_host(self) -> Result<HostTensor> {
        match self {
            Tensor::Host(host) => Ok(host),
            #[cfg(feature = "cuda")]
            Tensor::Cuda(gpu) => gpu.download(deltakv_cuda::Cuda::get()?),
            #[cfg(feature = "wgpu")]
            Tensor::Wgpu(t) => t.download(deltakv_wgpu::Wgpu::get()?),
        }
    }

    /// The host storage, when the tensor is on the CPU.
    pub fn as_host(&self) -> Option<&HostTensor> {
        match self {
            Tensor::Host(host) => Some(host),
            #[cfg(feature = "cuda")]
            Tensor::Cuda(_) => None,
            #[cfg(feature = "wgpu")]
            Tensor::Wgpu(_) => None,
        }
    }

    /// The GPU storage, when the tensor is on a CUDA device.
    #[cfg(feature = "cuda")]
    pub fn as_cuda(&self) -> Option<&deltakv_cuda::CudaTensor> {
        match self {
            Tensor::Cuda(gpu) => Some(gpu),
            _ => None,
        }
    }

    /// The wgpu storage, when the tensor is on the wgpu device.
    #[cfg(feature = "wgpu")]
    pub fn as_wgpu(&self) -> Option<&deltakv_wgpu::WgpuTensor> {
        match self {
            Tensor::Wgpu(t) => Some(t),
            _ => None,
        }
    }
}

/// Why `device` cannot hold a tensor: not built in or not present, else no tensors there yet.
fn no_tensors_on(device: Device) -> Error {
    match device.ensure_available() {
        Err(e) => e,
        Ok(()) => Error::DeviceUnavailable {
            device: device.name().to_string(),
            reason: format!("deltakv has no tensors on {device} yet"),
        },
    }
}

impl TensorMeta for Tensor {
    fn shape(&self) -> &[usize] {
        Tensor::shape(self)
    }
    fn dtype(&self) -> DType {
        Tensor::dtype(self)
    }
}

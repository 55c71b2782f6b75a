//! Launching a prefill call's kernels: a loaded kernel with its block shape, and one launch of
//! it with its parameters and grid, queued plainly or as the programmatic dependent of the
//! kernel before it.

use super::kernels::PrefillParams;
use crate::runtime::{Cuda, driver_error};
use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use deltakv_contract::Result;

/// A kernel loaded for a call, with the threads and shared memory of each of its blocks.
pub(super) struct LoadedKernel {
    pub function: CudaFunction,
    pub threads: u32,
    pub shared_bytes: u32,
}

impl LoadedKernel {
    /// One launch of the kernel: `params` over `grid`, named `name` in errors.
    pub fn with<'a>(
        &'a self,
        params: &'a PrefillParams,
        grid: (u32, u32, u32),
        name: &'static str,
    ) -> Kernel<'a> {
        Kernel {
            function: &self.function,
            params,
            grid,
            threads: self.threads,
            shared_bytes: self.shared_bytes,
            name,
        }
    }
}

/// One kernel of a prefill call: the function, its parameters, grid, block and shared memory.
pub(super) struct Kernel<'a> {
    pub function: &'a CudaFunction,
    pub params: &'a PrefillParams,
    pub grid: (u32, u32, u32),
    pub threads: u32,
    pub shared_bytes: u32,
    pub name: &'static str,
}

impl Kernel<'_> {
    /// Queues the kernel on `stream`.
    pub fn launch(&self, stream: &CudaStream) -> Result<()> {
        let mut builder = stream.launch_builder(self.function);
        builder.arg(self.params);
        let config = self.config();
        // SAFETY: the parameters point at live buffers of the sizes the kernels index: the
        // inputs and outputs passed the contract's shape check, and the scratch buffers and
        // tables were sized from the same plan the kernels walk.
        unsafe { builder.launch(config) }
            .map(|_| ())
            .map_err(|e| driver_error(&format!("launching {}", self.name), e))
    }

    /// Queues the kernel on `stream` as the programmatic dependent of the kernel queued there
    /// before it, the prepare (`cuLaunchKernelEx` with programmatic stream serialization, kept
    /// by CUDA graph capture): the prepare's blocks release it as they start, and its blocks
    /// wait in `griddepcontrol.wait` for the prepare's completion before reading anything.
    pub fn launch_dependent(&self, cuda: &Cuda, stream: &CudaStream) -> Result<()> {
        let config = self.config();
        // SAFETY: as in `launch`.
        unsafe { cuda.launch_programmatic_dependent(stream, self.function, config, self.params) }
            .map_err(|e| driver_error(&format!("launching {}", self.name), e))
    }

    fn config(&self) -> LaunchConfig {
        LaunchConfig {
            grid_dim: self.grid,
            block_dim: (self.threads, 1, 1),
            shared_mem_bytes: self.shared_bytes,
        }
    }
}

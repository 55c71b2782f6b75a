//! Tensors whose storage is a wgpu buffer: a shape, a dtype and the buffer. Copies between
//! host and device happen only through [`WgpuTensor::upload`] and [`WgpuTensor::download`];
//! ops take and return `WgpuTensor`s.
//!
//! Shaders see every buffer as `array<u32>` (WGSL has no 16-bit storage type without an
//! extension, and none for bf16): a buffer's size is the tensor's bytes rounded up to a whole
//! number of 4-byte words, and the shaders widen f16 and bf16 halves of words themselves.

use crate::runtime::{ShaderSource, Wgpu, backend_error};
use deltakv_contract::tensor::TensorMeta;
use deltakv_contract::{DType, Error, HostTensor, Result};

/// The fill shader, behind [`WgpuTensor::poisoned`].
pub const FILL: ShaderSource = ShaderSource {
    name: "fill",
    text: include_str!("fill.wgsl"),
    entry_point: "fill",
};

/// A dense, row-major tensor in a wgpu storage buffer.
pub struct WgpuTensor {
    shape: Vec<usize>,
    dtype: DType,
    buffer: wgpu::Buffer,
}

impl std::fmt::Debug for WgpuTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuTensor")
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

/// The buffer size for `bytes` of data: whole 4-byte words, at least one.
fn padded(bytes: usize) -> u64 {
    (bytes.max(1).div_ceil(4) * 4) as u64
}

const USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

impl WgpuTensor {
    /// Copies a host tensor to the device.
    pub fn upload(wgpu: &Wgpu, host: &HostTensor) -> Result<Self> {
        let bytes = host.to_le_bytes();
        let buffer = wgpu.buffer_with("deltakv tensor", &bytes, USAGE)?;
        Ok(Self {
            shape: host.shape().to_vec(),
            dtype: host.dtype(),
            buffer,
        })
    }

    /// A tensor of `shape` and `dtype` with every byte zero.
    pub fn zeros(wgpu: &Wgpu, shape: Vec<usize>, dtype: DType) -> Result<Self> {
        let len = byte_len(&shape, dtype)?;
        let buffer = wgpu.zeroed_buffer("deltakv tensor", len, USAGE)?;
        Ok(Self {
            shape,
            dtype,
            buffer,
        })
    }

    /// A tensor of `shape` and `dtype` whose every byte is 0xFF (NaN for the float types), so
    /// an element a shader forgets to write shows up.
    pub fn poisoned(wgpu: &Wgpu, shape: Vec<usize>, dtype: DType) -> Result<Self> {
        let t = Self::zeros(wgpu, shape, dtype)?;
        t.fill_words(wgpu, u32::MAX)?;
        Ok(t)
    }

    /// Sets every 4-byte word of the buffer to `pattern`, on the device (`fill.wgsl`).
    fn fill_words(&self, wgpu: &Wgpu, pattern: u32) -> Result<()> {
        let words = self.buffer.size() / 4;
        let groups = words.div_ceil(256);
        let row = groups.min(u64::from(
            wgpu.device().limits().max_compute_workgroups_per_dimension,
        ));
        let rows = groups.div_ceil(row.max(1));
        let pipeline = wgpu.pipeline(&FILL, &[])?;
        let params: Vec<u8> = [words as u32, pattern, row as u32, 0]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        let uniform = wgpu.buffer_with("fill params", &params, wgpu::BufferUsages::UNIFORM)?;
        let bind_group = wgpu.bind_group(
            "fill",
            &pipeline,
            &[(0, "params", &uniform), (1, "the buffer", &self.buffer)],
        )?;
        wgpu.submit_pass("filling a device buffer", |pass| {
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind_group, &[]);
            pass.dispatch_workgroups(row as u32, rows as u32, 1);
        })
    }

    /// A copy in a new buffer, made on the device (no host round trip).
    pub fn copy(&self, wgpu: &Wgpu) -> Result<Self> {
        let copy = Self::zeros(wgpu, self.shape.clone(), self.dtype)?;
        wgpu.submit_commands("copying a tensor on the device", |encoder| {
            // The tensor's own bytes: a buffer given by the caller may be larger than the copy's.
            encoder.copy_buffer_to_buffer(&self.buffer, 0, &copy.buffer, 0, copy.buffer.size());
        })?;
        Ok(copy)
    }

    /// Copies the tensor back to the host (waits for the device).
    pub fn download(&self, wgpu: &Wgpu) -> Result<HostTensor> {
        let size = self.buffer.size();
        let scope = wgpu.error_scope();
        let staging = wgpu.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some("deltakv download"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = wgpu
            .device()
            .create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
        encoder.copy_buffer_to_buffer(&self.buffer, 0, &staging, 0, size);
        wgpu.queue().submit([encoder.finish()]);
        let slice = staging.slice(..);
        let (sender, receiver) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |result| {
            let _ = sender.send(result);
        });
        scope.finish("copying a tensor from the device")?;
        wgpu.synchronize()?;
        receiver
            .recv()
            .map_err(|e| backend_error("copying a tensor from the device", e))?
            .map_err(|e| backend_error("copying a tensor from the device", e))?;
        let bytes = slice
            .get_mapped_range()
            .map_err(|e| backend_error("reading a downloaded tensor", e))?[..self.byte_len()]
            .to_vec();
        let scope = wgpu.error_scope();
        staging.unmap();
        scope.finish("reading a downloaded tensor")?;
        HostTensor::from_le_bytes(self.shape.clone(), self.dtype, &bytes)
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Bytes of the tensor's elements (the buffer may be up to 3 bytes longer).
    pub fn byte_len(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.size_in_bytes()
    }

    /// The storage buffer, for binding it to another library's pipeline.
    pub fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }

    /// A tensor over a caller's buffer (STORAGE | COPY_SRC | COPY_DST usage, at least
    /// `shape x dtype` bytes rounded up to 4), with no copy: ops read it and an op that updates
    /// its argument in place (decode's pool) writes it.
    pub fn from_buffer(buffer: wgpu::Buffer, shape: Vec<usize>, dtype: DType) -> Result<Self> {
        let len = byte_len(&shape, dtype)?;
        if buffer.size() < padded(len) || !buffer.usage().contains(USAGE) {
            return Err(Error::InvalidValue(format!(
                "a buffer of {} bytes with usage {:?} cannot hold a {dtype} tensor {shape:?} ({} bytes, usage STORAGE | COPY_SRC | COPY_DST)",
                buffer.size(),
                buffer.usage(),
                padded(len)
            )));
        }
        Ok(Self {
            shape,
            dtype,
            buffer,
        })
    }
}

impl TensorMeta for WgpuTensor {
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
}

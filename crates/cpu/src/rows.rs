//! Typed output buffers that parallel kernels fill row by row from f32 working values, so an
//! op's output is produced directly in its final dtype (no full-size f32 copy to convert).

use crate::simd::DisjointWriter;
use deltakv_contract::Result;
use deltakv_contract::tensor::{DType, HostTensor, TensorData, bf16_round};
use half::{bf16, f16};

/// An output tensor's storage, poisoned with NaN until kernels write it.
pub(crate) enum OutputBuffer {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
}

impl OutputBuffer {
    /// `len` NaNs of a float `dtype` (f32 for anything else).
    pub fn poisoned(dtype: DType, len: usize) -> Self {
        match dtype {
            DType::BF16 => OutputBuffer::BF16(vec![bf16::NAN; len]),
            DType::F16 => OutputBuffer::F16(vec![f16::NAN; len]),
            _ => OutputBuffer::F32(vec![f32::NAN; len]),
        }
    }

    pub fn writer(&mut self) -> RowWriter<'_> {
        match self {
            OutputBuffer::F32(v) => RowWriter::F32(DisjointWriter::new(v)),
            OutputBuffer::F16(v) => RowWriter::F16(DisjointWriter::new(v)),
            OutputBuffer::BF16(v) => RowWriter::BF16(DisjointWriter::new(v)),
        }
    }

    pub fn into_tensor(self, shape: Vec<usize>) -> Result<HostTensor> {
        HostTensor::new(
            shape,
            match self {
                OutputBuffer::F32(v) => TensorData::F32(v),
                OutputBuffer::F16(v) => TensorData::F16(v),
                OutputBuffer::BF16(v) => TensorData::BF16(v),
            },
        )
    }
}

/// Shared write access to an [`OutputBuffer`] for parallel tasks.
pub(crate) enum RowWriter<'a> {
    F32(DisjointWriter<'a, f32>),
    F16(DisjointWriter<'a, f16>),
    BF16(DisjointWriter<'a, bf16>),
}

impl RowWriter<'_> {
    /// Rounds `values` into elements `offset..offset + values.len()`.
    ///
    /// # Safety
    /// No other task may write that range concurrently.
    #[inline]
    pub unsafe fn write(&self, offset: usize, values: &[f32]) {
        // SAFETY: exclusivity of the range is the caller's contract.
        unsafe {
            match self {
                RowWriter::F32(w) => w.range(offset, values.len()).copy_from_slice(values),
                RowWriter::F16(w) => {
                    for (d, &s) in w.range(offset, values.len()).iter_mut().zip(values) {
                        *d = f16::from_f32(s);
                    }
                }
                RowWriter::BF16(w) => {
                    for (d, &s) in w.range(offset, values.len()).iter_mut().zip(values) {
                        *d = bf16_round(s);
                    }
                }
            }
        }
    }
}

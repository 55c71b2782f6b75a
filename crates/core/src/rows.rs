//! Typed output buffers that parallel kernels fill row by row from f32 working values, so an
//! op's output is produced directly in its final dtype (no full-size f32 copy to convert).

use crate::error::Result;
use crate::simd::DisjointWriter;
use crate::tensor::{DType, HostTensor, TensorData};
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

/// bf16 -> f32, exact: the bf16 bits are the top half of the f32 (a shift that vectorises,
/// unlike `half`'s NaN-quieting conversion).
#[inline(always)]
pub(crate) fn bf16_widen(x: bf16) -> f32 {
    f32::from_bits(u32::from(x.to_bits()) << 16)
}

/// f32 -> bf16, round to nearest even, written branch-free so row loops vectorise (`half`'s
/// conversion is scalar). NaN stays NaN (quiet); overflow rounds to infinity.
#[inline(always)]
pub(crate) fn bf16_round(x: f32) -> bf16 {
    // Everything stays in 32-bit lanes until the final narrowing, which keeps the loop
    // vectorised (a select on 16-bit values split it into scalar code).
    let bits = x.to_bits();
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16;
    let quiet_nan = (bits >> 16) | 0x0040;
    let is_nan = (bits & 0x7fff_ffff) > 0x7f80_0000;
    bf16::from_bits((if is_nan { quiet_nan } else { rounded }) as u16)
}

#[cfg(test)]
mod tests {
    use super::bf16_round;
    use half::bf16;

    #[test]
    fn bf16_rounding_matches_half() {
        let mut x = 1.0e-30f32;
        let mut rng = crate::rng::Rng::new(9);
        for _ in 0..200_000 {
            let v = (rng.normal() * 1e3) as f32;
            assert_eq!(bf16_round(v).to_bits(), bf16::from_f32(v).to_bits(), "{v}");
            x *= -1.7;
            if x.is_finite() {
                assert_eq!(bf16_round(x).to_bits(), bf16::from_f32(x).to_bits(), "{x}");
            }
        }
        for special in [
            0.0f32,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN_POSITIVE,
            1.0e-45,
        ] {
            assert_eq!(
                bf16_round(special).to_bits(),
                bf16::from_f32(special).to_bits(),
                "{special}"
            );
        }
        assert!(bf16_round(f32::NAN).is_nan());
        assert!(bf16_round(f32::from_bits(0x7f80_0001)).is_nan());
    }
}

//! Borrowed host tensors: a shape over someone else's memory. The kernels read their inputs
//! and write a state pool through these views, so a caller that owns its buffers (a Python
//! array passed through DLPack, a candle tensor, a serving engine's pool) hands them over
//! without a copy. [`HostTensor`] (owned) and [`HostView`] / [`HostViewMut`] (borrowed) all
//! implement [`HostData`], the one trait the host validation and the CPU kernels read through.

use crate::error::{Error, Result};
use crate::tensor::{DType, HostTensor, TensorData, TensorMeta, bf16_widen, first_flagged};
use half::{bf16, f16};

/// The typed elements of a host tensor, borrowed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TensorSlice<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
    I32(&'a [i32]),
    I64(&'a [i64]),
}

/// The typed elements of a host tensor, borrowed mutably.
#[derive(Debug, PartialEq)]
pub enum TensorSliceMut<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [f16]),
    BF16(&'a mut [bf16]),
    I32(&'a mut [i32]),
    I64(&'a mut [i64]),
}

impl<'a> TensorSlice<'a> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            TensorSlice::F32(v) => v.len(),
            TensorSlice::F16(v) => v.len(),
            TensorSlice::BF16(v) => v.len(),
            TensorSlice::I32(v) => v.len(),
            TensorSlice::I64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn dtype(&self) -> DType {
        match self {
            TensorSlice::F32(_) => DType::F32,
            TensorSlice::F16(_) => DType::F16,
            TensorSlice::BF16(_) => DType::BF16,
            TensorSlice::I32(_) => DType::I32,
            TensorSlice::I64(_) => DType::I64,
        }
    }

    /// Flat index and value of the first NaN or infinity among elements `range` (clamped to
    /// the storage) of a float tensor; `None` for integer tensors. Blocks are tested with a
    /// branch-free OR of "exponent bits all ones" (it vectorises) and searched only when one
    /// is flagged.
    pub fn first_non_finite_in(&self, range: std::ops::Range<usize>) -> Option<(usize, f32)> {
        let end = range.end.min(self.len());
        let start = range.start.min(end);
        match *self {
            TensorSlice::F32(v) => {
                first_flagged(&v[start..end], |x| x.to_bits() & 0x7f80_0000 == 0x7f80_0000)
                    .map(|i| (start + i, v[start + i]))
            }
            TensorSlice::BF16(v) => {
                first_flagged(&v[start..end], |x| x.to_bits() & 0x7f80 == 0x7f80)
                    .map(|i| (start + i, v[start + i].to_f32()))
            }
            TensorSlice::F16(v) => {
                first_flagged(&v[start..end], |x| x.to_bits() & 0x7c00 == 0x7c00)
                    .map(|i| (start + i, v[start + i].to_f32()))
            }
            TensorSlice::I32(_) | TensorSlice::I64(_) => None,
        }
    }

    /// The address of the first element (for callers that check a buffer was not copied).
    pub fn as_ptr(&self) -> *const u8 {
        match self {
            TensorSlice::F32(v) => v.as_ptr().cast(),
            TensorSlice::F16(v) => v.as_ptr().cast(),
            TensorSlice::BF16(v) => v.as_ptr().cast(),
            TensorSlice::I32(v) => v.as_ptr().cast(),
            TensorSlice::I64(v) => v.as_ptr().cast(),
        }
    }

    /// The f32 elements, if that is the dtype.
    pub fn as_f32(&self) -> Option<&'a [f32]> {
        match *self {
            TensorSlice::F32(v) => Some(v),
            _ => None,
        }
    }

    /// Widens floating elements to f32 (exact for f16 and bf16). Integers are an error naming
    /// `name`.
    pub fn to_f32_vec(&self, name: &str) -> Result<Vec<f32>> {
        match *self {
            TensorSlice::F32(v) => Ok(v.to_vec()),
            TensorSlice::F16(v) => Ok(v.iter().map(|x| x.to_f32()).collect()),
            TensorSlice::BF16(v) => Ok(v.iter().map(|&x| bf16_widen(x)).collect()),
            _ => Err(Error::dtype(name, self.dtype(), "f32, f16 or bf16")),
        }
    }

    /// Reads integer elements (i32 or i64) as i64. Floats are an error naming `name`.
    pub fn to_i64_vec(&self, name: &str) -> Result<Vec<i64>> {
        match *self {
            TensorSlice::I32(v) => Ok(v.iter().map(|&x| i64::from(x)).collect()),
            TensorSlice::I64(v) => Ok(v.to_vec()),
            _ => Err(Error::dtype(name, self.dtype(), "i32 or i64")),
        }
    }
}

impl TensorSliceMut<'_> {
    /// A shared view of the same elements.
    pub fn as_slice(&self) -> TensorSlice<'_> {
        match self {
            TensorSliceMut::F32(v) => TensorSlice::F32(v),
            TensorSliceMut::F16(v) => TensorSlice::F16(v),
            TensorSliceMut::BF16(v) => TensorSlice::BF16(v),
            TensorSliceMut::I32(v) => TensorSlice::I32(v),
            TensorSliceMut::I64(v) => TensorSlice::I64(v),
        }
    }

    /// Shortens the borrow (so a view can hand out its elements more than once).
    pub fn reborrow(&mut self) -> TensorSliceMut<'_> {
        match self {
            TensorSliceMut::F32(v) => TensorSliceMut::F32(v),
            TensorSliceMut::F16(v) => TensorSliceMut::F16(v),
            TensorSliceMut::BF16(v) => TensorSliceMut::BF16(v),
            TensorSliceMut::I32(v) => TensorSliceMut::I32(v),
            TensorSliceMut::I64(v) => TensorSliceMut::I64(v),
        }
    }
}

impl TensorData {
    /// The elements, borrowed.
    pub fn as_slice(&self) -> TensorSlice<'_> {
        match self {
            TensorData::F32(v) => TensorSlice::F32(v),
            TensorData::F16(v) => TensorSlice::F16(v),
            TensorData::BF16(v) => TensorSlice::BF16(v),
            TensorData::I32(v) => TensorSlice::I32(v),
            TensorData::I64(v) => TensorSlice::I64(v),
        }
    }

    /// The elements, borrowed mutably.
    pub fn as_slice_mut(&mut self) -> TensorSliceMut<'_> {
        match self {
            TensorData::F32(v) => TensorSliceMut::F32(v),
            TensorData::F16(v) => TensorSliceMut::F16(v),
            TensorData::BF16(v) => TensorSliceMut::BF16(v),
            TensorData::I32(v) => TensorSliceMut::I32(v),
            TensorData::I64(v) => TensorSliceMut::I64(v),
        }
    }
}

/// A host tensor whose row-major elements are read where they are: what validation and the
/// CPU kernels read, owned ([`HostTensor`]) or borrowed ([`HostView`], [`HostViewMut`]).
pub trait HostData: TensorMeta {
    /// The elements, row-major.
    fn values(&self) -> TensorSlice<'_>;
}

/// A [`HostData`] whose elements can be written in place (a state pool).
pub trait HostDataMut: HostData {
    /// The elements, row-major, borrowed mutably.
    fn values_mut(&mut self) -> TensorSliceMut<'_>;
}

impl HostData for HostTensor {
    fn values(&self) -> TensorSlice<'_> {
        self.data().as_slice()
    }
}

impl HostDataMut for HostTensor {
    fn values_mut(&mut self) -> TensorSliceMut<'_> {
        self.data_mut().as_slice_mut()
    }
}

/// An error unless `shape` holds exactly `len` elements (its product overflowing usize
/// included).
pub(crate) fn check_count(shape: &[usize], len: usize) -> Result<()> {
    let expected = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| {
            Error::InvalidValue(format!("shape {shape:?} holds more elements than usize"))
        })?;
    if expected == len {
        Ok(())
    } else {
        Err(Error::InvalidValue(format!(
            "shape {shape:?} holds {expected} elements but {len} were given"
        )))
    }
}

/// A row-major tensor over borrowed elements.
#[derive(Clone, Debug, PartialEq)]
pub struct HostView<'a> {
    shape: Vec<usize>,
    data: TensorSlice<'a>,
}

impl<'a> HostView<'a> {
    /// Views `data` with `shape`; fails when the element count disagrees.
    pub fn new(shape: Vec<usize>, data: TensorSlice<'a>) -> Result<Self> {
        check_count(&shape, data.len())?;
        Ok(Self { shape, data })
    }

    /// The elements, with the view's lifetime.
    pub fn slice(&self) -> TensorSlice<'a> {
        self.data
    }
}

impl TensorMeta for HostView<'_> {
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn dtype(&self) -> DType {
        self.data.dtype()
    }
}

impl HostData for HostView<'_> {
    fn values(&self) -> TensorSlice<'_> {
        self.data
    }
}

/// A row-major tensor over mutably borrowed elements (a caller's state pool).
#[derive(Debug, PartialEq)]
pub struct HostViewMut<'a> {
    shape: Vec<usize>,
    data: TensorSliceMut<'a>,
}

impl<'a> HostViewMut<'a> {
    /// Views `data` with `shape`; fails when the element count disagrees.
    pub fn new(shape: Vec<usize>, data: TensorSliceMut<'a>) -> Result<Self> {
        check_count(&shape, data.as_slice().len())?;
        Ok(Self { shape, data })
    }
}

impl TensorMeta for HostViewMut<'_> {
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn dtype(&self) -> DType {
        self.data.as_slice().dtype()
    }
}

impl HostData for HostViewMut<'_> {
    fn values(&self) -> TensorSlice<'_> {
        self.data.as_slice()
    }
}

impl HostDataMut for HostViewMut<'_> {
    fn values_mut(&mut self) -> TensorSliceMut<'_> {
        self.data.reborrow()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_read_the_same_elements_as_the_owned_tensor() {
        let owned = HostTensor::from_f32(vec![2, 3], (0..6).map(|i| i as f32).collect()).unwrap();
        let values = owned.as_f32().unwrap();
        let view = HostView::new(vec![2, 3], TensorSlice::F32(values)).unwrap();
        assert_eq!(view.values(), owned.values());
        assert_eq!(view.values().as_ptr(), values.as_ptr().cast());
        assert_eq!(view.shape(), &[2, 3]);
        assert_eq!(view.values().to_f32_vec("x").unwrap(), values);
        let err = HostView::new(vec![4, 2], TensorSlice::F32(values)).unwrap_err();
        assert!(err.to_string().contains("holds 8 elements but 6"), "{err}");
    }

    #[test]
    fn a_mutable_view_writes_the_callers_memory() {
        let mut pool = vec![0i64; 4];
        {
            let mut view = HostViewMut::new(vec![2, 2], TensorSliceMut::I64(&mut pool)).unwrap();
            if let TensorSliceMut::I64(v) = view.values_mut() {
                v[3] = 7;
            }
            assert_eq!(view.values().to_i64_vec("pool").unwrap(), [0, 0, 0, 7]);
            assert!(view.values().to_f32_vec("pool").is_err());
        }
        assert_eq!(pool, [0, 0, 0, 7]);
    }
}

//! Host tensors: a shape plus a typed, row-major buffer. This is the interchange type of the
//! public API; kernels convert to f32 working buffers once, at the edge.

use crate::error::{Error, Result};
use half::{bf16, f16};

/// Element types deltakv reads and writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    I32,
    I64,
}

impl DType {
    /// True for the three floating-point types.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// Bytes per element.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::I64 => 8,
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I64 => "i64",
        })
    }
}

/// The typed storage of a [`HostTensor`].
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
}

impl TensorData {
    fn len(&self) -> usize {
        match self {
            TensorData::F32(v) => v.len(),
            TensorData::F16(v) => v.len(),
            TensorData::BF16(v) => v.len(),
            TensorData::I32(v) => v.len(),
            TensorData::I64(v) => v.len(),
        }
    }
}

/// A dense, row-major tensor in host memory.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    shape: Vec<usize>,
    data: TensorData,
}

impl HostTensor {
    /// Wraps `data` with `shape`; fails when the element count disagrees.
    pub fn new(shape: Vec<usize>, data: TensorData) -> Result<Self> {
        let expected: usize = shape.iter().product();
        if expected != data.len() {
            return Err(Error::InvalidValue(format!(
                "shape {shape:?} holds {expected} elements but {} were given",
                data.len()
            )));
        }
        Ok(Self { shape, data })
    }

    /// An f32 tensor.
    pub fn from_f32(shape: Vec<usize>, values: Vec<f32>) -> Result<Self> {
        Self::new(shape, TensorData::F32(values))
    }

    /// Rounds f32 values to a floating `dtype` (round-to-nearest-even).
    pub fn from_f32_as(shape: Vec<usize>, values: &[f32], dtype: DType) -> Result<Self> {
        let data = match dtype {
            DType::F32 => TensorData::F32(values.to_vec()),
            DType::F16 => TensorData::F16(values.iter().map(|&x| f16::from_f32(x)).collect()),
            DType::BF16 => {
                TensorData::BF16(values.iter().map(|&x| crate::rows::bf16_round(x)).collect())
            }
            DType::I32 | DType::I64 => {
                return Err(Error::Unsupported(format!(
                    "cannot store float values as {dtype}"
                )));
            }
        };
        Self::new(shape, data)
    }

    /// An i32 tensor.
    pub fn from_i32(shape: Vec<usize>, values: Vec<i32>) -> Result<Self> {
        Self::new(shape, TensorData::I32(values))
    }

    /// An i64 tensor.
    pub fn from_i64(shape: Vec<usize>, values: Vec<i64>) -> Result<Self> {
        Self::new(shape, TensorData::I64(values))
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn data(&self) -> &TensorData {
        &self.data
    }

    pub fn dtype(&self) -> DType {
        match self.data {
            TensorData::F32(_) => DType::F32,
            TensorData::F16(_) => DType::F16,
            TensorData::BF16(_) => DType::BF16,
            TensorData::I32(_) => DType::I32,
            TensorData::I64(_) => DType::I64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Borrow the f32 storage, if that is the dtype.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            TensorData::F32(v) => Some(v),
            _ => None,
        }
    }

    /// Mutably borrow the f32 storage, if that is the dtype.
    pub fn as_f32_mut(&mut self) -> Option<&mut [f32]> {
        match &mut self.data {
            TensorData::F32(v) => Some(v),
            _ => None,
        }
    }

    /// Mutably borrow the bf16 storage, if that is the dtype.
    pub fn as_bf16_mut(&mut self) -> Option<&mut [bf16]> {
        match &mut self.data {
            TensorData::BF16(v) => Some(v),
            _ => None,
        }
    }

    /// Widens a floating tensor to f32 (exact for f16 and bf16). Integer tensors are an error
    /// naming `name`.
    pub fn to_f32_vec(&self, name: &str) -> Result<Vec<f32>> {
        match &self.data {
            TensorData::F32(v) => Ok(v.clone()),
            TensorData::F16(v) => Ok(v.iter().map(|x| x.to_f32()).collect()),
            TensorData::BF16(v) => Ok(v.iter().map(|&x| crate::rows::bf16_widen(x)).collect()),
            _ => Err(Error::dtype(name, self.dtype(), "f32, f16 or bf16")),
        }
    }

    /// Widens a floating tensor to f64 (exact).
    pub fn to_f64_vec(&self, name: &str) -> Result<Vec<f64>> {
        Ok(self.to_f32_vec(name)?.into_iter().map(f64::from).collect())
    }

    /// Reads an integer tensor (i32 or i64) as i64. Float tensors are an error naming `name`.
    pub fn to_i64_vec(&self, name: &str) -> Result<Vec<i64>> {
        match &self.data {
            TensorData::I32(v) => Ok(v.iter().map(|&x| i64::from(x)).collect()),
            TensorData::I64(v) => Ok(v.clone()),
            _ => Err(Error::dtype(name, self.dtype(), "i32 or i64")),
        }
    }

    /// Raw little-endian bytes of the storage.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        match &self.data {
            TensorData::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::F16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::BF16(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            TensorData::I64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }

    /// Parses little-endian bytes of `dtype` into a tensor of `shape`.
    pub fn from_le_bytes(shape: Vec<usize>, dtype: DType, bytes: &[u8]) -> Result<Self> {
        let width = dtype.size_in_bytes();
        if !bytes.len().is_multiple_of(width) {
            return Err(Error::InvalidValue(format!(
                "{} bytes is not a whole number of {dtype} elements",
                bytes.len()
            )));
        }
        let chunks = bytes.chunks_exact(width);
        let data = match dtype {
            DType::F32 => TensorData::F32(
                chunks
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            DType::F16 => TensorData::F16(
                chunks
                    .map(|c| f16::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            DType::BF16 => TensorData::BF16(
                chunks
                    .map(|c| bf16::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            DType::I32 => TensorData::I32(
                chunks
                    .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            DType::I64 => TensorData::I64(
                chunks
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
        };
        Self::new(shape, data)
    }
}

/// Index of the first NaN or infinity in `values`. A branch-free pass that vectorises runs
/// first; the position is searched for only when it finds one.
pub fn first_non_finite(values: &[f32]) -> Option<usize> {
    let all_finite = values
        .chunks(256)
        .all(|chunk| chunk.iter().fold(true, |ok, x| ok & x.is_finite()));
    if all_finite {
        None
    } else {
        values.iter().position(|x| !x.is_finite())
    }
}

/// Fails on the first NaN or infinity in `values`, naming the tensor and the flat index.
pub fn check_finite(name: &str, values: &[f32]) -> Result<()> {
    check_finite_at(name, values, 0)
}

/// [`check_finite`] for a slice that starts at flat index `offset` of the tensor.
pub fn check_finite_at(name: &str, values: &[f32], offset: usize) -> Result<()> {
    match first_non_finite(values) {
        None => Ok(()),
        Some(i) => Err(Error::InvalidValue(format!(
            "tensor `{name}` holds a non-finite value ({}) at flat index {}",
            values[i],
            offset + i
        ))),
    }
}

/// What validation reads of a tensor: its shape and dtype, wherever its storage lives. Every
/// backend's tensor type implements it, so the shape and dtype rules are written once.
pub trait TensorMeta {
    fn shape(&self) -> &[usize];
    fn dtype(&self) -> DType;
}

impl TensorMeta for HostTensor {
    fn shape(&self) -> &[usize] {
        HostTensor::shape(self)
    }
    fn dtype(&self) -> DType {
        HostTensor::dtype(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_mismatch_is_an_error() {
        let err = HostTensor::from_f32(vec![2, 3], vec![0.0; 5]).unwrap_err();
        assert!(err.to_string().contains("holds 6 elements but 5"), "{err}");
    }

    #[test]
    fn bytes_round_trip_every_dtype() {
        let values = [1.5f32, -2.25, 3.0, 0.125];
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let t = HostTensor::from_f32_as(vec![4], &values, dtype).unwrap();
            let back = HostTensor::from_le_bytes(vec![4], dtype, &t.to_le_bytes()).unwrap();
            assert_eq!(back, t);
            assert_eq!(back.to_f32_vec("x").unwrap(), values.to_vec());
        }
        let ints = HostTensor::from_i64(vec![2], vec![-1, 7]).unwrap();
        let back = HostTensor::from_le_bytes(vec![2], DType::I64, &ints.to_le_bytes()).unwrap();
        assert_eq!(back.to_i64_vec("i").unwrap(), vec![-1, 7]);
        assert!(ints.to_f32_vec("i").is_err());
    }
}

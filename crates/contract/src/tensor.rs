//! Host tensors: a shape plus a typed, row-major buffer. This is the interchange type of the
//! public API; kernels convert to f32 working buffers once, at the edge.
//!
//! Also here: the bf16 conversions every backend uses (round to nearest even), the
//! [`TensorMeta`] view that validation reads (so a GPU tensor is checked by the same code), and
//! the serial finite scans behind the contract's "finite in, finite out" rule.

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
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            TensorData::F32(v) => v.len(),
            TensorData::F16(v) => v.len(),
            TensorData::BF16(v) => v.len(),
            TensorData::I32(v) => v.len(),
            TensorData::I64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Flat index and value of the first NaN or infinity among elements `range` (clamped to
    /// the storage) of a float tensor; `None` for integer tensors. Blocks are tested with a
    /// branch-free OR of "exponent bits all ones" (it vectorises) and searched only when one
    /// is flagged.
    pub fn first_non_finite_in(&self, range: std::ops::Range<usize>) -> Option<(usize, f32)> {
        self.as_slice().first_non_finite_in(range)
    }

    /// [`Self::first_non_finite_in`] over every element.
    pub fn first_non_finite(&self) -> Option<(usize, f32)> {
        self.first_non_finite_in(0..self.len())
    }
}

/// Index of the first element of `values` flagged by `exponent_all_ones`.
pub(crate) fn first_flagged<T: Copy>(
    values: &[T],
    exponent_all_ones: impl Fn(T) -> bool,
) -> Option<usize> {
    const BLOCK: usize = 4096;
    values.chunks(BLOCK).enumerate().find_map(|(b, chunk)| {
        let flagged = chunk
            .iter()
            .fold(false, |acc, &x| acc | exponent_all_ones(x));
        if flagged {
            chunk
                .iter()
                .position(|&x| exponent_all_ones(x))
                .map(|i| b * BLOCK + i)
        } else {
            None
        }
    })
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
        crate::view::check_count(&shape, data.len())?;
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
            DType::BF16 => TensorData::BF16(values.iter().map(|&x| bf16_round(x)).collect()),
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

    /// The storage, given up (a caller that hands the elements on without a copy).
    pub fn into_data(self) -> TensorData {
        self.data
    }

    pub(crate) fn data_mut(&mut self) -> &mut TensorData {
        &mut self.data
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

    /// Flat index and value of the first NaN or infinity (a serial scan; `None` for integer
    /// tensors).
    pub fn first_non_finite(&self) -> Option<(usize, f32)> {
        self.data.first_non_finite()
    }

    /// Fails on the first NaN or infinity, naming the tensor (`name`) and the flat index.
    pub fn check_finite(&self, name: &str) -> Result<()> {
        match self.first_non_finite() {
            None => Ok(()),
            Some((i, x)) => Err(non_finite_input(name, i, x)),
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
            TensorData::BF16(v) => Ok(v.iter().map(|&x| bf16_widen(x)).collect()),
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
        Some(i) => Err(non_finite_input(name, offset + i, values[i])),
    }
}

/// The error for an input holding a non-finite `value` at flat `index`: the contract refuses
/// NaN and infinity in any input before anything is written.
pub fn non_finite_input(name: &str, index: usize, value: f32) -> Error {
    Error::InvalidValue(format!(
        "tensor `{name}` holds a non-finite value ({value}) at flat index {index}"
    ))
}

/// The error for a result `name` of `shape` holding a non-finite `value` at flat `index`
/// although every input was finite: an intermediate overflowed f32. The position is labelled
/// by `axes` (e.g. `"b, t, h, v"`) and `cause` names the likely culprit. The contract returns
/// this rather than a NaN-filled result.
pub fn overflowed_result(
    name: &str,
    shape: &[usize],
    axes: &str,
    index: usize,
    value: f32,
    cause: &str,
) -> Error {
    Error::InvalidValue(format!(
        "the result `{name}` holds a non-finite value ({value}) at [{axes}] = {:?} although every input was finite: an intermediate overflowed f32 ({cause})",
        unravel(index, shape)
    ))
}

/// Checks a result computed from finite inputs (a serial scan), failing with
/// [`overflowed_result`] on its first NaN or infinity.
/// An infinity in an f16 result is named as f16's range first: a value past 65504 that f32
/// held becomes infinite only when it is rounded to f16.
pub fn check_result_finite(name: &str, t: &HostTensor, axes: &str, cause: &str) -> Result<()> {
    match t.first_non_finite() {
        None => Ok(()),
        Some((i, x)) if t.dtype() == DType::F16 && x.is_infinite() => {
            Err(Error::InvalidValue(format!(
                "the result `{name}` is {x} at [{axes}] = {:?} in its f16 output although every input was finite: a value beyond f16's range (65504), or an intermediate that overflowed f32 ({cause}); inputs in f32 or bf16 give a wider output",
                unravel(i, t.shape())
            )))
        }
        Some((i, x)) => Err(overflowed_result(name, t.shape(), axes, i, x, cause)),
    }
}

/// The multi-index of flat index `i` in a row-major tensor of `shape`.
pub fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    for (slot, &extent) in index.iter_mut().zip(shape).rev() {
        let extent = extent.max(1);
        *slot = i % extent;
        i /= extent;
    }
    index
}

/// bf16 -> f32, exact: the bf16 bits are the top half of the f32 (a shift that vectorises,
/// unlike `half`'s NaN-quieting conversion).
#[inline(always)]
pub fn bf16_widen(x: bf16) -> f32 {
    f32::from_bits(u32::from(x.to_bits()) << 16)
}

/// f32 -> bf16, round to nearest even, written branch-free so row loops vectorise (`half`'s
/// conversion is scalar). NaN stays NaN (quiet); overflow rounds to infinity. Every backend
/// rounds bf16 outputs and pools this way.
#[inline(always)]
pub fn bf16_round(x: f32) -> bf16 {
    // Everything stays in 32-bit lanes until the final narrowing, which keeps the loop
    // vectorised (a select on 16-bit values split it into scalar code).
    let bits = x.to_bits();
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16;
    let quiet_nan = (bits >> 16) | 0x0040;
    let is_nan = (bits & 0x7fff_ffff) > 0x7f80_0000;
    bf16::from_bits((if is_nan { quiet_nan } else { rounded }) as u16)
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

/// A shape and a dtype without data: all that validation reads, for checking a call before its
/// tensors exist (and in tests of the checks).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec(pub Vec<usize>, pub DType);

impl TensorMeta for TensorSpec {
    fn shape(&self) -> &[usize] {
        &self.0
    }
    fn dtype(&self) -> DType {
        self.1
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
    fn an_infinite_f16_result_names_f16s_range() {
        let t = HostTensor::from_f32_as(vec![2], &[1.0, 70000.0], DType::F16).unwrap();
        let err = check_result_finite("o", &t, "i", "cause").unwrap_err();
        assert!(err.to_string().contains("f16's range (65504)"), "{err}");
        let t = HostTensor::from_f32(vec![2], vec![1.0, f32::INFINITY]).unwrap();
        let err = check_result_finite("o", &t, "i", "cause").unwrap_err();
        assert!(err.to_string().contains("overflowed f32 (cause)"), "{err}");
    }

    #[test]
    fn a_shape_whose_product_overflows_is_an_error() {
        // 2^33 * 2^33 wraps to 0 in usize: it must not pass as the empty data's shape.
        let err = HostTensor::from_f32(vec![1 << 33, 1 << 33], vec![]).unwrap_err();
        assert!(
            err.to_string().contains("more elements than usize"),
            "{err}"
        );
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

    #[test]
    fn finite_scans_find_the_first_bad_element_of_every_dtype() {
        let mut values = vec![0.5f32; 10_000];
        values[9_001] = f32::INFINITY;
        values[9_500] = f32::NAN;
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let t = HostTensor::from_f32_as(vec![100, 100], &values, dtype).unwrap();
            let (i, x) = t.first_non_finite().unwrap();
            assert_eq!((i, x), (9_001, f32::INFINITY), "{dtype}");
            assert_eq!(
                t.data().first_non_finite_in(9_002..10_000).unwrap().0,
                9_500
            );
            assert_eq!(t.data().first_non_finite_in(0..9_001), None);
            assert_eq!(t.data().first_non_finite_in(20_000..30_000), None);
            let err = t.check_finite("v").unwrap_err().to_string();
            assert_eq!(
                err,
                "tensor `v` holds a non-finite value (inf) at flat index 9001"
            );
        }
        let err = check_result_finite(
            "o",
            &HostTensor::from_f32(vec![100, 100], values).unwrap(),
            "r, c",
            "too large",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("[r, c] = [90, 1]"), "{err}");
        assert!(err.ends_with("overflowed f32 (too large)"), "{err}");
        assert_eq!(
            HostTensor::from_i32(vec![1], vec![7])
                .unwrap()
                .first_non_finite(),
            None
        );
    }

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
            assert_eq!(
                bf16_widen(bf16::from_f32(special)),
                bf16::from_f32(special).to_f32()
            );
        }
        assert!(bf16_round(f32::NAN).is_nan());
        assert!(bf16_round(f32::from_bits(0x7f80_0001)).is_nan());
    }
}

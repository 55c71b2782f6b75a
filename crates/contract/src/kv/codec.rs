//! Encoding one vector: norm, rotation, nearest level, bit packing, corrected norm.
//!
//! ```text
//! r = |x|,  y = Pi (x / r),  idx_i = nearest level of y_i
//! words:  code i occupies bits [i*b, (i+1)*b) of a little-endian u32 stream, LSB first
//!         (word i*b/32, shift i*b%32; a code may straddle two words)
//! norm:   r / |c(idx)|        so that  x_hat = norm * Pi^T c(idx)  has length r
//! ```
//!
//! Because 8 consecutive codes take exactly `b` bytes, the group of codes `8j..8j+8` always
//! starts at byte `j*b` of a vector's stream; the attention kernels rely on this, and on the
//! [`CODE_PAD`] zero words after a stream of vectors.

use super::codebook::Codebook;
use super::rotation::Rotation;
use crate::error::{Error, Result};
use std::sync::Arc;

/// Zero words a cache keeps after each stream of packed codes (the codes of one sequence and
/// KV head, vector after vector). Attention kernels decode a group of codes with whole-word
/// unaligned loads from the group's first byte (8 codes of `b` bits start at byte `j*b`), so
/// at the last vector of a stream a load can reach past the stream's end; the pad keeps every
/// such load inside the allocation and reading zeros, so kernels need no bounds check and no
/// scalar tail. It is not counted in a cache's size.
pub const CODE_PAD: usize = 2;

/// u32 words holding `dim` codes of `bits` bits.
#[inline]
pub fn words_for(dim: usize, bits: u32) -> usize {
    (dim * bits as usize).div_ceil(32)
}

/// Packs `codes` (each < 2^bits, 1 <= bits <= 8) LSB-first into `out` (overwritten; at least
/// `words_for(codes.len(), bits)` words).
pub fn pack(codes: &[u32], bits: u32, out: &mut [u32]) -> Result<()> {
    check_bits_arg(bits)?;
    check_len("out", out.len(), words_for(codes.len(), bits))?;
    if let Some(i) = codes.iter().position(|&c| c >> bits != 0) {
        return Err(Error::InvalidValue(format!(
            "code {i} = {} does not fit in {bits} bits",
            codes[i]
        )));
    }
    pack_codes(codes, bits, &mut out[..words_for(codes.len(), bits)]);
    Ok(())
}

/// [`pack`] for arguments the caller guarantees (the encoder's own buffers).
#[inline(always)]
fn pack_codes(codes: &[u32], bits: u32, out: &mut [u32]) {
    out.iter_mut().for_each(|w| *w = 0);
    let b = bits as usize;
    if 32 % b == 0 {
        // No code straddles a word: each word ORs a fixed number of codes (unrolled).
        let per_word = 32 / b;
        for (word, group) in out.iter_mut().zip(codes.chunks(per_word)) {
            *word = group
                .iter()
                .enumerate()
                .fold(0, |acc, (i, &c)| acc | c << (i * b));
        }
        return;
    }
    for (i, &c) in codes.iter().enumerate() {
        let bit = i * b;
        let (word, shift) = (bit / 32, bit % 32);
        out[word] |= c << shift;
        if shift + b > 32 {
            out[word + 1] |= c >> (32 - shift);
        }
    }
}

/// Code `i` of a packed stream of `bits`-bit codes (1 <= bits <= 8).
pub fn code_at(words: &[u32], bits: u32, i: usize) -> Result<u32> {
    check_bits_arg(bits)?;
    let capacity = words.len() * 32 / bits as usize;
    if i >= capacity {
        return Err(Error::InvalidValue(format!(
            "code {i} is out of range ({} words hold {capacity} codes of {bits} bits)",
            words.len()
        )));
    }
    Ok(read_code(words, bits, i))
}

/// [`code_at`] for an index the caller guarantees is inside the stream.
#[inline]
fn read_code(words: &[u32], bits: u32, i: usize) -> u32 {
    let b = bits as usize;
    let bit = i * b;
    let (word, shift) = (bit / 32, bit % 32);
    let mut value = words[word] >> shift;
    if shift + b > 32 {
        value |= words[word + 1] << (32 - shift);
    }
    value & ((1u32 << b) - 1)
}

/// Unpacks `codes.len()` codes.
pub fn unpack(words: &[u32], bits: u32, codes: &mut [u32]) -> Result<()> {
    check_bits_arg(bits)?;
    check_len("words", words.len(), words_for(codes.len(), bits))?;
    for (i, c) in codes.iter_mut().enumerate() {
        *c = read_code(words, bits, i);
    }
    Ok(())
}

fn check_bits_arg(bits: u32) -> Result<()> {
    if (1..=8).contains(&bits) {
        Ok(())
    } else {
        Err(Error::InvalidValue(format!(
            "bits = {bits}: packed codes take 1 to 8 bits"
        )))
    }
}

/// Errors unless buffer `name` holds at least `needed` elements.
fn check_len(name: &str, len: usize, needed: usize) -> Result<()> {
    if len >= needed {
        Ok(())
    } else {
        Err(Error::InvalidValue(format!(
            "buffer `{name}` holds {len} elements, at least {needed} needed"
        )))
    }
}

/// `sum(x^2)` in f32 with eight partial sums.
#[inline]
fn sum_squares(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = x.chunks_exact(8);
    let tail: f32 = chunks.remainder().iter().map(|v| v * v).sum();
    for c in chunks {
        for i in 0..8 {
            acc[i] += c[i] * c[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `|x|` as f64. The vectorised f32 sum of squares serves every ordinary vector; when it
/// overflows (a channel above ~1.8e19 at d = 128) or underflows towards zero (every channel
/// below ~1e-15), the norm is recomputed in f64, whose range holds the square of any f32.
#[inline(always)]
pub fn vector_norm(x: &[f32]) -> f64 {
    let fast = sum_squares(x);
    if fast.is_finite() && fast >= 1e-30 {
        return f64::from(fast).sqrt();
    }
    x.iter()
        .map(|&v| f64::from(v) * f64::from(v))
        .sum::<f64>()
        .sqrt()
}

/// Encoder/decoder for one bit width, dimension and rotation.
#[derive(Clone, Debug)]
pub struct Quantizer {
    pub codebook: Arc<Codebook>,
    pub rotation: Arc<Rotation>,
}

impl Quantizer {
    pub fn new(codebook: Arc<Codebook>, rotation: Arc<Rotation>) -> Self {
        Self { codebook, rotation }
    }

    #[inline]
    pub fn dim(&self) -> usize {
        self.rotation.dim()
    }

    #[inline]
    pub fn bits(&self) -> u32 {
        self.codebook.bits
    }

    /// Words per encoded vector.
    #[inline]
    pub fn words(&self) -> usize {
        words_for(self.dim(), self.bits())
    }

    /// Encodes `x` (length d) into `out` (`words()` words); returns the stored norm.
    /// `scratch` and `codes` hold at least d elements. A zero vector stores norm 0.
    #[inline]
    pub fn encode(
        &self,
        x: &[f32],
        out: &mut [u32],
        scratch: &mut [f32],
        codes: &mut [u32],
    ) -> Result<f32> {
        let d = self.dim();
        check_len("x", x.len(), d)?;
        check_len("out", out.len(), self.words())?;
        check_len("scratch", scratch.len(), d)?;
        check_len("codes", codes.len(), d)?;
        Ok(self.encode_row(x, &mut out[..self.words()], scratch, codes))
    }

    /// Encodes `count` vectors of `x`, the i-th starting at `first + i * stride`, into
    /// consecutive `words()`-word rows of `out`, handing each stored norm to `norm` in order:
    /// the loop a cache runs when it appends tokens. `scratch` and `codes` hold at least d
    /// elements. Every length is checked once, before any vector is encoded, and the loop is
    /// always inlined, so a backend's encoding loop compiled for wider instructions (AVX-512 on
    /// the CPU) runs all of it with them.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub fn encode_rows(
        &self,
        x: &[f32],
        first: usize,
        stride: usize,
        count: usize,
        out: &mut [u32],
        scratch: &mut [f32],
        codes: &mut [u32],
        mut norm: impl FnMut(f32),
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let (d, w) = (self.dim(), self.words());
        let needed = (count - 1)
            .checked_mul(stride)
            .and_then(|span| span.checked_add(first))
            .and_then(|start| start.checked_add(d));
        let too_large = || Error::InvalidValue(format!("{count} rows of stride {stride} overflow"));
        check_len("x", x.len(), needed.ok_or_else(too_large)?)?;
        check_len(
            "out",
            out.len(),
            count.checked_mul(w).ok_or_else(too_large)?,
        )?;
        check_len("scratch", scratch.len(), d)?;
        check_len("codes", codes.len(), d)?;
        for (i, row) in out.chunks_exact_mut(w).take(count).enumerate() {
            let at = first + i * stride;
            norm(self.encode_row(&x[at..at + d], row, scratch, codes));
        }
        Ok(())
    }

    /// [`Self::encode`] for buffers it has checked.
    #[inline(always)]
    fn encode_row(
        &self,
        x: &[f32],
        out: &mut [u32],
        scratch: &mut [f32],
        codes: &mut [u32],
    ) -> f32 {
        let d = self.dim();
        let r = vector_norm(&x[..d]);
        let y = &mut scratch[..d];
        self.rotation.apply(x, y);
        let inv = if r > 0.0 { (1.0 / r) as f32 } else { 0.0 };
        let cb = &self.codebook;
        if cb.bits <= 4 {
            // Count the boundaries below each coordinate: branch-free and vectorisable.
            let mut bounds = [f32::INFINITY; 15];
            bounds[..cb.boundaries.len()].copy_from_slice(&cb.boundaries);
            for (c, &v) in codes[..d].iter_mut().zip(y.iter()) {
                let u = v * inv;
                *c = bounds.iter().map(|&b| u32::from(u > b)).sum();
            }
        } else {
            for (c, &v) in codes[..d].iter_mut().zip(y.iter()) {
                *c = cb.nearest(v * inv);
            }
        }
        for (v, &c) in y.iter_mut().zip(codes[..d].iter()) {
            *v = cb.levels[c as usize];
        }
        let code_norm = f64::from(sum_squares(y)).sqrt();
        pack_codes(&codes[..d], self.bits(), out);
        if r > 0.0 && code_norm > 0.0 {
            (r / code_norm) as f32
        } else {
            0.0
        }
    }

    /// The decoded vector in the rotated basis: `norm * c(idx)` (`words()` words in, d out).
    pub fn decode_rotated(&self, words: &[u32], norm: f32, y: &mut [f32]) -> Result<()> {
        check_len("words", words.len(), self.words())?;
        check_len("y", y.len(), self.dim())?;
        for (i, o) in y[..self.dim()].iter_mut().enumerate() {
            *o = norm * self.codebook.levels[read_code(words, self.bits(), i) as usize];
        }
        Ok(())
    }

    /// The decoded vector `norm * Pi^T c(idx)` (`words()` words in, d out).
    pub fn decode(&self, words: &[u32], norm: f32, x: &mut [f32]) -> Result<()> {
        check_len("x", x.len(), self.dim())?;
        let mut y = vec![0.0f32; self.dim()];
        self.decode_rotated(words, norm, &mut y)?;
        self.rotation.apply_inverse(&y, x);
        Ok(())
    }
}

//! GDN decode on the CPU: T = 1..=16 new tokens for each of B sequences, reading and updating a
//! pool of recurrent states in place.
//!
//! Layouts: q, k `[B, T, Hg, K]`; v `[B, T, H, V]`; g, beta `[B, T, H]` (or fused gating from
//! raw `a`, `b` `[B, T, H]` and per-head `A_log`, `dt_bias` `[H]`, see [`super::gating`]);
//! `state_pool [S, H, K, V]` in f32 or bf16; `slot_indices [B]` i32 or i64. Row `b` reads and
//! writes slot `slot_indices[b]`; a negative index skips the row (its outputs are zeros and no
//! slot is read or written). Two rows may not address the same slot.
//!
//! For each row `b` with slot `s`, value head `h` (key head `h / (H / Hg)`), and token
//! `t = 0..T` in order, with `S = pool[s, h]` (K x V, computed in f32):
//!
//! ```text
//! (optional) q_t <- q_t / sqrt(|q_t|^2 + 1e-6), k_t likewise        (use_qk_l2norm)
//! S   <- exp(g_t) * S
//! v'  <- beta_t * (v_t - S^T k_t)
//! S   <- S + k_t v'^T
//! o_t <- scale * S^T q_t                                            (scale = K^-0.5 by default)
//! intermediate_states[b, t, h] <- S                                 (optional, f32)
//! ```
//!
//! and `pool[s, h] <- S` after the last token.
//!
//! The kernel splits work over (row, value head, 32-column block) with rayon, so even B = 1
//! keeps every core busy. Each task loads its block of the slot once (widening bf16 to f32),
//! runs all T tokens through it in L1 with the shared recurrent step, and stores it once
//! (rounding to bf16 once): the pool is read once and written once per call, whatever T is.
//! Everything is validated before the pool is touched, so an error never leaves a partial
//! update.

use super::decode_validate::{PreparedDecode, prepare_decode};
use super::prefill::GdnOptions;
use super::recurrent_kernel::{BLOCK, TokenStep, dot, pad_value, step_block};
use super::validate::GdnDims;
use crate::error::{Error, Result};
use crate::simd::{Fused, MulAdd, Unfused, has_avx2_fma};
use crate::tensor::{DType, HostTensor};
use half::bf16;
use std::sync::atomic::{AtomicUsize, Ordering};

/// How the decay `g` and write strength `beta` are given.
#[derive(Clone, Copy, Debug)]
pub enum Gating<'a> {
    /// `g` and `beta`, both `[B, T, H]`.
    Direct {
        g: &'a HostTensor,
        beta: &'a HostTensor,
    },
    /// Raw `a`, `b` `[B, T, H]` and per-head `A_log`, `dt_bias` `[H]`:
    /// `g = -exp(A_log) * softplus(a + dt_bias)`, `beta = sigmoid(b)`, in f32.
    Fused {
        a: &'a HostTensor,
        b: &'a HostTensor,
        a_log: &'a HostTensor,
        dt_bias: &'a HostTensor,
    },
}

impl<'a> Gating<'a> {
    /// Picks the gating from optional tensors as found in a file: either both of `g`, `beta`
    /// or all four of `a`, `b`, `A_log`, `dt_bias`, and nothing of the other kind.
    pub fn from_parts(
        g: Option<&'a HostTensor>,
        beta: Option<&'a HostTensor>,
        a: Option<&'a HostTensor>,
        b: Option<&'a HostTensor>,
        a_log: Option<&'a HostTensor>,
        dt_bias: Option<&'a HostTensor>,
    ) -> Result<Self> {
        let direct = [("g", g.is_some()), ("beta", beta.is_some())];
        let fused = [
            ("a", a.is_some()),
            ("b", b.is_some()),
            ("A_log", a_log.is_some()),
            ("dt_bias", dt_bias.is_some()),
        ];
        let names = |set: &[(&str, bool)], present: bool| -> Vec<String> {
            set.iter()
                .filter(|(_, p)| *p == present)
                .map(|(n, _)| format!("`{n}`"))
                .collect()
        };
        let any_direct = direct.iter().any(|(_, p)| *p);
        let any_fused = fused.iter().any(|(_, p)| *p);
        if any_direct && any_fused {
            return Err(Error::InvalidValue(format!(
                "give either g and beta or fused gating (a, b, A_log, dt_bias), not both: found {} and {}",
                names(&direct, true).join(", "),
                names(&fused, true).join(", ")
            )));
        }
        match (g, beta, a, b, a_log, dt_bias) {
            (Some(g), Some(beta), None, None, None, None) => Ok(Gating::Direct { g, beta }),
            (None, None, Some(a), Some(b), Some(a_log), Some(dt_bias)) => Ok(Gating::Fused {
                a,
                b,
                a_log,
                dt_bias,
            }),
            _ if any_fused => Err(Error::InvalidValue(format!(
                "fused gating needs a, b, A_log and dt_bias, but {} missing",
                names(&fused, false).join(", ")
            ))),
            _ if any_direct => Err(Error::InvalidValue(format!(
                "gating needs both g and beta, but {} missing",
                names(&direct, false).join(", ")
            ))),
            _ => Err(Error::MissingTensor(
                "g and beta (or fused gating: a, b, A_log, dt_bias)".to_string(),
            )),
        }
    }
}

/// The tensors of one decode call (the pool is passed separately, mutably).
#[derive(Clone, Copy, Debug)]
pub struct DecodeInputs<'a> {
    pub q: &'a HostTensor,
    pub k: &'a HostTensor,
    pub v: &'a HostTensor,
    pub gating: Gating<'a>,
    /// `[B]` i32 or i64; negative = skip the row.
    pub slot_indices: &'a HostTensor,
}

/// Options of one decode call.
#[derive(Clone, Debug, Default)]
pub struct DecodeOptions {
    /// Scale and l2 norm, as for prefill.
    pub gdn: GdnOptions,
    /// Also return the state after every token, `[B, T, H, K, V]` f32.
    pub intermediate_states: bool,
}

/// Decode results (the pool itself is updated in place).
#[derive(Clone, Debug)]
pub struct DecodeOutput {
    /// `[B, T, H, V]` in v's dtype; zeros for skipped rows.
    pub o: HostTensor,
    /// `[B, T, H, K, V]` f32 when asked; zeros for skipped rows.
    pub intermediate_states: Option<HostTensor>,
}

/// A pool element type: widened to f32 when a block is loaded, rounded once when stored.
/// `src`/`dst` hold one block row of `width <= BLOCK` columns; the full-width case is written
/// with fixed-size arrays so it compiles to a few vector moves rather than a `memcpy` call.
trait PoolElem: Copy + Send + Sync {
    /// The pool as f32, when it is f32 (then T = 1 runs on it in place, without a copy).
    fn as_f32_ptr(ptr: *mut Self) -> Option<*mut f32>;
    fn widen(src: &[Self], dst: &mut [f32; BLOCK]);
    fn narrow(src: &[f32; BLOCK], dst: &mut [Self]);
}

impl PoolElem for f32 {
    fn as_f32_ptr(ptr: *mut f32) -> Option<*mut f32> {
        Some(ptr)
    }
    #[inline(always)]
    fn widen(src: &[f32], dst: &mut [f32; BLOCK]) {
        if let Ok(full) = <&[f32; BLOCK]>::try_from(src) {
            *dst = *full;
        } else {
            dst[..src.len()].copy_from_slice(src);
            dst[src.len()..].fill(0.0);
        }
    }
    #[inline(always)]
    fn narrow(src: &[f32; BLOCK], dst: &mut [f32]) {
        if let Ok(full) = <&mut [f32; BLOCK]>::try_from(&mut *dst) {
            // Eight-wide pieces: a whole-array assignment here became a `memcpy` call.
            for (d, s) in full.chunks_exact_mut(8).zip(src.chunks_exact(8)) {
                let piece: [f32; 8] = s.try_into().expect("eight");
                d.copy_from_slice(&piece);
            }
        } else {
            let width = dst.len();
            dst.copy_from_slice(&src[..width]);
        }
    }
}

/// bf16 -> f32 is exact: the bf16 bits are the top half of the f32.
#[inline(always)]
fn bf16_to_f32(x: bf16) -> f32 {
    f32::from_bits(u32::from(x.to_bits()) << 16)
}

/// f32 -> bf16 with round-to-nearest-even (NaN stays a quiet NaN), branch-free so that it
/// vectorises.
#[inline(always)]
fn f32_to_bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    let rounded = bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) >> 16;
    let nan = (bits >> 16) | 0x0040;
    let is_nan = (bits & 0x7FFF_FFFF) > 0x7F80_0000;
    (if is_nan { nan } else { rounded }) as u16
}

#[inline(always)]
fn f32_to_bf16(x: f32) -> bf16 {
    bf16::from_bits(f32_to_bf16_bits(x))
}

impl PoolElem for bf16 {
    fn as_f32_ptr(_: *mut bf16) -> Option<*mut f32> {
        None
    }
    #[inline(always)]
    fn widen(src: &[bf16], dst: &mut [f32; BLOCK]) {
        if let Ok(full) = <&[bf16; BLOCK]>::try_from(src) {
            // SAFETY: `bf16` is `repr(transparent)` over `u16`. Widening plain integers lets
            // the loop vectorise (it stayed scalar through `bf16::to_bits`).
            let bits = unsafe { &*(full as *const [bf16; BLOCK]).cast::<[u16; BLOCK]>() };
            for j in 0..BLOCK {
                dst[j] = f32::from_bits(u32::from(bits[j]) << 16);
            }
        } else {
            for (d, &s) in dst.iter_mut().zip(src) {
                *d = bf16_to_f32(s);
            }
            dst[src.len()..].fill(0.0);
        }
    }
    #[inline(always)]
    fn narrow(src: &[f32; BLOCK], dst: &mut [bf16]) {
        if let Ok(full) = <&mut [bf16; BLOCK]>::try_from(&mut *dst) {
            // SAFETY: `bf16` is `repr(transparent)` over `u16` (as in `widen`).
            let bits = unsafe { &mut *(full as *mut [bf16; BLOCK]).cast::<[u16; BLOCK]>() };
            for j in 0..BLOCK {
                bits[j] = f32_to_bf16_bits(src[j]);
            }
        } else {
            for (d, &s) in dst.iter_mut().zip(src) {
                *d = f32_to_bf16(s);
            }
        }
    }
}

/// A buffer that parallel tasks read and write at disjoint ranges.
struct Shared<T> {
    ptr: *mut T,
    len: usize,
}

// SAFETY: tasks only touch disjoint ranges (see `range`), so sharing the pointer is sound.
unsafe impl<T: Send> Send for Shared<T> {}
unsafe impl<T: Send> Sync for Shared<T> {}

impl<T> Shared<T> {
    fn new(buffer: &mut [T]) -> Self {
        Self {
            ptr: buffer.as_mut_ptr(),
            len: buffer.len(),
        }
    }

    /// The sub-slice `offset..offset + len`.
    ///
    /// # Safety
    /// No two live slices obtained from this buffer may overlap.
    #[allow(clippy::mut_from_ref)]
    unsafe fn range(&self, offset: usize, len: usize) -> &mut [T] {
        assert!(offset + len <= self.len, "decode range out of bounds");
        // SAFETY: in bounds (checked above); disjointness is the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(offset), len) }
    }
}

/// Runs GDN decode on the CPU, updating the addressed slots of `state_pool` (`[S, H, K, V]`,
/// f32 or bf16) in place. On error nothing has been written.
///
/// ```
/// use deltakv_core::gdn::decode_random::{DecodeCase, DecodeSpec};
/// use deltakv_core::gdn::{DecodeInputs, DecodeOptions, GdnOptions, Gating, gdn_decode};
///
/// // 8 sequences, 1 new token each, Qwen3-Next shape; a pool of 10 slots.
/// let case = DecodeCase::random(&DecodeSpec::new(8, 1, 16, 32, 128, 128), 1)?;
/// let mut pool = case.state_pool.clone(); // [S, H, K, V], owned by the engine
/// let inputs = DecodeInputs {
///     q: &case.q,
///     k: &case.k,
///     v: &case.v,
///     gating: Gating::Direct { g: case.gate("g").unwrap(), beta: case.gate("beta").unwrap() },
///     slot_indices: &case.slot_indices,
/// };
/// let options = DecodeOptions {
///     gdn: GdnOptions { scale: None, use_qk_l2norm: false },
///     intermediate_states: false,
/// };
/// let out = gdn_decode(&inputs, &mut pool, &options)?; // the pool is updated in place
/// assert_eq!(out.o.shape(), &[8, 1, 32, 128]);
/// # Ok::<(), deltakv_core::Error>(())
/// ```
pub fn gdn_decode(
    inputs: &DecodeInputs<'_>,
    state_pool: &mut HostTensor,
    options: &DecodeOptions,
) -> Result<DecodeOutput> {
    let p = prepare_decode(inputs, state_pool, &options.gdn)?;
    let d = p.dims;
    let rows = d.batch * d.tokens;
    // Poisoned so that any element a kernel forgets to write shows up as NaN.
    let mut o = vec![f32::NAN; rows * d.value_heads * d.value_dim];
    let mut states = if options.intermediate_states {
        vec![f32::NAN; rows * d.value_heads * d.key_dim * d.value_dim]
    } else {
        Vec::new()
    };
    run_prepared(&p, state_pool, &mut o, &mut states);
    let o = HostTensor::from_f32_as(
        vec![d.batch, d.tokens, d.value_heads, d.value_dim],
        &o,
        p.out_dtype,
    )?;
    let intermediate_states = if options.intermediate_states {
        Some(HostTensor::from_f32(
            vec![d.batch, d.tokens, d.value_heads, d.key_dim, d.value_dim],
            states,
        )?)
    } else {
        None
    };
    Ok(DecodeOutput {
        o,
        intermediate_states,
    })
}

/// [`gdn_decode`] writing into caller-owned f32 buffers, for a serving loop that reuses them
/// every step (no allocation proportional to B * T, and no page faults on a fresh
/// intermediate-states buffer): `o` is `[B, T, H, V]` and, when given, `intermediate_states` is
/// `[B, T, H, K, V]` (then `options.intermediate_states` is ignored). Every element is written
/// (zeros for skipped rows). Returns the call's sizes. On error nothing has been written.
pub fn gdn_decode_into(
    inputs: &DecodeInputs<'_>,
    state_pool: &mut HostTensor,
    options: &GdnOptions,
    o: &mut [f32],
    intermediate_states: Option<&mut [f32]>,
) -> Result<GdnDims> {
    let p = prepare_decode(inputs, state_pool, options)?;
    let d = p.dims;
    let rows = d.batch * d.tokens;
    let check = |name: &str, len: usize, expected: usize, layout: &str| {
        if len == expected {
            Ok(())
        } else {
            Err(Error::InvalidValue(format!(
                "output buffer `{name}` holds {len} values, expected {expected} ({layout} = {:?})",
                [d.batch, d.tokens, d.value_heads, d.key_dim, d.value_dim]
            )))
        }
    };
    check(
        "o",
        o.len(),
        rows * d.value_heads * d.value_dim,
        "B*T*H*V, [B, T, H, K, V]",
    )?;
    let states = match intermediate_states {
        Some(states) => {
            let expected = rows * d.value_heads * d.key_dim * d.value_dim;
            check(
                "intermediate_states",
                states.len(),
                expected,
                "B*T*H*K*V, [B, T, H, K, V]",
            )?;
            states
        }
        None => &mut [],
    };
    run_prepared(&p, state_pool, o, states);
    Ok(d)
}

/// Dispatches on the pool's dtype (validated to be f32 or bf16).
fn run_prepared(
    p: &PreparedDecode,
    state_pool: &mut HostTensor,
    o: &mut [f32],
    states: &mut [f32],
) {
    match p.pool_dtype {
        DType::F32 => {
            let pool = state_pool.as_f32_mut().expect("checked f32 pool");
            run_kernel(p, pool, o, states);
        }
        DType::BF16 => {
            let pool = state_pool.as_bf16_mut().expect("checked bf16 pool");
            run_kernel(p, pool, o, states);
        }
        other => unreachable!("pool dtype {other} passed validation"),
    }
}

/// Per-token scalars shared by every column block: `k . q` per (row, key head) and
/// `exp(g)` per (row, value head).
struct TokenScalars {
    key_dot_query: Vec<f32>,
    decay: Vec<f32>,
}

fn token_scalars(p: &PreparedDecode) -> TokenScalars {
    let kd = p.dims.key_dim;
    TokenScalars {
        key_dot_query: p
            .q
            .chunks_exact(kd)
            .zip(p.k.chunks_exact(kd))
            .map(|(q, k)| dot(k, q))
            .collect(),
        decay: p.g.iter().map(|g| g.exp()).collect(),
    }
}

/// Runs `work(scratch, task)` for every task in `0..tasks` on the rayon pool. Each thread owns a
/// fixed contiguous range (thread `i` of `n` gets the `i`-th n-th), so call after call the same
/// thread touches the same slots and a pool that fits in the cores' caches stays there; a
/// thread that finishes its range early helps the others (tasks are claimed with an atomic
/// cursor per range, so each runs exactly once).
fn for_each_task<S>(
    tasks: usize,
    scratch: impl Fn() -> S + Sync,
    work: impl Fn(&mut S, usize) + Sync,
) {
    let threads = rayon::current_num_threads().clamp(1, tasks.max(1));
    let bounds: Vec<usize> = (0..=threads).map(|i| i * tasks / threads).collect();
    let cursors: Vec<AtomicUsize> = bounds[..threads]
        .iter()
        .map(|&b| AtomicUsize::new(b))
        .collect();
    let run = |me: usize| {
        let mut local = scratch();
        for r in (me..threads).chain(0..me) {
            loop {
                let task = cursors[r].fetch_add(1, Ordering::Relaxed);
                if task >= bounds[r + 1] {
                    break;
                }
                work(&mut local, task);
            }
        }
    };
    if threads == 1 {
        run(0);
    } else {
        rayon::broadcast(|ctx| {
            if ctx.index() < threads {
                run(ctx.index());
            }
        });
    }
}

/// Hints the CPU to bring the `BLOCK` elements at `at` (one or two cache lines) towards L2. A
/// hint only: it never faults, whatever the address, and changes no value.
#[inline(always)]
fn prefetch_block<T>(at: *const T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T1, _mm_prefetch};
        let bytes = BLOCK * std::mem::size_of::<T>();
        for offset in (0..bytes).step_by(64) {
            // SAFETY: prefetch instructions never fault.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(at.cast::<i8>().wrapping_add(offset)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

/// Everything a task needs, shared by all tasks of one call.
struct Kernel<'a, E> {
    p: &'a PreparedDecode,
    scalars: TokenScalars,
    pool: Shared<E>,
    o: Shared<f32>,
    states: Shared<f32>,
    with_states: bool,
    /// Column blocks per task.
    group_len: usize,
    /// Column groups per (row, head).
    groups: usize,
}

impl<E: PoolElem> Kernel<'_, E> {
    /// One (row, value head, column group): for each 32-column block, load it (it then sits
    /// in L1), run every token on it, store it.
    #[inline(always)]
    fn task<M: MulAdd>(&self, buffer: &mut [[f32; BLOCK]], task: usize) {
        let p = self.p;
        let d = p.dims;
        let (kd, vd, heads) = (d.key_dim, d.value_dim, d.value_heads);
        let (row, head, group) = (
            task / (heads * self.groups),
            task / self.groups % heads,
            task % self.groups,
        );
        let col_start = group * self.group_len * BLOCK;
        let col_end = vd.min(col_start + self.group_len * BLOCK);
        let Some(slot) = p.slot_of_row[row] else {
            // Skipped row: zeros out, nothing read or written in the pool.
            let width = col_end - col_start;
            for t in 0..d.tokens {
                let token_head = (row * d.tokens + t) * heads + head;
                // SAFETY: (row, t, head, this group's columns) belong to this task.
                unsafe { self.o.range(token_head * vd + col_start, width) }.fill(0.0);
                if self.with_states {
                    for i in 0..kd {
                        let at = (token_head * kd + i) * vd + col_start;
                        // SAFETY: as above.
                        unsafe { self.states.range(at, width) }.fill(0.0);
                    }
                }
            }
            return;
        };
        let slab = (slot * heads + head) * kd * vd;
        let key_head = d.key_head_of(head);
        // A single token on an f32 pool runs in place, without block copies.
        let in_place = if d.tokens == 1 && !self.with_states && vd.is_multiple_of(BLOCK) {
            E::as_f32_ptr(self.pool.ptr)
        } else {
            None
        };
        if let Some(pool) = in_place {
            assert!(slab + kd * vd <= self.pool.len);
            for col0 in (col_start..col_end).step_by(BLOCK) {
                // SAFETY: (slot, head, this block's columns) belong to this task alone (slots
                // are distinct across rows), and are in bounds (checked above, and
                // col0 + BLOCK <= V).
                unsafe { self.token_in_place::<M>(pool, slab + col0, row, head, key_head, col0) };
            }
            return;
        }
        if d.tokens == 1 && !self.with_states && vd.is_multiple_of(BLOCK) {
            // Any other pool dtype (bf16): the same single pass pair, converting each row as
            // it is read and rounding it once as it is written.
            for col0 in (col_start..col_end).step_by(BLOCK) {
                self.token_converting::<M>(slab + col0, row, head, key_head, col0);
            }
            return;
        }
        let mut out = [0.0f32; BLOCK];
        let block = &mut buffer[..kd];
        for col0 in (col_start..col_end).step_by(BLOCK) {
            let width = BLOCK.min(vd - col0);
            for (i, dst) in block.iter_mut().enumerate() {
                // SAFETY: slots are distinct across rows (validated), so (slot, head, this
                // block's columns) belong to this task alone.
                let src = unsafe { self.pool.range(slab + i * vd + col0, width) };
                E::widen(src, dst);
            }
            for t in 0..d.tokens {
                let token = row * d.tokens + t;
                let key_row = token * d.key_heads + key_head;
                let token_head = token * heads + head;
                let value = pad_value(&p.v[token_head * vd..][..vd], col0);
                let step = TokenStep {
                    q: &p.q[key_row * kd..][..kd],
                    k: &p.k[key_row * kd..][..kd],
                    key_dot_query: self.scalars.key_dot_query[key_row],
                    value: &value,
                    decay: self.scalars.decay[token_head],
                    beta: p.beta[token_head],
                    scale: p.scale,
                };
                step_block(block, &step, &mut out);
                // SAFETY: (token, head, this block's columns) belong to this task alone.
                unsafe { self.o.range(token_head * vd + col0, width) }
                    .copy_from_slice(&out[..width]);
                if self.with_states {
                    for (i, src) in block.iter().enumerate() {
                        let at = (token_head * kd + i) * vd + col0;
                        // SAFETY: as above, for the intermediate state of this token.
                        unsafe { self.states.range(at, width) }.copy_from_slice(&src[..width]);
                    }
                }
            }
            for (i, src) in block.iter().enumerate() {
                // SAFETY: as for the load above.
                let dst = unsafe { self.pool.range(slab + i * vd + col0, width) };
                E::narrow(src, dst);
            }
        }
    }

    /// One token (T = 1) on one 32-column block of an f32 slab, directly in the pool: the
    /// same step as `recurrent_kernel::step_block` (pass 1 reads the rows for `S^T k` and
    /// `S^T q`, pass 2 updates them while they are still in L1), without the copies into and
    /// out of a contiguous block.
    ///
    /// # Safety
    /// Rows `at + i * V .. at + i * V + BLOCK` for `i < K` must be in bounds and touched by no
    /// other thread.
    #[inline(always)]
    unsafe fn token_in_place<M: MulAdd>(
        &self,
        pool: *mut f32,
        at: usize,
        row: usize,
        head: usize,
        key_head: usize,
        col0: usize,
    ) {
        let p = self.p;
        let d = p.dims;
        let (kd, vd) = (d.key_dim, d.value_dim);
        let key_row = row * d.key_heads + key_head;
        let token_head = row * d.value_heads + head;
        let (q, k) = (&p.q[key_row * kd..][..kd], &p.k[key_row * kd..][..kd]);
        let value = pad_value(&p.v[token_head * vd..][..vd], col0);
        let decay = self.scalars.decay[token_head];
        let (beta, scale) = (p.beta[token_head], p.scale);
        let key_dot_query = self.scalars.key_dot_query[key_row];
        let mut sk = [0.0f32; BLOCK];
        let mut sq = [0.0f32; BLOCK];
        let mut ptr = pool.wrapping_add(at);
        // The same block of the next head's slab (contiguous after this one in the slot), to
        // be streamed towards L2 while this one is computed; the next task reads it.
        let next = (head + 1 < d.value_heads).then(|| pool.wrapping_add(at + kd * vd));
        for (i, (&ki, &qi)) in k.iter().zip(q).enumerate() {
            // SAFETY: in bounds and exclusive (the caller's contract).
            let state = unsafe { &*ptr.cast::<[f32; BLOCK]>() };
            for j in 0..BLOCK {
                sk[j] = M::mul_add(ki, state[j], sk[j]);
                sq[j] = M::mul_add(qi, state[j], sq[j]);
            }
            ptr = ptr.wrapping_add(vd);
            if let Some(next) = next {
                prefetch_block(next.wrapping_add(i * vd));
            }
        }
        let mut new_value = [0.0f32; BLOCK];
        let mut out = [0.0f32; BLOCK];
        for j in 0..BLOCK {
            new_value[j] = beta * M::mul_add(-decay, sk[j], value[j]);
            out[j] = scale * M::mul_add(decay, sq[j], key_dot_query * new_value[j]);
        }
        let mut ptr = pool.wrapping_add(at);
        for &ki in k {
            // SAFETY: as above.
            let state = unsafe { &mut *ptr.cast::<[f32; BLOCK]>() };
            for j in 0..BLOCK {
                state[j] = M::mul_add(decay, state[j], ki * new_value[j]);
            }
            ptr = ptr.wrapping_add(vd);
        }
        // SAFETY: (token, head, this block's columns) belong to this task alone.
        unsafe { self.o.range(token_head * vd + col0, BLOCK) }.copy_from_slice(&out);
    }

    /// [`Self::token_in_place`] for a pool of another dtype: pass 1 widens each row as it
    /// reads it, pass 2 widens it again (from L1), updates it and rounds it back once.
    #[inline(always)]
    fn token_converting<M: MulAdd>(
        &self,
        at: usize,
        row: usize,
        head: usize,
        key_head: usize,
        col0: usize,
    ) {
        let p = self.p;
        let d = p.dims;
        let (kd, vd) = (d.key_dim, d.value_dim);
        let key_row = row * d.key_heads + key_head;
        let token_head = row * d.value_heads + head;
        let (q, k) = (&p.q[key_row * kd..][..kd], &p.k[key_row * kd..][..kd]);
        let value = pad_value(&p.v[token_head * vd..][..vd], col0);
        let decay = self.scalars.decay[token_head];
        let (beta, scale) = (p.beta[token_head], p.scale);
        let key_dot_query = self.scalars.key_dot_query[key_row];
        let mut sk = [0.0f32; BLOCK];
        let mut sq = [0.0f32; BLOCK];
        let mut state = [0.0f32; BLOCK];
        let next = (head + 1 < d.value_heads).then(|| self.pool.ptr.wrapping_add(at + kd * vd));
        for (i, (&ki, &qi)) in k.iter().zip(q).enumerate() {
            // SAFETY: slots are distinct across rows (validated), so (slot, head, this
            // block's columns) belong to this task alone.
            E::widen(unsafe { self.pool.range(at + i * vd, BLOCK) }, &mut state);
            for j in 0..BLOCK {
                sk[j] = M::mul_add(ki, state[j], sk[j]);
                sq[j] = M::mul_add(qi, state[j], sq[j]);
            }
            if let Some(next) = next {
                prefetch_block(next.wrapping_add(i * vd));
            }
        }
        let mut new_value = [0.0f32; BLOCK];
        let mut out = [0.0f32; BLOCK];
        for j in 0..BLOCK {
            new_value[j] = beta * M::mul_add(-decay, sk[j], value[j]);
            out[j] = scale * M::mul_add(decay, sq[j], key_dot_query * new_value[j]);
        }
        for (i, &ki) in k.iter().enumerate() {
            // SAFETY: as above.
            let dst = unsafe { self.pool.range(at + i * vd, BLOCK) };
            E::widen(dst, &mut state);
            for j in 0..BLOCK {
                state[j] = M::mul_add(decay, state[j], ki * new_value[j]);
            }
            E::narrow(&state, dst);
        }
        // SAFETY: (token, head, this block's columns) belong to this task alone.
        unsafe { self.o.range(token_head * vd + col0, BLOCK) }.copy_from_slice(&out);
    }

    /// [`Self::task`] compiled for AVX2 + FMA, so the block moves and bf16 conversions are
    /// 256-bit and inline.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn task_avx2(&self, buffer: &mut [[f32; BLOCK]], task: usize) {
        self.task::<Fused>(buffer, task)
    }

    fn run(&self, buffer: &mut [[f32; BLOCK]], task: usize, avx2: bool) {
        #[cfg(target_arch = "x86_64")]
        if avx2 {
            // SAFETY: the CPU supports AVX2 and FMA (checked by the caller).
            unsafe { self.task_avx2(buffer, task) };
            return;
        }
        let _ = avx2;
        self.task::<Unfused>(buffer, task)
    }
}

/// Drives the block kernel. A task is one (row, value head, group of column blocks): with
/// enough rows and heads a group is the whole slab, and with few of them (B = 1 and small H)
/// the slab is split so that every thread still gets work.
fn run_kernel<E: PoolElem>(p: &PreparedDecode, pool: &mut [E], o: &mut [f32], states: &mut [f32]) {
    let d = p.dims;
    let (kd, heads) = (d.key_dim, d.value_heads);
    let blocks = d.value_dim.div_ceil(BLOCK);
    let units = d.batch * heads;
    let wanted = 4 * rayon::current_num_threads();
    let groups = wanted.div_ceil(units).clamp(1, blocks);
    let group_len = blocks.div_ceil(groups);
    let kernel = Kernel {
        p,
        scalars: token_scalars(p),
        with_states: !states.is_empty(),
        pool: Shared::new(pool),
        o: Shared::new(o),
        states: Shared::new(states),
        group_len,
        groups: blocks.div_ceil(group_len),
    };
    let avx2 = has_avx2_fma();
    for_each_task(
        units * kernel.groups,
        || vec![[0.0f32; BLOCK]; kd],
        |buffer, task| kernel.run(buffer, task, avx2),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_conversions_match_half() {
        let mut specials = vec![
            0.0f32,
            -0.0,
            1.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MAX,
            f32::MIN_POSITIVE,
            1.0e-40,
            // Ties at the rounding point, both parities.
            f32::from_bits(0x3F80_8000),
            f32::from_bits(0x3F81_8000),
            f32::from_bits(0x7F7F_FFFF),
        ];
        let mut x = 0x1234_5678u32;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            specials.push(f32::from_bits(x));
        }
        for &v in &specials {
            let ours = f32_to_bf16(v);
            let reference = bf16::from_f32(v);
            if v.is_nan() {
                assert!(ours.is_nan(), "{v:e}");
            } else {
                assert_eq!(ours.to_bits(), reference.to_bits(), "{v:e}");
            }
        }
        let src: Vec<bf16> = specials[..BLOCK]
            .iter()
            .map(|&v| bf16::from_f32(v))
            .collect();
        let mut wide = [0.0f32; BLOCK];
        bf16::widen(&src, &mut wide);
        let mut back = vec![bf16::ZERO; BLOCK];
        bf16::narrow(&wide, &mut back);
        for j in 0..BLOCK {
            assert_eq!(wide[j].to_bits(), src[j].to_f32().to_bits());
            if !src[j].is_nan() {
                assert_eq!(back[j].to_bits(), src[j].to_bits());
            }
        }
    }
}

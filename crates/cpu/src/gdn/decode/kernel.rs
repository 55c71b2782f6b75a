//! The decode kernel: runs validated decode inputs over the pool's addressed slots (see
//! [`super`] for the schedule).

use super::avx512::LANES;
#[cfg(target_arch = "x86_64")]
use super::avx512::{StepInputs, token};
#[cfg(target_arch = "x86_64")]
use super::fused::{FusedTokens, MAX_FUSED, tokens_f32};
use super::pool::PoolElem;
use crate::gdn::recurrent::{BLOCK, TokenStep, dot, pad_value, step_block};
use crate::simd::{DisjointWriter, Fused, MulAdd, Unfused, has_avx2_fma};
use deltakv_contract::gdn::decode::validate::DecodeValues;
use deltakv_contract::view::{HostDataMut, TensorSliceMut};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Columns per block of the AVX-512 multi-token path: K x 64 f32 = 32 KiB at K = 128.
const MULTI_WIDTH: usize = 64;

/// Dispatches on the pool's dtype (validated to be f32 or bf16).
pub(super) fn run_prepared(
    p: &DecodeValues,
    state_pool: &mut (impl HostDataMut + ?Sized),
    o: &mut [f32],
    states: &mut [f32],
) {
    match state_pool.values_mut() {
        TensorSliceMut::F32(pool) => run_kernel(p, pool, o, states),
        TensorSliceMut::BF16(pool) => run_kernel(p, pool, o, states),
        other => unreachable!("pool dtype {} passed validation", other.as_slice().dtype()),
    }
}

/// Per-token scalars shared by every column block: `k . q` per (row, key head) and
/// `exp(g)` per (row, value head).
struct TokenScalars {
    key_dot_query: Vec<f32>,
    decay: Vec<f32>,
}

fn token_scalars(p: &DecodeValues) -> TokenScalars {
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
    // The calling thread takes range 0 itself (`in_place_scope` runs its body here, not in
    // the pool), so a call costs one wake-up of a pool thread instead of a hand-off of the
    // whole call, and range 0 stays on the caller's core from call to call.
    rayon::in_place_scope(|scope| {
        for me in 1..threads {
            let run = &run;
            scope.spawn(move |_| run(me));
        }
        run(0);
    });
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
    p: &'a DecodeValues,
    scalars: TokenScalars,
    pool: DisjointWriter<'a, E>,
    o: DisjointWriter<'a, f32>,
    states: DisjointWriter<'a, f32>,
    with_states: bool,
    /// One token, no intermediate states, V a multiple of 16 and an AVX-512 CPU: the pool
    /// (f32 or bf16) runs [`token`] in place.
    avx512_in_place: bool,
    /// AVX-512 and V a multiple of 16, for the other cases (T > 1 or intermediate states):
    /// [`Self::tokens_avx512`].
    avx512_blocks: bool,
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
        #[cfg(target_arch = "x86_64")]
        if self.avx512_in_place {
            let pool = self.pool.as_ptr();
            assert!(slab + kd * vd <= self.pool.len());
            let width = col_end - col_start;
            let (inputs, token_head) = self.step_inputs(row, head, 0, col_start, width);
            // SAFETY: (token, head, this group's columns) belong to this task alone.
            let out = unsafe { self.o.range(token_head * vd + col_start, width) };
            // SAFETY: the CPU supports AVX-512F (checked when `avx512_in_place` was set); the
            // rows of (slot, head, this group's columns) are in bounds (checked above) and
            // belong to this task alone (slots are distinct across rows); V is a multiple of
            // LANES, so the group's width is too.
            unsafe { token(pool.add(slab + col_start), vd, width, inputs, out) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if self.avx512_blocks {
            self.tokens_avx512(
                buffer.as_flattened_mut(),
                slab,
                row,
                head,
                col_start,
                col_end,
            );
            return;
        }
        if d.tokens == 1 && !self.with_states && vd.is_multiple_of(BLOCK) {
            // A single token: one pass pair on the pool's rows in place, widening each row as
            // it is read and rounding it once as it is written (a plain copy for f32).
            for col0 in (col_start..col_end).step_by(BLOCK) {
                self.token_in_place::<M>(slab + col0, row, head, key_head, col0);
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

    /// Token `t` of batch row `row` for value head `head`, with its value columns
    /// `col0..col0 + width`; also returns the (token, head) index of its output row.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn step_inputs(
        &self,
        row: usize,
        head: usize,
        t: usize,
        col0: usize,
        width: usize,
    ) -> (StepInputs<'_>, usize) {
        let p = self.p;
        let d = p.dims;
        let (kd, vd) = (d.key_dim, d.value_dim);
        let token_row = row * d.tokens + t;
        let key_row = token_row * d.key_heads + d.key_head_of(head);
        let token_head = token_row * d.value_heads + head;
        let step = StepInputs {
            k: &p.k[key_row * kd..][..kd],
            q: &p.q[key_row * kd..][..kd],
            value: &p.v[token_head * vd + col0..][..width],
            decay: self.scalars.decay[token_head],
            beta: p.beta[token_head],
            scale: p.scale,
            key_dot_query: self.scalars.key_dot_query[key_row],
        };
        (step, token_head)
    }

    /// Several tokens (or intermediate states) with AVX-512: per block of up to 64 columns,
    /// the slot's rows are widened into a contiguous K x 64 block (32 KiB: it stays in L1, and
    /// unlike the strided rows in the pool it spreads over every L1 set), every token runs
    /// [`token`] on it, the intermediate states are copied out after each token when asked,
    /// and the block is narrowed back once.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn tokens_avx512(
        &self,
        block: &mut [f32],
        slab: usize,
        row: usize,
        head: usize,
        col_start: usize,
        col_end: usize,
    ) {
        let p = self.p;
        let d = p.dims;
        let (kd, vd) = (d.key_dim, d.value_dim);
        let inputs =
            |t: usize, col0: usize, width: usize| self.step_inputs(row, head, t, col0, width);
        if let Some(pool) = E::as_f32_ptr(self.pool.as_ptr()) {
            // f32: groups of up to MAX_FUSED tokens, each group one read and one write of the
            // slab in place (`fused.rs`). Copying 64-column blocks into a contiguous buffer
            // measured slower: at these sizes the copies cost more L2 traffic than they save.
            assert!(slab + kd * vd <= self.pool.len());
            let width = col_end - col_start;
            let mut first = 0;
            while first < d.tokens {
                let n = MAX_FUSED.min(d.tokens - first);
                let (step0, _) = inputs(first, col_start, width);
                let mut steps = [step0; MAX_FUSED];
                let mut outs = [std::ptr::null_mut(); MAX_FUSED];
                let mut states = [std::ptr::null_mut(); MAX_FUSED];
                for j in 0..n {
                    let (step, token_head) = inputs(first + j, col_start, width);
                    steps[j] = step;
                    // SAFETY: (token, head, this group's columns) belong to this task alone.
                    outs[j] =
                        unsafe { self.o.range(token_head * vd + col_start, width) }.as_mut_ptr();
                    // Row 0 of this token's intermediate state at the group's columns (only
                    // dereferenced when states are asked for, which sizes the buffer).
                    states[j] = self
                        .states
                        .as_ptr()
                        .wrapping_add(token_head * kd * vd + col_start);
                }
                let mut key_dot_key = [[0.0f32; MAX_FUSED]; MAX_FUSED];
                let mut key_dot_later_query = [[0.0f32; MAX_FUSED]; MAX_FUSED];
                for t in 0..n {
                    for s in 0..t {
                        key_dot_key[s][t] = dot(steps[s].k, steps[t].k);
                        key_dot_later_query[s][t] = dot(steps[s].k, steps[t].q);
                    }
                }
                let fused = FusedTokens {
                    steps: &steps[..n],
                    key_dot_key,
                    key_dot_later_query,
                    outs,
                    states: self.with_states.then_some(states),
                };
                // SAFETY: AVX-512F was checked when `avx512_blocks` was set; the rows of
                // (slot, head, this group's columns) are in bounds (checked above) and belong
                // to this task alone, as do the same rows of each token's intermediate state
                // (validated sizes); the width is a multiple of 16.
                unsafe { tokens_f32(pool.add(slab + col_start), vd, width, &fused) };
                first += n;
            }
            return;
        }
        for col0 in (col_start..col_end).step_by(MULTI_WIDTH) {
            let width = MULTI_WIDTH.min(col_end - col0);
            let block = &mut block[..kd * width];
            for (i, dst) in block.chunks_exact_mut(width).enumerate() {
                // SAFETY: slots are distinct across rows (validated), so (slot, head, this
                // block's columns) belong to this task alone.
                E::widen_row(unsafe { self.pool.range(slab + i * vd + col0, width) }, dst);
            }
            for t in 0..d.tokens {
                let (step, token_head) = inputs(t, col0, width);
                // SAFETY: (token, head, this block's columns) belong to this task alone.
                let out = unsafe { self.o.range(token_head * vd + col0, width) };
                // SAFETY: AVX-512F was checked when `avx512_blocks` was set; the block holds
                // K rows of `width` columns, a multiple of 16 (V is, and groups start at
                // multiples of 32).
                unsafe { token(block.as_mut_ptr(), width, width, step, out) };
                if self.with_states {
                    for (i, src) in block.chunks_exact(width).enumerate() {
                        let at = (token_head * kd + i) * vd + col0;
                        // SAFETY: as above, for the intermediate state of this token.
                        unsafe { self.states.range(at, width) }.copy_from_slice(src);
                    }
                }
            }
            for (i, src) in block.chunks_exact(width).enumerate() {
                // SAFETY: as for the load above.
                E::narrow_row(src, unsafe { self.pool.range(slab + i * vd + col0, width) });
            }
        }
    }

    /// One token (T = 1) on one 32-column block of a slab, directly in the pool: the same
    /// step as `recurrent::step_block` (pass 1 reads the rows for `S^T k` and `S^T q`,
    /// pass 2 updates them, last row first, while they are still in L1), without copying the
    /// block out and back. Rows are widened as they are read and rounded once as they are
    /// written (for f32 both are plain copies of a fixed-size row).
    #[inline(always)]
    fn token_in_place<M: MulAdd>(
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
        let next =
            (head + 1 < d.value_heads).then(|| self.pool.as_ptr().wrapping_add(at + kd * vd));
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
        // Last row first: the rows pass 1 read last are the ones still in L1 (the block's rows
        // are `vd` apart and overflow their L1 sets; see `avx512.rs`).
        for (i, &ki) in k.iter().enumerate().rev() {
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

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx2,fma")]
    fn task_avx512(&self, buffer: &mut [[f32; BLOCK]], task: usize) {
        self.task::<Fused>(buffer, task)
    }

    fn run(&self, buffer: &mut [[f32; BLOCK]], task: usize, avx2: bool) {
        #[cfg(target_arch = "x86_64")]
        if avx2 && E::PREFERS_AVX512 && crate::simd::has_avx512() {
            // SAFETY: the CPU supports AVX-512F, AVX2 and FMA (checked just above).
            unsafe { self.task_avx512(buffer, task) };
            return;
        }
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
fn run_kernel<E: PoolElem>(p: &DecodeValues, pool: &mut [E], o: &mut [f32], states: &mut [f32]) {
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
        avx512_in_place: cfg!(target_arch = "x86_64")
            && crate::simd::has_avx512()
            && d.tokens == 1
            && states.is_empty()
            && d.value_dim.is_multiple_of(LANES),
        avx512_blocks: cfg!(target_arch = "x86_64")
            && crate::simd::has_avx512()
            && d.value_dim.is_multiple_of(LANES),
        pool: DisjointWriter::new(pool),
        o: DisjointWriter::new(o),
        states: DisjointWriter::new(states),
        group_len,
        groups: blocks.div_ceil(group_len),
    };
    let avx2 = has_avx2_fma();
    for_each_task(
        units * kernel.groups,
        || vec![[0.0f32; BLOCK]; kd * MULTI_WIDTH.div_ceil(BLOCK)],
        |buffer, task| kernel.run(buffer, task, avx2),
    );
}

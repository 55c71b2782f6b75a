//! Flash-decoding over a KV cache: split-K pass 1 per block of tokens, pass 2 merge.
//!
//! Queries `q [B, Tq, Hq, D]`; query `i` of sequence `b` (cache length `T_b`) sits at position
//! `T_b - Tq + i` and attends to keys `0..=T_b - Tq + i` (Tq = 1 is the decode form). Query
//! head `h` reads KV head `h / (Hq / Hkv)`; the rows of one KV head (Tq x group) share every
//! decoded block.
//!
//! ```text
//! prepare:  q'  = scale * Pi q               (compressed; the dense path uses scale * q)
//! pass 1:   per (sequence, KV head, split): for each block of `block_tokens` tokens,
//!           (m, l, a) of the block (see `kernel`), merged into the split's running (M, L, A)
//! pass 2:   per row: M = max M_s;  o' = sum_s e^(M_s - M) A_s / sum_s e^(M_s - M) L_s
//! finish:   o = Pi^T o'                      (dense: o = o')
//! ```
//!
//! Both merges (blocks into a split, splits into a row) are the contract's
//! [`merge_partial`], whose docs give the math and why it is exact.

use super::cache::{DenseKvCache, KvCache};
use super::kernel::{CodeStream, HeadSource, MAX_ROWS, Rows, Scratch, attend_block, rows_per_call};
use deltakv_contract::kv::merge::{merge_partial, normalize_partial};
use deltakv_contract::kv::paged::{attention_scale, check_query_heads};
use deltakv_contract::tensor::check_finite;
use deltakv_contract::{Error, Result};
use rayon::prelude::*;

/// Largest block accepted (the score buffer holds 4 x block floats per task).
pub const MAX_BLOCK_TOKENS: usize = 1 << 16;

/// Tuning knobs of the attention kernels (the result does not depend on them beyond f32
/// rounding).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnOptions {
    /// Tokens per pass-1 block.
    pub block_tokens: usize,
    /// Splits of the token axis per (sequence, KV head); `None` picks enough for the threads.
    pub splits: Option<usize>,
    /// Use AVX2/FMA when the CPU has it (false forces the portable path, for tests).
    pub simd: bool,
}

impl Default for AttnOptions {
    fn default() -> Self {
        Self {
            block_tokens: 512,
            splits: None,
            simd: true,
        }
    }
}

/// Sizes of one attention call.
#[derive(Clone, Copy, Debug)]
pub(super) struct Plan {
    pub batch: usize,
    pub tq: usize,
    pub hq: usize,
    pub hkv: usize,
    pub d: usize,
    /// Working row length (d rounded up to 8 for codes).
    pub dim: usize,
    pub group: usize,
}

impl Plan {
    fn rows(&self) -> usize {
        self.tq * self.group
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn check_call(
    q: &[f32],
    lens: &[usize],
    tq: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    scale: f32,
    opts: &AttnOptions,
) -> Result<()> {
    let batch = lens.len();
    check_query_heads(tq, hq, hkv, lens)?;
    if q.len() != batch * tq * hq * d {
        return Err(Error::shape(
            "q",
            format!(
                "{} values, expected [B={batch}, Tq={tq}, Hq={hq}, D={d}] = {}",
                q.len(),
                batch * tq * hq * d
            ),
        ));
    }
    check_finite("q", q)?;
    attention_scale(Some(scale), d)?;
    if !(1..=MAX_BLOCK_TOKENS).contains(&opts.block_tokens) {
        return Err(Error::InvalidValue(format!(
            "block_tokens = {} is outside 1..={MAX_BLOCK_TOKENS}",
            opts.block_tokens
        )));
    }
    if opts.splits == Some(0) {
        return Err(Error::InvalidValue("splits must be at least 1".into()));
    }
    Ok(())
}

/// Per-row (m, l, acc) of one split.
struct Partial {
    m: Vec<f32>,
    l: Vec<f32>,
    acc: Vec<f32>,
}

#[allow(clippy::too_many_arguments)]
pub(super) fn run<'a>(
    plan: Plan,
    lens: &[usize],
    q: &[f32],
    scale: f32,
    opts: &AttnOptions,
    source: impl Fn(usize, usize, usize) -> (HeadSource<'a>, usize) + Sync,
    prepare: impl Fn(&[f32], &mut [f32]) -> Result<()> + Sync,
    finish: impl Fn(&[f32], &mut [f32]) -> Result<()> + Sync,
) -> Result<Vec<f32>> {
    let Plan {
        batch,
        tq,
        hq,
        hkv,
        d,
        dim,
        group,
    } = plan;
    let rows = plan.rows();
    // Queries in the working basis: [B, Hkv, rows = Tq x group, dim].
    let mut qw = vec![0.0f32; batch * hkv * rows * dim];
    qw.par_chunks_mut(rows * dim)
        .enumerate()
        .try_for_each(|(sh, out)| {
            let (seq, head) = (sh / hkv, sh % hkv);
            let mut scaled = vec![0.0f32; d];
            for (r, row) in out.chunks_exact_mut(dim).enumerate() {
                let (i, g) = (r / group, r % group);
                let src = &q[((seq * tq + i) * hq + head * group + g) * d..][..d];
                for (o, &x) in scaled.iter_mut().zip(src) {
                    *o = x * scale;
                }
                prepare(&scaled, row)?;
            }
            Ok::<(), Error>(())
        })?;
    // Tasks: (seq, head, block range).
    let block = opts.block_tokens;
    let threads = rayon::current_num_threads().max(1);
    let want = opts
        .splits
        .unwrap_or_else(|| (8 * threads).div_ceil(batch * hkv).max(1));
    let mut tasks = Vec::new();
    for (seq, &len) in lens.iter().enumerate() {
        let blocks = len.div_ceil(block);
        let splits = want.min(blocks).max(1);
        for head in 0..hkv {
            for s in 0..splits {
                let (b0, b1) = (s * blocks / splits, (s + 1) * blocks / splits);
                tasks.push((seq, head, b0 * block, (b1 * block).min(len)));
            }
        }
    }
    let partials: Vec<Partial> = tasks
        .par_iter()
        .map(|&(seq, head, start, end)| {
            let len = lens[seq];
            let qs = &qw[(seq * hkv + head) * rows * dim..][..rows * dim];
            let mut scratch = Scratch::new(dim, block);
            let mut out = Partial {
                m: vec![f32::NEG_INFINITY; rows],
                l: vec![0.0; rows],
                acc: vec![0.0; rows * dim],
            };
            let mut bm = [0.0f32; MAX_ROWS];
            let mut bl = [0.0f32; MAX_ROWS];
            let mut bacc = vec![0.0f32; MAX_ROWS * dim];
            // Row chunks of up to `per_call` rows (one position's GQA group when it fits),
            // with the causal limit of each row; blocks outer so a block's codes stay in cache
            // while every chunk reads them.
            let per_call = rows_per_call(opts.simd);
            let chunks: Vec<(usize, Vec<usize>)> = (0..rows)
                .step_by(per_call)
                .map(|r0| {
                    let nr = per_call.min(rows - r0);
                    (
                        r0,
                        (r0..r0 + nr).map(|r| len - tq + r / group + 1).collect(),
                    )
                })
                .collect();
            let mut t0 = start;
            while t0 < end {
                // The source holding token t0 (a page of a paged cache) and where it ends.
                let (src, segment_end) = source(seq, head, t0);
                let t1 = (t0 + block).min(end).min(segment_end);
                for (r0, limits) in &chunks {
                    let (r0, nr) = (*r0, limits.len());
                    let reach = t1.min(*limits.iter().max().expect("rows"));
                    if t0 >= reach {
                        continue;
                    }
                    let mut view = Rows {
                        q: &qs[r0 * dim..(r0 + nr) * dim],
                        limits,
                        m: &mut bm[..nr],
                        l: &mut bl[..nr],
                        acc: &mut bacc[..nr * dim],
                    };
                    attend_block(&src, dim, t0, reach, &mut view, &mut scratch, opts.simd);
                    for j in 0..nr {
                        let r = r0 + j;
                        merge_partial(
                            &mut out.m[r],
                            &mut out.l[r],
                            &mut out.acc[r * dim..(r + 1) * dim],
                            bm[j],
                            bl[j],
                            &bacc[j * dim..(j + 1) * dim],
                        );
                    }
                }
                t0 = t1;
            }
            out
        })
        .collect();
    // Pass 2: merge the splits of each (seq, head), normalise, rotate back, scatter.
    let mut offsets = Vec::with_capacity(batch * hkv + 1);
    offsets.push(0);
    let mut i = 0;
    while i < tasks.len() {
        let key = (tasks[i].0, tasks[i].1);
        while i < tasks.len() && (tasks[i].0, tasks[i].1) == key {
            i += 1;
        }
        offsets.push(i);
    }
    let merged: Vec<Vec<f32>> = offsets
        .par_windows(2)
        .map(|w| -> Result<Vec<f32>> {
            let parts = &partials[w[0]..w[1]];
            let mut o = vec![0.0f32; rows * d];
            let mut back = vec![0.0f32; d];
            for r in 0..rows {
                let (mut m, mut l, mut a) = (f32::NEG_INFINITY, 0.0f32, vec![0.0f32; dim]);
                for p in parts {
                    merge_partial(
                        &mut m,
                        &mut l,
                        &mut a,
                        p.m[r],
                        p.l[r],
                        &p.acc[r * dim..(r + 1) * dim],
                    );
                }
                normalize_partial(l, &mut a);
                finish(&a, &mut back)?;
                o[r * d..(r + 1) * d].copy_from_slice(&back);
            }
            Ok(o)
        })
        .collect::<Result<_>>()?;
    let mut out = vec![f32::NAN; batch * tq * hq * d];
    for (sh, o) in merged.iter().enumerate() {
        let (seq, head) = (sh / hkv, sh % hkv);
        for (r, row) in o.chunks_exact(d).enumerate() {
            let (i, g) = (r / group, r % group);
            out[((seq * tq + i) * hq + head * group + g) * d..][..d].copy_from_slice(row);
        }
    }
    Ok(out)
}

/// Attention over the compressed cache: `q [B, Tq, Hq, D]` f32 → `o [B, Tq, Hq, D]` f32.
pub fn attend_compressed(
    cache: &KvCache,
    q: &[f32],
    tq: usize,
    hq: usize,
    scale: f32,
    opts: &AttnOptions,
) -> Result<Vec<f32>> {
    let s = cache.scheme();
    let lens: Vec<usize> = (0..cache.batch()).map(|b| cache.len_of(b)).collect();
    check_call(q, &lens, tq, hq, s.kv_heads, s.dim, scale, opts)?;
    let plan = Plan {
        batch: lens.len(),
        tq,
        hq,
        hkv: s.kv_heads,
        d: s.dim,
        dim: s.dim.div_ceil(8) * 8,
        group: hq / s.kv_heads,
    };
    let rotation = cache.rotation();
    run(
        plan,
        &lens,
        q,
        scale,
        opts,
        |seq, head, _| {
            let store = cache.store(seq, head);
            let (kq, vq) = (cache.key_quantizer(), cache.value_quantizer());
            let source = HeadSource::Compressed {
                k: CodeStream::of(&store.k_codes, &store.k_norms, kq),
                v: CodeStream::of(&store.v_codes, &store.v_norms, vq),
                kq,
                vq,
                origin: 0,
            };
            (source, usize::MAX)
        },
        |x, y| {
            rotation.forward(x, y)?;
            y[plan.d..].iter_mut().for_each(|v| *v = 0.0);
            Ok(())
        },
        |y, x| rotation.inverse(&y[..plan.d], x),
    )
}

/// Exact attention over a dense f32 cache, same interface and kernels.
pub fn attend_dense(
    cache: &DenseKvCache,
    q: &[f32],
    tq: usize,
    hq: usize,
    scale: f32,
    opts: &AttnOptions,
) -> Result<Vec<f32>> {
    let lens: Vec<usize> = (0..cache.batch()).map(|b| cache.len_of(b)).collect();
    let (hkv, d) = (cache.kv_heads(), cache.dim());
    check_call(q, &lens, tq, hq, hkv, d, scale, opts)?;
    let plan = Plan {
        batch: lens.len(),
        tq,
        hq,
        hkv,
        d,
        dim: d,
        group: hq / hkv,
    };
    run(
        plan,
        &lens,
        q,
        scale,
        opts,
        |seq, head, _| {
            let (k, v) = cache.store(seq, head);
            (HeadSource::Dense { k, v }, usize::MAX)
        },
        |x, y| {
            y.copy_from_slice(x);
            Ok(())
        },
        |y, x| {
            x.copy_from_slice(y);
            Ok(())
        },
    )
}

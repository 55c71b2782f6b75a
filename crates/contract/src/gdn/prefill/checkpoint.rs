//! State checkpoints of a prefill, for prefix caching and rollback: with `checkpoint_every = N`
//! (a positive multiple of [`CHECKPOINT_GRANULE`] = 64 tokens), sequence `n` of length `L_n`
//! also returns its state after each of the tokens `t = c N`, `c = 1..=floor(L_n / N)`, counted
//! from the sequence's own start (the state the recurrence holds once tokens `0..t` of the
//! sequence went in, the initial state included). When `L_n` is a multiple of `N` the last
//! checkpoint is taken at the sequence end and equals its final state; a sequence shorter than
//! `N` has none.
//!
//! Layout: every checkpoint of a call in one `[C, H, K, V]` f32 tensor, sequence by sequence,
//! each sequence's in position order; `offsets [N + 1]` (like `cu_seqlens`) says that sequence
//! `n`'s are rows `offsets[n]..offsets[n + 1]`, so checkpoint `c` of sequence `n` (at token
//! `c N`) is row `offsets[n] + c - 1`. [`CheckpointPlan`] computes it; every backend uses it.
//!
//! A multiple of 64 puts every checkpoint on a boundary of the chunked algorithm's 64-token
//! chunks (chunks are aligned to each sequence's start), so a chunked kernel stores the state it
//! already holds there: no extra work, no partial chunk.

use super::validate::SeqSpan;
use crate::error::{Error, Result};
use crate::gdn::shapes::GdnDims;
use crate::metrics::rel_rms;
use crate::tensor::HostTensor;

/// Checkpoint spacings must be positive multiples of this many tokens (the chunk size of the
/// chunked algorithm, so checkpoints fall on chunk boundaries).
pub const CHECKPOINT_GRANULE: usize = 64;

/// The entry of [`CheckpointPlan::chunk_table`] for a chunk after which no checkpoint is taken:
/// every bit set, so a kernel reading the table as `i32` sees -1 and one reading `u32` sees
/// its largest value.
pub const NO_CHECKPOINT: u32 = u32::MAX;

/// Where the checkpoints of a call go (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointPlan {
    /// Tokens between checkpoints (`N`).
    pub every: usize,
    /// `[sequences + 1]`: sequence `n`'s checkpoints are rows `offsets[n]..offsets[n + 1]`.
    pub offsets: Vec<usize>,
}

impl CheckpointPlan {
    /// The plan for `every` tokens over the sequences of a call; `every` must be a positive
    /// multiple of [`CHECKPOINT_GRANULE`].
    pub fn new(every: usize, seqs: &[SeqSpan]) -> Result<Self> {
        check_checkpoint_every(every)?;
        let mut offsets = Vec::with_capacity(seqs.len() + 1);
        offsets.push(0);
        for seq in seqs {
            offsets.push(offsets.last().copied().unwrap_or(0) + seq.len / every);
        }
        Ok(Self { every, offsets })
    }

    /// [`CheckpointPlan::new`] when checkpoints are asked for.
    pub fn optional(every: Option<usize>, seqs: &[SeqSpan]) -> Result<Option<Self>> {
        every.map(|every| Self::new(every, seqs)).transpose()
    }

    /// Checkpoints of the whole call (`C`).
    pub fn total(&self) -> usize {
        self.offsets.last().copied().unwrap_or(0)
    }

    /// The shape of the checkpoint tensor, `[C, H, K, V]`.
    pub fn shape(&self, dims: &GdnDims) -> Vec<usize> {
        vec![self.total(), dims.value_heads, dims.key_dim, dims.value_dim]
    }

    /// The row of sequence `n`'s checkpoint at `position` tokens from its start, or `None`
    /// when no checkpoint is taken there.
    pub fn row_at(&self, n: usize, position: usize) -> Option<usize> {
        let (first, end) = (*self.offsets.get(n)?, *self.offsets.get(n + 1)?);
        if position == 0 || !position.is_multiple_of(self.every) {
            return None;
        }
        let row = first + position / self.every - 1;
        (row < end).then_some(row)
    }

    /// For each chunk of `chunk` tokens of the call (sequence by sequence, each sequence's
    /// chunks from its start, the last one shorter), the row of the checkpoint taken at the
    /// chunk's end, or `None`: the table a chunked kernel reads to store the state it holds
    /// after each chunk (every checkpoint falls on a chunk end where `chunk` divides `every`).
    pub fn rows_after_chunks(&self, seqs: &[SeqSpan], chunk: usize) -> Vec<Option<usize>> {
        let chunk = chunk.max(1);
        seqs.iter()
            .enumerate()
            .flat_map(|(n, seq)| {
                (0..seq.len)
                    .step_by(chunk)
                    .map(move |first| self.row_at(n, (first + chunk).min(seq.len)))
            })
            .collect()
    }

    /// [`rows_after_chunks`](Self::rows_after_chunks) as the 32-bit table the chunked kernels
    /// read: the row, or [`NO_CHECKPOINT`]. Rows must fit a non-negative `i32` (the CUDA kernels
    /// test the sign): a call with more checkpoints is refused.
    pub fn chunk_table(&self, seqs: &[SeqSpan], chunk: usize) -> Result<Vec<u32>> {
        if self.total() > i32::MAX as usize {
            return Err(Error::Unsupported(format!(
                "{} checkpoints in one call: at most {} (the kernels' 32-bit table)",
                self.total(),
                i32::MAX
            )));
        }
        Ok(self
            .rows_after_chunks(seqs, chunk)
            .into_iter()
            .map(|row| row.map_or(NO_CHECKPOINT, |row| row as u32))
            .collect())
    }

    /// The first sequence whose checkpoint at its end (there is one where its length is a
    /// multiple of `every`) is not its final state bit for bit, or `None`: `states` the
    /// `[C, H, K, V]` checkpoints, `finals` the `[N, H, K, V]` final states of `seqs`.
    pub fn first_end_mismatch(
        &self,
        seqs: &[SeqSpan],
        states: &[f32],
        finals: &[f32],
    ) -> Option<usize> {
        let state_len = finals.len() / seqs.len().max(1);
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        seqs.iter().enumerate().position(|(n, seq)| {
            self.row_at(n, seq.len).is_some_and(|row| {
                let checkpoint = states.get(row * state_len..(row + 1) * state_len);
                let last = &finals[n * state_len..(n + 1) * state_len];
                checkpoint.is_none_or(|c| bits(c) != bits(last))
            })
        })
    }

    /// `offsets` as an i64 `[sequences + 1]` tensor (the `checkpoint_offsets` of a file).
    pub fn offsets_tensor(&self) -> Result<HostTensor> {
        HostTensor::from_i64(
            vec![self.offsets.len()],
            self.offsets.iter().map(|&x| x as i64).collect(),
        )
    }
}

/// Fails unless `every` is a positive multiple of [`CHECKPOINT_GRANULE`].
pub fn check_checkpoint_every(every: usize) -> Result<()> {
    if every == 0 || !every.is_multiple_of(CHECKPOINT_GRANULE) {
        return Err(Error::InvalidValue(format!(
            "checkpoint_every must be a positive multiple of {CHECKPOINT_GRANULE} tokens \
             (checkpoints fall on chunk boundaries), got {every}"
        )));
    }
    Ok(())
}

/// The checkpoints a prefill returns.
#[derive(Clone, Debug)]
pub struct PrefillCheckpoints {
    /// `[C, H, K, V]` f32, laid out by [`CheckpointPlan`].
    pub states: HostTensor,
    /// `[N + 1]` i64: sequence `n`'s checkpoints are rows `offsets[n]..offsets[n + 1]`.
    pub offsets: HostTensor,
    /// Tokens between checkpoints.
    pub every: usize,
}

/// The largest [`rel_rms`] of one checkpoint (a `[H, K, V]` row) of `states` against the
/// oracle's `reference` (same layout, all heads), so that one wrong or unwritten checkpoint
/// among many still fails a test. Infinite when the lengths differ.
pub fn worst_checkpoint_error(states: &[f32], reference: &[f64], rows: usize) -> f64 {
    if states.len() != reference.len() {
        return f64::INFINITY;
    }
    if rows == 0 || states.is_empty() {
        return if states.is_empty() {
            0.0
        } else {
            f64::INFINITY
        };
    }
    if !states.len().is_multiple_of(rows) {
        return f64::INFINITY;
    }
    let row_len = states.len() / rows;
    states
        .chunks_exact(row_len)
        .zip(reference.chunks_exact(row_len))
        .map(|(x, r)| rel_rms(x, r))
        .fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spans(lens: &[usize]) -> Vec<SeqSpan> {
        SeqSpan::back_to_back(lens)
    }

    #[test]
    fn chunk_tables_mark_the_chunks_that_end_on_a_checkpoint() {
        let seqs = spans(&[1, 130, 192, 64]);
        let plan = CheckpointPlan::new(64, &seqs).unwrap();
        // Chunks of 64: [1] | [64, 64, 2] | [64, 64, 64] | [64].
        assert_eq!(
            plan.rows_after_chunks(&seqs, 64),
            vec![
                None,
                Some(0),
                Some(1),
                None,
                Some(2),
                Some(3),
                Some(4),
                Some(5)
            ]
        );
        // Chunks of 32 end on the same rows every other chunk.
        let halves = plan.rows_after_chunks(&seqs, 32);
        assert_eq!(halves.len(), 1 + 5 + 6 + 2);
        assert_eq!(halves.iter().flatten().count(), plan.total());
        assert_eq!(&halves[1..6], &[None, Some(0), None, Some(1), None]);
        // The kernels' table: the same rows, NO_CHECKPOINT (-1 as an i32) elsewhere.
        let none = NO_CHECKPOINT;
        assert_eq!(
            plan.chunk_table(&seqs, 64).unwrap(),
            vec![none, 0, 1, none, 2, 3, 4, 5]
        );
        assert_eq!(NO_CHECKPOINT as i32, -1);
    }

    #[test]
    fn an_end_checkpoint_must_equal_its_final_state() {
        // Sequences of 64 (one checkpoint, at its end), 100 (one, not at its end) and 128 (two,
        // the second at its end); states of 2 floats.
        let seqs = spans(&[64, 100, 128]);
        let plan = CheckpointPlan::new(64, &seqs).unwrap();
        let finals = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let mut states = vec![1.0f32, 2.0, 9.0, 9.0, 7.0, 7.0, 5.0, 6.0];
        assert_eq!(plan.first_end_mismatch(&seqs, &states, &finals), None);
        states[7] = 6.5;
        assert_eq!(plan.first_end_mismatch(&seqs, &states, &finals), Some(2));
        states[0] = -1.0;
        assert_eq!(plan.first_end_mismatch(&seqs, &states, &finals), Some(0));
        // Missing rows count as a mismatch.
        assert_eq!(
            plan.first_end_mismatch(&seqs, &states[..4], &finals),
            Some(0)
        );
    }

    #[test]
    fn offsets_count_whole_spacings_per_sequence() {
        let plan = CheckpointPlan::new(128, &spans(&[1, 127, 128, 300, 64, 256])).unwrap();
        assert_eq!(plan.offsets, vec![0, 0, 0, 1, 3, 3, 5]);
        assert_eq!(plan.total(), 5);
        // The sequence end counts when the length is a multiple of the spacing.
        assert_eq!(plan.row_at(2, 128), Some(0));
        assert_eq!(plan.row_at(3, 128), Some(1));
        assert_eq!(plan.row_at(3, 256), Some(2));
        assert_eq!(plan.row_at(3, 300), None);
        assert_eq!(plan.row_at(3, 384), None);
        assert_eq!(plan.row_at(5, 256), Some(4));
        assert_eq!(plan.row_at(5, 64), None);
        assert_eq!(plan.row_at(0, 0), None);
        assert_eq!(plan.row_at(6, 128), None);
    }

    #[test]
    fn spacings_off_the_granule_are_refused() {
        let seqs = spans(&[100]);
        for bad in [0, 1, 63, 65, 100, 200] {
            let err = CheckpointPlan::new(bad, &seqs).unwrap_err().to_string();
            assert!(err.contains("multiple of 64"), "{bad}: {err}");
        }
        assert!(CheckpointPlan::optional(None, &seqs).unwrap().is_none());
        assert_eq!(CheckpointPlan::new(192, &seqs).unwrap().total(), 0);
    }
}

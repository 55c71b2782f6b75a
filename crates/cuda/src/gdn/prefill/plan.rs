//! The host-side schedule of a prefill call: 64-token chunks of each sequence, and segments of
//! consecutive chunks that the state pass walks in parallel (a two-level scan) when the
//! sequences and heads alone would leave most multiprocessors idle.

use deltakv_contract::gdn::prefill::validate::SeqSpan;

/// Tokens per chunk (the kernels' `PF_CHUNK`).
pub(crate) const CHUNK: usize = 64;
/// Value columns per state block (the kernels' `PF_TILE`).
pub(crate) const TILE: usize = 64;
/// i32 fields of one segment record (the kernels' `SEG_FIELDS`).
pub(crate) const SEGMENT_FIELDS: usize = 5;

/// Padded sizes the kernels are compiled for: K to 64, 128 or 256; V likewise.
pub(crate) fn padded_dim(dim: usize) -> usize {
    match dim {
        0..=64 => 64,
        65..=128 => 128,
        _ => 256,
    }
}

/// The chunks and segments of a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PrefillPlan {
    /// First flattened token row of each chunk.
    pub chunk_first_row: Vec<i64>,
    /// Tokens in each chunk (64, or fewer at a sequence end).
    pub chunk_len: Vec<i32>,
    /// `[segments, SEGMENT_FIELDS]`: sequence, first chunk, chunk count, index in the
    /// sequence, the sequence's segment count.
    pub segments: Vec<i32>,
    /// `[N + 1]`: the first segment of each sequence.
    pub seq_first_segment: Vec<i32>,
    /// True when some sequence has more than one segment (the transition and combine kernels
    /// run, and every segment reads its entry state from the combined states).
    pub segmented: bool,
}

impl PrefillPlan {
    /// Splits `seqs` into chunks, and into segments of about `segment_chunks` chunks each
    /// (`None`: chosen so that one wave of state blocks, `parallel_units` per segment, about
    /// fills `multiprocessors`).
    pub(crate) fn new(
        seqs: &[SeqSpan],
        parallel_units: usize,
        multiprocessors: usize,
        segment_chunks: Option<usize>,
    ) -> Self {
        let mut chunk_first_row = Vec::new();
        let mut chunk_len = Vec::new();
        let chunks_per_seq: Vec<usize> = seqs.iter().map(|s| s.len.div_ceil(CHUNK)).collect();
        let total_chunks: usize = chunks_per_seq.iter().sum();
        // Segments per sequence so that N * segments * units is about one wave.
        let segment_len = segment_chunks.unwrap_or_else(|| {
            let waves = (multiprocessors / parallel_units.max(1)).max(1);
            let busy = seqs.len() * parallel_units >= multiprocessors;
            if busy || waves == 1 {
                usize::MAX
            } else {
                total_chunks.div_ceil(waves).max(4)
            }
        });
        let mut segments = Vec::new();
        let mut seq_first_segment = vec![0i32];
        let mut segmented = false;
        for (n, (span, &chunks)) in seqs.iter().zip(&chunks_per_seq).enumerate() {
            let first_chunk = chunk_first_row.len();
            for c in 0..chunks {
                chunk_first_row.push((span.start + c * CHUNK) as i64);
                chunk_len.push((span.len - c * CHUNK).min(CHUNK) as i32);
            }
            // Near-equal segments of at most `segment_len` chunks.
            let per = chunks.div_ceil(chunks.div_ceil(segment_len.max(1)).max(1));
            let bounds: Vec<(usize, usize)> = (0..chunks)
                .step_by(per.max(1))
                .map(|first| (first, per.min(chunks - first)))
                .collect();
            let count = bounds.len();
            segmented |= count > 1;
            for (s, (first, len)) in bounds.into_iter().enumerate() {
                segments.extend_from_slice(&[
                    n as i32,
                    (first_chunk + first) as i32,
                    len as i32,
                    s as i32,
                    count as i32,
                ]);
            }
            seq_first_segment.push((segments.len() / SEGMENT_FIELDS) as i32);
        }
        Self {
            chunk_first_row,
            chunk_len,
            segments,
            seq_first_segment,
            segmented,
        }
    }

    pub(crate) fn chunks(&self) -> usize {
        self.chunk_len.len()
    }

    pub(crate) fn segment_count(&self) -> usize {
        self.segments.len() / SEGMENT_FIELDS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spans(lens: &[usize]) -> Vec<SeqSpan> {
        let mut start = 0;
        lens.iter()
            .map(|&len| {
                let s = SeqSpan { start, len };
                start += len;
                s
            })
            .collect()
    }

    #[test]
    fn chunks_cover_every_token_once() {
        let plan = PrefillPlan::new(&spans(&[1, 63, 64, 65, 1000]), 64, 132, None);
        let mut covered = 0;
        for (&first, &len) in plan.chunk_first_row.iter().zip(&plan.chunk_len) {
            assert_eq!(first, covered as i64);
            assert!((1..=64).contains(&len));
            covered += len as usize;
        }
        assert_eq!(covered, 1 + 63 + 64 + 65 + 1000);
    }

    #[test]
    fn few_heads_split_long_sequences_into_segments() {
        // One sequence of 16384 tokens, 32 heads x 2 column tiles: two segments of 128 chunks.
        let plan = PrefillPlan::new(&spans(&[16384]), 64, 132, None);
        assert!(plan.segmented);
        assert_eq!(plan.segments, vec![0, 0, 128, 0, 2, 0, 128, 128, 1, 2]);
        // Eight sequences fill the GPU on their own: one segment each.
        let plan = PrefillPlan::new(&spans(&[8192; 8]), 64, 132, None);
        assert!(!plan.segmented);
        assert_eq!(plan.segment_count(), 8);
        // A forced segment length splits every sequence, the last segment shorter.
        let plan = PrefillPlan::new(&spans(&[65 * 64 + 5]), 64, 132, Some(16));
        let counts: Vec<i32> = plan.segments.chunks(SEGMENT_FIELDS).map(|s| s[2]).collect();
        assert_eq!(counts.iter().sum::<i32>(), 66);
        assert!(counts.iter().all(|&c| c <= 16));
        assert_eq!(plan.seq_first_segment, vec![0, counts.len() as i32]);
    }
}

//! The host-side schedule of a prefill call: 64-token chunks of each sequence, and how the
//! state pass splits a long sequence when the sequences and heads alone would leave most
//! multiprocessors idle:
//!
//! - **the two-level scan**: segments of consecutive chunks walked in parallel, each from a
//!   zero state and from the identity (its map `S_exit = M S_entry + D`), the entry states
//!   combined in order, then every segment's outputs from its entry state;
//! - **the relay**: two segments; the first segment's outputs are walked from the sequence's
//!   initial state on a second stream while a walk without outputs (the lead) carries the same
//!   state to the first segment's end, where the second segment's outputs start. No map, no
//!   combine: the second segment waits only for the lead, which is faster per chunk than a walk
//!   with outputs, so the first segment is the longer one.

use deltakv_contract::gdn::prefill::validate::SeqSpan;

/// Tokens per chunk (the kernels' `PF_CHUNK`).
pub(crate) const CHUNK: usize = 64;
/// Value columns per state block (the kernels' `PF_TILE`).
pub(crate) const TILE: usize = 64;
/// bf16 elements of padding per padded shared-memory row (the kernels' `PF_PAD`).
pub(crate) const PAD: usize = 8;
/// i32 fields of one segment record (the kernels' `SEG_FIELDS`).
pub(crate) const SEGMENT_FIELDS: usize = 5;
/// The first segment's share of a relayed sequence when the call does not say: about where both
/// streams end together. At T 16384 on the H200 (ncu, 2026-11-28, at the share 0.75) the lead
/// took 220-221 us and the first segment's outputs walk 373-375 us over the first 192 chunks,
/// the second segment's walk 130 us over the other 64. Of the shares timed there with one binary (0.65, 0.7, 0.75, 0.8;
/// kernel log, after the prefill rows) 0.7 was fastest at T 16384 (0.744 / 0.745 ms against
/// 0.757 / 0.758 at 0.75) and a little slower at T 4096 (0.207 against 0.205-0.206).
pub(crate) const RELAY_LEAD_SHARE: f64 = 0.7;

/// Where two waves of state blocks fit (the relay's regime), a sequence of at most this many
/// chunks is walked whole. On the H200 at Qwen3-Next's heads (kernel log, short prompts;
/// 2026-11-28) the relay wins from 16 chunks on: relayed against whole 0.071 / 0.073 ms at T
/// 1024, 0.091 / 0.097 at 1536, 0.125-0.126 / 0.129-0.130 at 2048, 0.140 / 0.153 at 2560.
/// Shorter sequences (at most 15 chunks) were not timed either way, so they keep the whole
/// walk. (The H100 had the whole walk ahead up to ~40 chunks: its fork, hand-over and join
/// cost more against its slower walks.)
pub(crate) const RELAY_MIN_CHUNKS: usize = 15;

/// How `Split::Auto` relays where the relay runs: the first segment's share of a sequence, and
/// the longest sequence (in chunks) still walked whole.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct RelayRule {
    pub share: f64,
    pub min_chunks: usize,
}

impl RelayRule {
    /// `share` with the default [`RELAY_MIN_CHUNKS`].
    pub(crate) fn share(share: f64) -> Self {
        Self {
            share,
            min_chunks: RELAY_MIN_CHUNKS,
        }
    }
}

/// Padded sizes the kernels are compiled for: K to 64, 128 or 256; V likewise.
pub(crate) fn padded_dim(dim: usize) -> usize {
    match dim {
        0..=64 => 64,
        65..=128 => 128,
        _ => 256,
    }
}

/// How the state pass splits long sequences.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Split {
    /// Chosen from the GPU's size: none when the sequences' state blocks fill the GPU or one
    /// wave of them leaves no room for a second; the relay when exactly two waves fit (for
    /// sequences of more than `RELAY_MIN_CHUNKS` chunks; shorter ones are walked whole); the
    /// two-level scan when more do.
    #[default]
    Auto,
    /// The two-level scan over segments of at most this many chunks.
    Scan(usize),
    /// The relay for every sequence of more than this many chunks, its first segment this
    /// many chunks long.
    Relay(usize),
}

/// The chunks and segments of a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PrefillPlan {
    /// First flattened token row of each chunk.
    pub chunk_first_row: Vec<i64>,
    /// Tokens in each chunk (64, or fewer at a sequence end).
    pub chunk_len: Vec<i32>,
    /// `[segments, SEGMENT_FIELDS]`: sequence, first chunk, chunk count, index in the
    /// sequence, the sequence's segment count. Scan and no split: sequence by sequence, each
    /// sequence's segments in order. Relay: the first segments of the relayed sequences, then
    /// the other sequences (whole), then the relayed sequences' second segments, in the same
    /// order as their first ones (so the lead's segment record `j` hands its state to record `j`
    /// of the second segments' launch).
    pub segments: Vec<i32>,
    /// `[N + 1]`: the first segment of each sequence, then the table's length (the scan's
    /// combine reads a sequence's segments as consecutive records; not used by the relay).
    pub seq_first_segment: Vec<i32>,
    /// True when the two-level scan runs (the transition and combine kernels, and every
    /// segment reads its entry state from the combined states).
    pub segmented: bool,
    /// Sequences the relay splits (0: no relay).
    pub relayed: usize,
}

impl PrefillPlan {
    /// Splits `seqs` into chunks, and long sequences into segments as `split` says; `Auto`
    /// uses the relay (by `relay`'s rule) where it applies and `relay` is given. One wave of
    /// state blocks is `parallel_units` per segment.
    pub(crate) fn new(
        seqs: &[SeqSpan],
        parallel_units: usize,
        multiprocessors: usize,
        split: Split,
        relay: Option<RelayRule>,
    ) -> Self {
        let mut chunk_first_row = Vec::new();
        let mut chunk_len = Vec::new();
        let chunks_per_seq: Vec<usize> = seqs.iter().map(|s| s.len.div_ceil(CHUNK)).collect();
        for (span, &chunks) in seqs.iter().zip(&chunks_per_seq) {
            for c in 0..chunks {
                chunk_first_row.push((span.start + c * CHUNK) as i64);
                chunk_len.push((span.len - c * CHUNK).min(CHUNK) as i32);
            }
        }
        let total_chunks: usize = chunks_per_seq.iter().sum();
        let waves = (multiprocessors / parallel_units.max(1)).max(1);
        let busy = seqs.len() * parallel_units >= multiprocessors;
        // Auto: segments so that N * segments * units is about one wave.
        let auto_len = || {
            if busy || waves == 1 {
                usize::MAX
            } else {
                total_chunks.div_ceil(waves).max(4)
            }
        };
        let first_chunks: Vec<usize> = chunks_per_seq
            .iter()
            .scan(0, |next, &chunks| {
                let first = *next;
                *next += chunks;
                Some(first)
            })
            .collect();
        // The relay's regime (under Split::Auto): exactly two waves of walks fit and the
        // sequences alone do not fill the GPU; elsewhere there is no share to relay by.
        let relay = relay.filter(|_| waves == 2 && !busy);
        let relay_lead = |chunks: usize| -> Option<usize> {
            match split {
                Split::Relay(lead) => (chunks > lead.max(1)).then_some(lead.max(1)),
                Split::Auto => relay
                    .filter(|rule| chunks > auto_len().max(rule.min_chunks))
                    .map(|rule| {
                        ((chunks as f64 * rule.share).ceil() as usize).clamp(1, chunks - 1)
                    }),
                Split::Scan(_) => None,
            }
        };
        let leads: Vec<Option<usize>> = chunks_per_seq.iter().map(|&c| relay_lead(c)).collect();
        if leads.iter().any(Option::is_some) {
            return Self::relay(
                chunk_first_row,
                chunk_len,
                &chunks_per_seq,
                &first_chunks,
                &leads,
            );
        }
        let segment_len = match split {
            Split::Scan(len) => len.max(1),
            // The relay's regime: a sequence too short to relay is walked whole.
            Split::Auto if relay.is_some() => usize::MAX,
            Split::Auto => auto_len(),
            // No sequence is longer than the relay's first segment: each is walked whole.
            Split::Relay(_) => usize::MAX,
        };
        let mut segments = Vec::new();
        let mut seq_first_segment = vec![0i32];
        let mut segmented = false;
        for (n, (&chunks, &first_chunk)) in chunks_per_seq.iter().zip(&first_chunks).enumerate() {
            // Near-equal segments of at most `segment_len` chunks.
            let per = chunks.div_ceil(chunks.div_ceil(segment_len).max(1));
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
            relayed: 0,
        }
    }

    /// The relay's table (see `segments`): sequence `n` in two segments when `leads[n]` holds
    /// its first segment's length.
    fn relay(
        chunk_first_row: Vec<i64>,
        chunk_len: Vec<i32>,
        chunks_per_seq: &[usize],
        first_chunks: &[usize],
        leads: &[Option<usize>],
    ) -> Self {
        let record = |n: usize, first: usize, len: usize, index: i32, count: i32| {
            [n as i32, first as i32, len as i32, index, count]
        };
        let relayed: Vec<usize> = (0..leads.len()).filter(|&n| leads[n].is_some()).collect();
        let whole: Vec<usize> = (0..leads.len()).filter(|&n| leads[n].is_none()).collect();
        let mut segments = Vec::new();
        let mut seq_first_segment = vec![0i32; leads.len() + 1];
        for &n in relayed.iter().chain(&whole) {
            seq_first_segment[n] = (segments.len() / SEGMENT_FIELDS) as i32;
            let (first, chunks) = (first_chunks[n], chunks_per_seq[n]);
            segments.extend(match leads[n] {
                Some(lead) => record(n, first, lead, 0, 2),
                None => record(n, first, chunks, 0, 1),
            });
        }
        for &n in &relayed {
            let lead = leads[n].unwrap_or(0);
            let (first, chunks) = (first_chunks[n], chunks_per_seq[n]);
            segments.extend(record(n, first + lead, chunks - lead, 1, 2));
        }
        seq_first_segment[leads.len()] = (segments.len() / SEGMENT_FIELDS) as i32;
        Self {
            chunk_first_row,
            chunk_len,
            segments,
            seq_first_segment,
            segmented: false,
            relayed: relayed.len(),
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
        SeqSpan::back_to_back(lens)
    }

    fn records(plan: &PrefillPlan) -> Vec<&[i32]> {
        plan.segments.chunks(SEGMENT_FIELDS).collect()
    }

    #[test]
    fn chunks_cover_every_token_once() {
        let plan = PrefillPlan::new(&spans(&[1, 63, 64, 65, 1000]), 64, 132, Split::Auto, None);
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
        let plan = PrefillPlan::new(&spans(&[16384]), 64, 132, Split::Auto, None);
        assert!(plan.segmented);
        assert_eq!(plan.segments, vec![0, 0, 128, 0, 2, 0, 128, 128, 1, 2]);
        // Eight sequences fill the GPU on their own: one segment each.
        let plan = PrefillPlan::new(
            &spans(&[8192; 8]),
            64,
            132,
            Split::Auto,
            Some(RelayRule::share(0.75)),
        );
        assert!(!plan.segmented);
        assert_eq!((plan.segment_count(), plan.relayed), (8, 0));
        // A forced segment length splits every sequence, the last segment shorter.
        let plan = PrefillPlan::new(
            &spans(&[65 * 64 + 5]),
            64,
            132,
            Split::Scan(16),
            Some(RelayRule::share(0.75)),
        );
        let counts: Vec<i32> = records(&plan).iter().map(|s| s[2]).collect();
        assert_eq!(counts.iter().sum::<i32>(), 66);
        assert!(counts.iter().all(|&c| c <= 16));
        assert_eq!(plan.seq_first_segment, vec![0, counts.len() as i32]);
        // Eight waves of state blocks (the TP-8 shard): the scan, not the relay.
        let plan = PrefillPlan::new(
            &spans(&[65536]),
            16,
            132,
            Split::Auto,
            Some(RelayRule::share(0.75)),
        );
        assert!(plan.segmented);
        assert_eq!((plan.segment_count(), plan.relayed), (8, 0));
    }

    #[test]
    fn two_waves_relay_long_sequences() {
        // Qwen3-Next's shape: 256 chunks, the first segment the default share of them.
        let plan = PrefillPlan::new(
            &spans(&[16384]),
            64,
            132,
            Split::Auto,
            Some(RelayRule::share(RELAY_LEAD_SHARE)),
        );
        assert!(!plan.segmented);
        assert_eq!(plan.relayed, 1);
        assert_eq!(plan.segments, vec![0, 0, 180, 0, 2, 0, 180, 76, 1, 2]);
        // Relayed first segments, then whole sequences, then second segments in the first
        // segments' order.
        let plan = PrefillPlan::new(
            &spans(&[100, 5000, 64, 9000]),
            0,
            132,
            Split::Relay(10),
            None,
        );
        assert_eq!(plan.relayed, 2);
        let firsts = [0, 2, 81, 82];
        let expected: Vec<[i32; 5]> = vec![
            [1, firsts[1], 10, 0, 2],
            [3, firsts[3], 10, 0, 2],
            [0, firsts[0], 2, 0, 1],
            [2, firsts[2], 1, 0, 1],
            [1, firsts[1] + 10, 69, 1, 2],
            [3, firsts[3] + 10, 131, 1, 2],
        ];
        let got: Vec<[i32; 5]> = records(&plan)
            .iter()
            .map(|r| [r[0], r[1], r[2], r[3], r[4]])
            .collect();
        assert_eq!(got, expected);
        // Every chunk of every sequence is walked by exactly one segment.
        let mut walked = vec![0; plan.chunks()];
        for r in records(&plan) {
            for c in r[1]..r[1] + r[2] {
                walked[c as usize] += 1;
            }
        }
        assert!(walked.iter().all(|&w| w == 1));
        // A sequence no longer than the lead is walked whole; without a share Auto scans.
        let plan = PrefillPlan::new(&spans(&[640]), 0, 132, Split::Relay(10), None);
        assert_eq!((plan.relayed, plan.segment_count()), (0, 1));
        let plan = PrefillPlan::new(&spans(&[16384]), 64, 132, Split::Auto, None);
        assert_eq!((plan.relayed, plan.segmented), (0, true));
    }

    #[test]
    fn short_prompts_are_walked_whole_where_the_relay_would_run() {
        let share = Some(RelayRule::share(RELAY_LEAD_SHARE));
        // 8 and 15 chunks at Qwen3-Next's heads: one segment each, no scan either.
        for tokens in [512, RELAY_MIN_CHUNKS * CHUNK] {
            let plan = PrefillPlan::new(&spans(&[tokens]), 64, 132, Split::Auto, share);
            assert_eq!(
                (plan.relayed, plan.segmented, plan.segment_count()),
                (0, false, 1)
            );
        }
        // One chunk more: relayed.
        let tokens = (RELAY_MIN_CHUNKS + 1) * CHUNK;
        let plan = PrefillPlan::new(&spans(&[tokens]), 64, 132, Split::Auto, share);
        assert_eq!(plan.relayed, 1);
        // A short and a long sequence in one call: only the long one is relayed.
        let plan = PrefillPlan::new(&spans(&[512, 8192]), 64, 132, Split::Auto, share);
        assert_eq!((plan.relayed, plan.segment_count()), (1, 3));
        // A rule with a lower threshold relays the 8-chunk prompt too.
        let rule = RelayRule {
            min_chunks: 4,
            ..RelayRule::share(RELAY_LEAD_SHARE)
        };
        let plan = PrefillPlan::new(&spans(&[512]), 64, 132, Split::Auto, Some(rule));
        assert_eq!((plan.relayed, plan.segment_count()), (1, 2));
    }
}

//! The chunk table of a chunked prefill: its chunks of `CHUNK` tokens per sequence, and the
//! state pass's walk units (whole sequences, or segments of long ones), as the kernels read
//! them from one buffer (`chunks.wgsl`, `chunks_state.wgsl`).

use super::chunks::CHUNK;
use deltakv_contract::gdn::prefill::validate::SeqSpan;

/// Fields of a walk unit's record (`UNIT_FIELDS` in `chunks_state.wgsl`).
pub(super) const UNIT_FIELDS: usize = 6;

/// The chunk table of a call ([`chunk_table`]).
#[derive(Debug)]
pub(super) struct ChunkTable {
    /// `(first token, length)` per chunk of each sequence, then the walk units (`UNIT_FIELDS`
    /// each: first chunk, end chunk, sequence, index among the sequence's units, their count,
    /// slot in the segment states), then each sequence's first unit (`N + 1` entries).
    pub words: Vec<u32>,
    pub chunks: usize,
    pub units: usize,
    /// Units of split sequences (each has a slot in the segment states); 0: none is split.
    pub slots: usize,
}

/// A whole sequence's slot field (never read: such a unit keeps its state in `state`).
const NO_SLOT: usize = u32::MAX as usize;

/// Plans the chunks and walk units of `seqs`: a sequence of more than `segment_chunks` chunks
/// becomes the fewest segments of at most that many, their lengths within one of each other;
/// any other, one unit.
pub(super) fn chunk_table(seqs: &[SeqSpan], segment_chunks: Option<usize>) -> ChunkTable {
    let mut words: Vec<u32> = Vec::new();
    let mut spans = Vec::with_capacity(seqs.len());
    for s in seqs {
        let first = words.len() / 2;
        for t in (0..s.len).step_by(CHUNK) {
            words.push((s.start + t) as u32);
            words.push(CHUNK.min(s.len - t) as u32);
        }
        spans.push((first, words.len() / 2 - first));
    }
    let chunks = words.len() / 2;
    let mut firsts = vec![0u32];
    let (mut units, mut slots) = (0, 0);
    for (seq, &(first, count)) in spans.iter().enumerate() {
        let segments = match segment_chunks {
            Some(most) if count > most => count.div_ceil(most.max(1)),
            _ => 1,
        };
        // Segment i holds chunks [i count / segments, (i + 1) count / segments): at least one
        // each, since segments <= count.
        for index in 0..segments {
            let start = first + index * count / segments;
            let end = first + (index + 1) * count / segments;
            let slot = if segments > 1 { slots + index } else { NO_SLOT };
            let record: [usize; UNIT_FIELDS] = [start, end, seq, index, segments, slot];
            words.extend(record.map(|x| x as u32));
        }
        units += segments;
        if segments > 1 {
            slots += segments;
        }
        firsts.push(units as u32);
    }
    words.extend_from_slice(&firsts);
    ChunkTable {
        words,
        chunks,
        units,
        slots,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(start: usize, len: usize) -> SeqSpan {
        SeqSpan { start, len }
    }

    #[test]
    fn long_sequences_split_into_near_equal_segments() {
        // 10 chunks and 1 chunk (a length-1 sequence), segments of at most 3 chunks: 2, 3, 2, 3
        // (within one of each other), slots 0..4; the short sequence whole.
        let seqs = [span(0, 300), span(300, 1)];
        let table = chunk_table(&seqs, Some(3));
        assert_eq!((table.chunks, table.units, table.slots), (11, 5, 4));
        let words = &table.words;
        assert_eq!(&words[..4], &[0, 32, 32, 32]);
        assert_eq!(&words[18..22], &[288, 12, 300, 1]);
        let records: Vec<&[u32]> = words[22..22 + 5 * UNIT_FIELDS]
            .chunks(UNIT_FIELDS)
            .collect();
        let whole = NO_SLOT as u32;
        assert_eq!(
            records,
            [
                &[0, 2, 0, 0, 4, 0][..],
                &[2, 5, 0, 1, 4, 1],
                &[5, 7, 0, 2, 4, 2],
                &[7, 10, 0, 3, 4, 3],
                &[10, 11, 1, 0, 1, whole],
            ]
        );
        assert_eq!(&words[22 + 5 * UNIT_FIELDS..], &[0, 4, 5]);
        // Without segments (or segments longer than the sequences): one unit per sequence.
        for most in [None, Some(10)] {
            let table = chunk_table(&seqs, most);
            assert_eq!((table.units, table.slots), (2, 0));
            assert_eq!(
                &table.words[22..34],
                &[0, 10, 0, 0, 1, whole, 10, 11, 1, 0, 1, whole]
            );
        }
    }
}

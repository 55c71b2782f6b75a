//! State checkpoints of the CUDA prefill (the contract's layout,
//! `deltakv_contract::gdn::prefill::checkpoint`). Checkpoints are a positive multiple of 64
//! tokens apart and chunks are 64 tokens from each sequence's start, so every checkpoint falls
//! on the end of a chunk: the state pass stores the state it holds in registers after each
//! chunk that the table `chunk_checkpoint` (i32 `[chunks]`, the checkpoint row or -1) names.
//! With segments (the two-level scan) each segment starts from its combined entry state, so
//! its chunks' states are the sequence's states and the same table serves.

use super::plan::CHUNK;
use crate::runtime::Cuda;
use crate::tensor::CudaTensor;
use deltakv_contract::gdn::prefill::checkpoint::{CheckpointPlan, PrefillCheckpoints};
use deltakv_contract::gdn::prefill::validate::SeqSpan;
use deltakv_contract::{HostTensor, Result};

/// Checkpoints on the GPU.
#[derive(Debug)]
pub struct CudaCheckpoints {
    /// `[C, H, K, V]` f32.
    pub states: CudaTensor,
    /// Where each sequence's checkpoints are (`offsets`) and their spacing.
    pub plan: CheckpointPlan,
}

impl CudaCheckpoints {
    /// The states copied to the host, with their offsets.
    pub fn download(&self, cuda: &Cuda) -> Result<PrefillCheckpoints> {
        let states = if self.plan.total() == 0 {
            HostTensor::from_f32(self.states.shape().to_vec(), Vec::new())?
        } else {
            self.states.download(cuda)?
        };
        Ok(PrefillCheckpoints {
            states,
            offsets: self.plan.offsets_tensor()?,
            every: self.plan.every,
        })
    }
}

/// For each chunk of the call (sequence by sequence, as `PrefillPlan` lists them), the row of
/// the checkpoint taken at its end, or -1 (the contract's table read as `i32`).
pub(crate) fn chunk_checkpoints(seqs: &[SeqSpan], plan: &CheckpointPlan) -> Result<Vec<i32>> {
    Ok(plan
        .chunk_table(seqs, CHUNK)?
        .into_iter()
        .map(|row| row as i32)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::super::plan::{PrefillPlan, Split};
    use super::*;

    #[test]
    fn the_table_marks_the_chunks_that_end_on_a_checkpoint() {
        let lens = [1, 130, 192, 64, 383];
        let mut start = 0;
        let seqs: Vec<SeqSpan> = lens
            .iter()
            .map(|&len| {
                let s = SeqSpan { start, len };
                start += len;
                s
            })
            .collect();
        let plan = CheckpointPlan::new(128, &seqs).unwrap();
        let table = chunk_checkpoints(&seqs, &plan).unwrap();
        let chunks = PrefillPlan::new(&seqs, 8, 132, Split::Scan(3), None);
        assert_eq!(table.len(), chunks.chunks());
        // Chunks: [1] | [64, 64, 2] | [64, 64, 64] | [64] | [64 x 5, 63].
        assert_eq!(
            table,
            vec![-1, -1, 0, -1, -1, 1, -1, -1, -1, 2, -1, 3, -1, -1]
        );
        // Each marked chunk ends at its checkpoint's position in its sequence.
        for (chunk, &row) in table.iter().enumerate() {
            if row < 0 {
                continue;
            }
            let n = (0..seqs.len())
                .find(|&n| plan.offsets[n + 1] > row as usize)
                .unwrap();
            let end = chunks.chunk_first_row[chunk] as usize + chunks.chunk_len[chunk] as usize;
            assert_eq!(plan.row_at(n, end - seqs[n].start), Some(row as usize));
        }
    }
}

//! Which kernels a prefill call runs and what they need: the kernel names for the padded K
//! and V, the prepare kernel's form and grouping of value heads, the state pass, and the shared
//! memory of each (mirroring the kernels' carve-ups). The `DELTAKV_PREFILL_*` variables that
//! pick among them for experiments are read in `switches.rs`.

use super::plan::{CHUNK, PAD, TILE};
use cudarc::driver::DeviceRepr;

/// Mirrors `struct PrefillParams` in the kernel, field for field.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct PrefillParams {
    pub(super) q: u64,
    pub(super) k: u64,
    pub(super) v: u64,
    pub(super) g: u64,
    pub(super) beta: u64,
    pub(super) o: u64,
    pub(super) w: u64,
    pub(super) u: u64,
    pub(super) chunk_first_row: u64,
    pub(super) chunk_len: u64,
    pub(super) segments: u64,
    pub(super) seq_first_segment: u64,
    pub(super) initial_state: u64,
    pub(super) final_state: u64,
    pub(super) state_rows: u64,
    pub(super) segment_states: u64,
    pub(super) transition_d: u64,
    pub(super) transition_m: u64,
    pub(super) gates: u64,
    pub(super) scores: u64,
    pub(super) checkpoints: u64,
    pub(super) chunk_checkpoint: u64,
    pub(super) q_src: u64,
    pub(super) k_src: u64,
    pub(super) q_chunks: u64,
    pub(super) k_chunks: u64,
    pub(super) t_cm: u64,
    pub(super) k_cm: u64,
    pub(super) q_cm: u64,
    pub(super) key_heads: i32,
    pub(super) value_heads: i32,
    pub(super) key_dim: i32,
    pub(super) value_dim: i32,
    pub(super) key_pad: i32,
    pub(super) value_pad: i32,
    pub(super) out_dtype: i32,
    pub(super) beta_dtype: i32,
    pub(super) use_segment_states: i32,
    pub(super) heads_per_block: i32,
    pub(super) head_groups: i32,
    pub(super) fused_qk_norm: i32,
    pub(super) scale: f32,
    pub(super) reset_gate: f32,
}

// SAFETY: plain-old-data with the C layout of the kernel's parameter struct.
unsafe impl DeviceRepr for PrefillParams {}

/// The grid of a state-walking kernel (state, overlapped, lead, transition) over `records`
/// segment records (at most `MAX_WALK_SEGMENTS`): (tile, head, record), so the column tiles of
/// one (segment, head), which read the same chunk inputs, are adjacent in launch order.
pub(super) fn walk_grid(records: u32, heads: u32, tiles: u32) -> (u32, u32, u32) {
    (tiles, heads, records)
}

/// Threads of a prepare block (the kernel's `PF_PREPARE_THREADS`: 8 warps).
pub(super) const PREPARE_THREADS: u32 = 256;

/// Most segment records one state walk takes (the grid's third dimension).
pub(super) const MAX_WALK_SEGMENTS: usize = 65535;

/// Shared memory of the prepare kernel (mirrors the carve-up in `prepare_impl`): one gates
/// record per value head of the block's group, k and v (bf16), then A, 816 floats and T (f32,
/// rows of 68). q takes the space after A until T is formed (at K = 256, where no scores are
/// formed, A's space, for the l2 norm alone); T's bf16 halves for W reuse A's space and the
/// 816 floats, those for U the space after them, into T's rows. At K = V = 128: 76,736 bytes
/// for two heads (3 blocks per SM), and room for 2 at any K and V with four.
pub(super) fn prepare_smem(kp: usize, vp: usize, heads_per_block: usize) -> usize {
    let ldc = CHUNK + PAD;
    // f32 elements per row of A and T (the kernels' PF_LDF).
    let ldf = CHUNK + 4;
    debug_assert!(2 * 2 * CHUNK * ldc <= 4 * (CHUNK * ldf + 3 * 16 * 17));
    debug_assert!(4 * 2 * CHUNK * ldc <= 4 * (2 * CHUNK * ldf + 3 * 16 * 17));
    debug_assert!(2 * CHUNK * (kp + PAD) <= 4 * (CHUNK * ldf + 3 * 16 * 17) || kp == 256);
    heads_per_block * gates_bytes()
        + 2 * (CHUNK * (kp + PAD) + CHUNK * (vp + PAD))
        + 4 * (2 * CHUNK * ldf + 3 * 16 * 17)
}

/// Shared memory of the register walks' prepare (K = 128; mirrors `prepare_impl` with
/// REGISTER_WALKS): one gates record per value head of the block's group, then k's rows (bf16,
/// rows of 136), whose space A takes once K K^T is formed, and T (f32, rows of 68), whose space
/// holds q's rows until then; no v, W or U. The pair form (at most two heads) holds the second
/// head's A after T. 38,656 bytes for two heads (56,064 in the pair form): 4 blocks per SM, as
/// the kernel's 64 registers allow.
pub(super) fn prepare_regs_smem(heads_per_block: usize, pair: bool) -> usize {
    let ldf = CHUNK + 4;
    debug_assert_eq!(2 * CHUNK * (128 + PAD), 4 * CHUNK * ldf);
    let matrices = if pair { 3 } else { 2 };
    heads_per_block * gates_bytes() + matrices * 4 * CHUNK * ldf
}

/// Most value heads one prepare block takes (the kernel's `PF_MAX_GROUP`).
pub(super) const MAX_PREPARE_GROUP: usize = 4;

/// How the prepare kernel splits the `ratio` value heads of each key head: blocks per key head
/// and value heads per block (near-equal groups of at most `limit`, itself at most
/// `MAX_PREPARE_GROUP`, none empty).
pub(super) fn prepare_groups(ratio: usize, limit: usize) -> (usize, usize) {
    let ratio = ratio.max(1);
    let limit = limit.clamp(1, MAX_PREPARE_GROUP);
    let per_block = ratio.div_ceil(ratio.div_ceil(limit));
    (ratio.div_ceil(per_block), per_block)
}

/// Shared memory of the state kernels (mirrors `StateStage` and `state_impl`): one or two
/// stages of inputs (the chunk's gates, q, k with padded rows, W, the U tile), then the state
/// and three chunk-sized operands, then an mbarrier per stage.
fn state_smem(kp: usize) -> usize {
    let (ldk, ldc) = (kp + PAD, CHUNK + PAD);
    let stage = gates_bytes() + 2 * (2 * CHUNK * ldk + CHUNK * kp + CHUNK * TILE);
    let stages = if kp == 256 { 1 } else { 2 };
    stages * stage + 2 * (kp * ldc + 3 * CHUNK * ldc) + 8 * stages
}

/// Shared memory of the overlapped state pass (mirrors `OverlapStage` and `overlap_impl`): two
/// stages (the chunk's gates, q, k with padded rows, W, the U tile, the scores), then S, V',
/// diag(e) V' and five mbarriers.
fn overlap_smem(kp: usize) -> usize {
    let (ldk, ldc) = (kp + PAD, CHUNK + PAD);
    let stage = gates_bytes() + 2 * (2 * CHUNK * ldk + CHUNK * kp + CHUNK * TILE + CHUNK * CHUNK);
    2 * stage + 2 * (kp * ldc + 2 * CHUNK * ldc) + 5 * 8
}

/// Which kernel walks the chunks and writes the outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum StatePass {
    /// `gdn_prefill_overlap_*`: the outputs on their own warps, a chunk behind the state
    /// (K <= 128).
    Overlap,
    /// `gdn_prefill_state_*`: every warp walks every product in turn (any K; the only one for
    /// K = 256, whose two groups would not fit a block's registers).
    Lockstep,
    /// `gdn_prefill_outputs_regs_k128`: one warpgroup with the state in registers, reading k,
    /// q, T diag(beta) and the scores in the core-matrix layout and V's rows (sm_90a, K = 128),
    /// with `gdn_prefill_lead_regs_k128` as the relay's lead, `gdn_prefill_transition_regs_k128`
    /// as the scan's transition and the prepare that forms neither W nor U
    /// (`gdn_prefill_prepare_regs_*`).
    Registers,
}

/// The register walks where they exist (K = 128 on sm_90a), else the overlapped pass
/// (K <= 128), else the lockstep pass;
/// `DELTAKV_PREFILL_STATE=overlap` (where K <= 128) or `lockstep` asks for one of the others
/// (every pass stores checkpoints from its registers), `auto` or `registers` for the default.
pub(super) fn state_pass_kind(asked: Option<StatePass>, kp: usize, arch: &str) -> StatePass {
    let registers = kp == 128 && arch == "sm_90a";
    match asked {
        Some(StatePass::Lockstep) => StatePass::Lockstep,
        Some(StatePass::Overlap) if kp <= 128 => StatePass::Overlap,
        _ if registers => StatePass::Registers,
        _ if kp <= 128 => StatePass::Overlap,
        _ => StatePass::Lockstep,
    }
}

/// Shared memory of the register outputs walk with `stages` stages (mirrors `RegsStage<KP,
/// true>` and `regs_walk`): the lead's stages with q's chunk rows and the scores added, then
/// two chunks' O staged in a 2-byte dtype (`PF_O_STAGE_HALFS`), then two mbarrier words.
fn outputs_regs_smem(kp: usize, stages: usize) -> usize {
    let stage =
        gates_bytes() + 2 * (2 * (kp / 8 * CM_BLOCK) + 3 * 8 * CM_BLOCK + CHUNK * (TILE + PAD));
    let o_stage = 2 * CHUNK * (TILE + PAD);
    stages * stage + 2 * o_stage + 2 * 8
}

/// How many stages the register outputs walk keeps (`DELTAKV_PREFILL_OUTPUT_STAGES`): `auto`
/// (unset) one where its blocks fill more than one wave at one block per SM and no relay runs
/// beside it, else two; `1` or `2` forces it (where the register walks run).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OutputStages {
    Auto,
    One,
    Two,
}

/// The register outputs walk with one stage where `stages` asks for it: `blocks` outputs-walk
/// blocks on `multiprocessors` SMs, `relayed` when the relay runs a lead beside it. Other passes
/// keep `outputs`.
pub(super) fn outputs_walk(
    pass: StatePass,
    outputs: WalkKernel,
    stages: OutputStages,
    blocks: usize,
    multiprocessors: usize,
    relayed: bool,
) -> WalkKernel {
    let one = match stages {
        OutputStages::One => true,
        OutputStages::Two => false,
        OutputStages::Auto => !relayed && blocks > multiprocessors,
    };
    if pass == StatePass::Registers && one {
        WalkKernel {
            name: "gdn_prefill_outputs1_regs_k128",
            smem: outputs_regs_smem(128, 1),
            threads: 128,
        }
    } else {
        outputs
    }
}

fn overlap_name(kp: usize) -> &'static str {
    if kp == 64 {
        "gdn_prefill_overlap_k64"
    } else {
        "gdn_prefill_overlap_k128"
    }
}

/// `ChunkGates` rounded up to 128 bytes: seven `[64]` arrays of 4 bytes and two scalars.
pub(super) fn gates_bytes() -> usize {
    (7 * CHUNK * 4 + 8).next_multiple_of(128)
}

/// Elements of one 8-column block of the core-matrix layout (the kernels' `PF_CM_BLOCK`).
pub(super) const CM_BLOCK: usize = CHUNK * 8 + 8;

/// Shared memory of the register lead and transition (mirrors `RegsStage<KP, false>` and
/// `regs_walk`): two stages of the gates, k ([64][KP] core-matrix), T diag(beta)'s halves
/// ([64][64] core-matrix each) and V's tile rows ([64][TILE + PAD]), then an mbarrier per
/// stage.
fn lead_regs_smem(kp: usize) -> usize {
    let stage = gates_bytes() + 2 * (kp / 8 * CM_BLOCK + 2 * 8 * CM_BLOCK + CHUNK * (TILE + PAD));
    2 * stage + 2 * 8
}

fn lead_name(kp: usize) -> &'static str {
    match kp {
        64 => "gdn_prefill_lead_k64",
        128 => "gdn_prefill_lead_k128",
        _ => "gdn_prefill_lead_k256",
    }
}

fn prepare_name(kp: usize, vp: usize) -> &'static str {
    match (kp, vp) {
        (64, 64) => "gdn_prefill_prepare_mma_k64_v64",
        (64, 128) => "gdn_prefill_prepare_mma_k64_v128",
        (64, _) => "gdn_prefill_prepare_mma_k64_v256",
        (128, 64) => "gdn_prefill_prepare_mma_k128_v64",
        (128, 128) => "gdn_prefill_prepare_mma_k128_v128",
        (128, _) => "gdn_prefill_prepare_mma_k128_v256",
        (_, 64) => "gdn_prefill_prepare_mma_k256_v64",
        (_, 128) => "gdn_prefill_prepare_mma_k256_v128",
        (_, _) => "gdn_prefill_prepare_mma_k256_v256",
    }
}

/// The prepare for the register walks (K = 128): `gdn_prefill_prepare_regs_k128_v*`, or with
/// `pair` (at most two value heads per block) `gdn_prefill_prepare_regs_pair_k128_v*`.
fn prepare_regs_name(vp: usize, pair: bool) -> &'static str {
    match (vp, pair) {
        (64, false) => "gdn_prefill_prepare_regs_k128_v64",
        (128, false) => "gdn_prefill_prepare_regs_k128_v128",
        (_, false) => "gdn_prefill_prepare_regs_k128_v256",
        (64, true) => "gdn_prefill_prepare_regs_pair_k128_v64",
        (128, true) => "gdn_prefill_prepare_regs_pair_k128_v128",
        (_, true) => "gdn_prefill_prepare_regs_pair_k128_v256",
    }
}

/// A prepare kernel: its name and shared memory per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct PrepareKernel {
    pub name: &'static str,
    pub smem: usize,
}

fn state_names(kp: usize) -> (&'static str, &'static str, &'static str) {
    match kp {
        64 => (
            "gdn_prefill_state_k64",
            "gdn_prefill_transition_k64",
            "gdn_prefill_combine_k64",
        ),
        128 => (
            "gdn_prefill_state_k128",
            "gdn_prefill_transition_k128",
            "gdn_prefill_combine_k128",
        ),
        _ => (
            "gdn_prefill_state_k256",
            "gdn_prefill_transition_k256",
            "gdn_prefill_combine_k256",
        ),
    }
}

/// A walk kernel: its name, shared memory and threads per block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct WalkKernel {
    pub name: &'static str,
    pub smem: usize,
    pub threads: u32,
}

/// The kernels a state pass runs at (KP, VP): the prepare, the walk that writes the outputs,
/// the relay's lead, the scan's transition and its combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct PassKernels {
    pub prepare: PrepareKernel,
    pub outputs: WalkKernel,
    pub lead: WalkKernel,
    pub transition: WalkKernel,
    pub combine: &'static str,
}

/// The kernels of `pass` at (KP, VP) with `heads_per_block` value heads per prepare block;
/// `pair` lets the register walks' prepare take its pair form where a block has at most two
/// heads.
pub(super) fn pass_kernels(
    pass: StatePass,
    kp: usize,
    vp: usize,
    heads_per_block: usize,
    pair: bool,
) -> PassKernels {
    let (state, transition, combine) = state_names(kp);
    let lockstep = |name| WalkKernel {
        name,
        smem: state_smem(kp),
        threads: 2 * kp as u32,
    };
    let register_walk = |name, smem| WalkKernel {
        name,
        smem,
        threads: 128,
    };
    match pass {
        StatePass::Registers => PassKernels {
            prepare: {
                let pair = pair && heads_per_block <= 2;
                PrepareKernel {
                    name: prepare_regs_name(vp, pair),
                    smem: prepare_regs_smem(heads_per_block, pair),
                }
            },
            outputs: register_walk("gdn_prefill_outputs_regs_k128", outputs_regs_smem(kp, 2)),
            lead: register_walk("gdn_prefill_lead_regs_k128", lead_regs_smem(kp)),
            transition: register_walk("gdn_prefill_transition_regs_k128", lead_regs_smem(kp)),
            combine,
        },
        StatePass::Overlap | StatePass::Lockstep => PassKernels {
            prepare: PrepareKernel {
                name: prepare_name(kp, vp),
                smem: prepare_smem(kp, vp, heads_per_block),
            },
            outputs: if pass == StatePass::Overlap {
                WalkKernel {
                    name: overlap_name(kp),
                    smem: overlap_smem(kp),
                    threads: 4 * kp as u32,
                }
            } else {
                lockstep(state)
            },
            lead: lockstep(lead_name(kp)),
            transition: lockstep(transition),
            combine,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepare_groups_cover_every_value_head_without_empty_blocks() {
        for limit in 1..=MAX_PREPARE_GROUP {
            for ratio in 1..=40 {
                let (groups, per_block) = prepare_groups(ratio, limit);
                assert!(
                    (1..=limit).contains(&per_block),
                    "r = {ratio}, limit {limit}"
                );
                assert!(groups * per_block >= ratio && (groups - 1) * per_block < ratio);
            }
        }
        let default = MAX_PREPARE_GROUP;
        assert_eq!(prepare_groups(1, default), (1, 1));
        assert_eq!(prepare_groups(2, default), (1, 2));
        assert_eq!(prepare_groups(4, default), (1, 4));
        assert_eq!(prepare_groups(6, default), (2, 3));
        assert_eq!(prepare_groups(8, default), (2, 4));
        assert_eq!(prepare_groups(2, 1), (2, 1));
        assert_eq!(prepare_groups(8, 3), (3, 3));
    }

    #[test]
    fn each_pass_names_its_kernels() {
        let registers = pass_kernels(StatePass::Registers, 128, 128, 2, true);
        assert_eq!(
            registers.prepare,
            PrepareKernel {
                name: "gdn_prefill_prepare_regs_pair_k128_v128",
                smem: prepare_regs_smem(2, true)
            }
        );
        let per_head = pass_kernels(StatePass::Registers, 128, 64, 4, true).prepare;
        assert_eq!(per_head.name, "gdn_prefill_prepare_regs_k128_v64");
        assert_eq!(per_head.smem, prepare_regs_smem(4, false));
        let unpaired = pass_kernels(StatePass::Registers, 128, 128, 2, false).prepare;
        assert_eq!(unpaired.name, "gdn_prefill_prepare_regs_k128_v128");
        assert_eq!(
            registers.outputs,
            WalkKernel {
                name: "gdn_prefill_outputs_regs_k128",
                smem: outputs_regs_smem(128, 2),
                threads: 128
            }
        );
        assert_eq!(registers.lead.name, "gdn_prefill_lead_regs_k128");
        assert_eq!(
            registers.transition.name,
            "gdn_prefill_transition_regs_k128"
        );
        assert_eq!(registers.transition.smem, lead_regs_smem(128));
        assert_eq!(registers.combine, "gdn_prefill_combine_k128");
        let overlap = pass_kernels(StatePass::Overlap, 64, 256, 2, true);
        assert_eq!(overlap.prepare.name, "gdn_prefill_prepare_mma_k64_v256");
        assert_eq!(overlap.prepare.smem, prepare_smem(64, 256, 2));
        assert_eq!(
            overlap.outputs,
            WalkKernel {
                name: "gdn_prefill_overlap_k64",
                smem: overlap_smem(64),
                threads: 256
            }
        );
        assert_eq!(
            overlap.lead,
            WalkKernel {
                name: "gdn_prefill_lead_k64",
                smem: state_smem(64),
                threads: 128
            }
        );
        let lockstep = pass_kernels(StatePass::Lockstep, 256, 64, 1, true);
        assert_eq!(lockstep.outputs.name, "gdn_prefill_state_k256");
        assert_eq!(lockstep.transition.name, "gdn_prefill_transition_k256");
        assert_eq!(lockstep.transition.threads, 512);
        assert_eq!(lockstep.combine, "gdn_prefill_combine_k256");
    }

    #[test]
    fn register_walks_fit_the_sm() {
        // Two stages each (RegsStage without and with the outputs): gates, k (and q), T's
        // halves (and the scores) in the core-matrix layout, V's rows of 72; the outputs walk's
        // two staged chunks of O (64 rows of 72); an mbarrier per stage.
        assert_eq!(
            lead_regs_smem(128),
            2 * (1920 + 2 * (8320 + 8320 + 4608)) + 16
        );
        assert_eq!(
            outputs_regs_smem(128, 2),
            2 * (1920 + 2 * (16_640 + 12_480 + 4608)) + 2 * 2 * 4608 + 16
        );
        assert!(outputs_regs_smem(128, 2) <= 227 * 1024);
        // One stage: two blocks per SM (H100: 228 KB per SM, 1 KB reserved per block).
        assert_eq!(233_472 / (outputs_regs_smem(128, 1) + 1024), 2);
    }

    #[test]
    fn the_one_stage_outputs_walk_runs_past_one_wave_without_the_relay() {
        let registers = pass_kernels(StatePass::Registers, 128, 128, 2, true);
        let pick = |stages, blocks, relayed| {
            outputs_walk(
                StatePass::Registers,
                registers.outputs,
                stages,
                blocks,
                132,
                relayed,
            )
            .name
        };
        let (one, two) = (
            "gdn_prefill_outputs1_regs_k128",
            "gdn_prefill_outputs_regs_k128",
        );
        // (stages asked for, outputs-walk blocks, relayed) and the walk chosen on 132 SMs.
        for (stages, blocks, relayed, expected) in [
            (OutputStages::Auto, 512, false, one),
            (OutputStages::Auto, 128, false, two),
            (OutputStages::Auto, 512, true, two),
            (OutputStages::Two, 512, false, two),
            (OutputStages::One, 64, true, one),
        ] {
            assert_eq!(
                pick(stages, blocks, relayed),
                expected,
                "{stages:?} {blocks} {relayed}"
            );
        }
        let overlap = pass_kernels(StatePass::Overlap, 128, 128, 2, true);
        let kept = outputs_walk(
            StatePass::Overlap,
            overlap.outputs,
            OutputStages::One,
            512,
            132,
            false,
        );
        assert_eq!(kept, overlap.outputs);
    }

    #[test]
    fn prepare_blocks_fit_the_sm_at_k128() {
        // H100: 228 KB of shared memory per SM, 1 KB reserved per block.
        let per_sm = |bytes: usize| 233_472 / (bytes + 1024);
        assert!(per_sm(prepare_smem(128, 128, MAX_PREPARE_GROUP)) >= 2);
        assert!(per_sm(prepare_smem(256, 256, MAX_PREPARE_GROUP)) >= 2);
        // Qwen3-Next (two value heads per key head): 3 blocks per SM, as the registers.
        assert_eq!(per_sm(prepare_smem(128, 128, 2)), 3);
        assert_eq!(prepare_smem(128, 128, 2), 76_736);
        // The register walks' prepare: 4 blocks per SM at any group (64 registers).
        assert_eq!(prepare_regs_smem(2, false), 38_656);
        assert!(per_sm(prepare_regs_smem(MAX_PREPARE_GROUP, false)) >= 4);
        assert_eq!(prepare_regs_smem(2, true), 56_064);
        assert_eq!(per_sm(prepare_regs_smem(2, true)), 4);
    }
}

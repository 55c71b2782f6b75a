// GDN chunked prefill: timing trials of a relay lead on one warpgroup with the state in
// registers (`DELTAKV_CUDA_DEFINES=PF_LEAD_TRIAL=n`, sm_90a, K = 128; wrong results on purpose,
// never a default: without the define this file compiles to nothing). The trial kernel takes
// the name `gdn_prefill_lead_k128` and the lockstep lead's launch (256 threads, its shared
// memory): warps 4-7 leave at once. The state is S^T (the tile's 64 value columns as rows, the
// 128 keys as columns) in the accumulators of two m64n64 wgmma, and per chunk
//
//   PF_LEAD_TRIAL 1:  X^T = S^T W^T;  P = (U^T - X^T) diag(e);  S^T <- g S^T + P K
//   PF_LEAD_TRIAL 2:  X^T = S^T K^T;  Y = U^T - X^T diag(d);  V'^T = Y M;
//                     P = V'^T diag(e);  S^T <- g S^T + P K
//
// (2 is FlashInfer's form, V' = T diag(beta) (V - diag(exp G) K S), with U's tile standing in
// for V and the product M for T diag(beta)^T), every A operand from registers and every B from
// core-matrix buffers that nothing fills: the chain without the copies that row 38's register
// lead spent its time on (kernel log, rows 38-40).
//
// PF_LEAD_TRIAL 3: the lead of 2, and the outputs walk in the same form on one warpgroup under
// the name `gdn_prefill_state_k128` (run with DELTAKV_PREFILL_STATE=lockstep: the lockstep
// pass's launch, 256 threads and its shared memory; warps 4-7 leave at once): O^T = S^T Q^T
// beside X^T, then diag(d) on O^T's columns, Y M, and O^T += V'^T C beside the update, C
// standing in for the scores' transpose; O^T stored to o by its columns (tokens).

#ifndef PF_LEAD_TRIAL
#define PF_LEAD_TRIAL 0
#endif

#if PF_LEAD_TRIAL != 0 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The chain's pieces come from gdn_prefill_lead_regs.cu (compiled before this file).

// Both trial walks: the lead (OUTPUTS false; trials 1 and 2, 3's lead is 2's) and the outputs
// walk of trial 3. Two stages of the lockstep pass's layout; the core-matrix buffers w_cm and
// k_cm stand in for every B operand.
template <int KP, bool OUTPUTS>
__device__ void trial_walk(const PrefillParams& p) {
    static_assert(KP == 128, "two m64n64 halves of S^T");
    constexpr int CM_ELEMS = (KP / 8) * PF_CM_BLOCK;
    constexpr bool W_FORM = !OUTPUTS && PF_LEAD_TRIAL == 1;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    unsigned char* stage_base = smem_raw;
    unsigned short* w_cm = (unsigned short*)(stage_base + 2 * StateStage<KP>::BYTES);  // [64][KP]
    unsigned short* k_cm = w_cm + CM_ELEMS;                                           // [64][KP]
    unsigned long long* full = (unsigned long long*)(k_cm + CM_ELEMS);                // per stage
    if (threadIdx.x >= 128) return;

    const int tile = blockIdx.x, head = blockIdx.y, segment = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int* seg = (const int*)p.segments + SEG_FIELDS * segment;
    const int seq = seg[SEG_SEQ], first_chunk = seg[SEG_FIRST_CHUNK], chunks = seg[SEG_CHUNKS];
    const int key_head = head / (p.value_heads / p.key_heads);
    const int col0 = tile * PF_TILE;
    const long long state_row = p.state_rows ? ((const long long*)p.state_rows)[seq] : (long long)seq;
    const SegmentRows rows(p, first_chunk, chunks);
    auto stage_of = [&](int ci) { return StateStage<KP>(stage_base + (ci & 1) * StateStage<KP>::BYTES); };
    // Chunk ci's inputs: gates, k, W and the U tile by thread 0's bulk copies, and for the
    // outputs q's rows by the warpgroup's asynchronous copies.
    auto issue = [&](int ci) {
        issue_stage<KP, MODE_LEAD>(stage_of(ci), p, first_chunk + ci, 0, 0, head, key_head, col0, false,
                                   &full[ci & 1]);
        if (OUTPUTS) {
            const long long key_row = (rows.row(ci) * p.key_heads + key_head) * KP;
            copy_rows_async_team<KP, 128>(stage_of(ci).q, KP + PF_PAD, (const unsigned short*)p.q + key_row,
                                          (long long)p.key_heads * KP, rows.len(ci));
            cp_async_commit();
        }
    };

    float state[2][8][4];
    regs_entry_state<KP>(state, p, segment, state_row, head, col0, warp, lane);
    if (threadIdx.x == 0) {
        for (int s = 0; s < 2; ++s) bulk_barrier_init(&full[s]);
    }
    asm volatile("bar.sync 1, 128;" ::: "memory");
    if (chunks > 0) issue(0);
    for (int ci = 0; ci < chunks; ++ci) {
        const StateStage<KP> stage = stage_of(ci);
        if (OUTPUTS) cp_async_wait_all();
        bulk_wait(&full[ci & 1], (ci >> 1) & 1);
        asm volatile("bar.sync 1, 128;" ::: "memory");
        if (ci + 1 < chunks) issue(ci + 1);
        const ChunkGates& gates = *stage.gates;
        // X^T = S^T W^T (trial 1) or S^T K^T, and for the outputs O^T = S^T Q^T, one group.
        float x[8][4], o[8][4];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            x[j][0] = x[j][1] = x[j][2] = x[j][3] = 0.0f;
            o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
        }
        unsigned a[8][4];
#pragma unroll
        for (int s = 0; s < 8; ++s) lead_a_from(a[s], state[s >> 2], s & 3);
        wg_fence(x);
        wg_fence(o);
        wg_fence(a);
        wgmma_fence();
        regs_issue_keys(x, a, W_FORM ? w_cm : k_cm);
        if (OUTPUTS) regs_issue_keys(o, a, w_cm);
        wgmma_commit();
        unsigned vt[4][4];
        regs_v_fragments(vt, stage.u, warp, lane);
        wgmma_wait_all();
        wg_fence(x);
        wg_fence(o);
        wg_fence(a);
        if (!W_FORM) {
            // V'^T = (V^T - X^T diag(d)) M into x.
            unsigned y[4][4];
            regs_fragments<true>(y, vt, x, gates.start_decay, -1.0f, lane);
            regs_times_m(x, y, w_cm);
        }
        if (OUTPUTS) {
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const int i = 8 * j + 2 * (lane & 3);
#pragma unroll
                for (int e = 0; e < 4; ++e) o[j][e] *= gates.start_decay[i + (e & 1)];
            }
        }
        // P = (U^T - X^T) diag(e) (trial 1) or V'^T diag(e); V'^T itself for the outputs.
        unsigned pa[4][4], va[4][4];
        if (W_FORM) {
            regs_fragments<true>(pa, vt, x, gates.end_decay, -1.0f, lane);
        } else {
            regs_fragments<false>(pa, vt, x, gates.end_decay, 1.0f, lane);
        }
        if (OUTPUTS) {
#pragma unroll
            for (int j = 0; j < 8; ++j) {
#pragma unroll
                for (int h = 0; h < 2; ++h) va[j >> 1][2 * (j & 1) + h] = pack_bf16(x[j][2 * h], x[j][2 * h + 1]);
            }
        }
        regs_decay(state, gates.state_decay);
        wg_fence(state[0]);
        wg_fence(state[1]);
        wg_fence(o);
        wg_fence(pa);
        wg_fence(va);
        wgmma_fence();
        regs_issue_update(state, pa, k_cm);
        if (OUTPUTS) {
#pragma unroll
            for (int s = 0; s < 4; ++s) lead_wgmma<0>(o, va[s], lead_desc<true>(w_cm, 0, 16 * s));
        }
        wgmma_commit();
        wgmma_wait_all();
        wg_fence(state[0]);
        wg_fence(state[1]);
        wg_fence(o);
        wg_fence(pa);
        wg_fence(va);
        if (OUTPUTS) {
            // O^T by its columns (the chunk's tokens) into o, bf16.
            const long long first_row = rows.row(ci);
            const int len = rows.len(ci);
#pragma unroll
            for (int j = 0; j < 8; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = 8 * j + 2 * (lane & 3) + (e & 1);
                    const int c = col0 + lead_value_col(warp, lane, e);
                    if (i < len && c < p.value_dim) {
                        ((unsigned short*)p.o)[((first_row + i) * p.value_heads + head) * (long long)p.value_dim + c] =
                            (unsigned short)(pack_bf16(o[j][e] * p.scale, 0.0f) & 0xffffu);
                    }
                }
            }
        }
    }
    if (!OUTPUTS) regs_hand_over<KP>(state, p, segment, head, col0, warp, lane);
}

extern "C" __global__ void __launch_bounds__(256, 1) gdn_prefill_lead_k128(PrefillParams p) {
    wait_for_prepare();
    trial_walk<128, false>(p);
}

#if PF_LEAD_TRIAL == 3
extern "C" __global__ void __launch_bounds__(256, 1) gdn_prefill_state_k128(PrefillParams p) {
    wait_for_prepare();
    trial_walk<128, true>(p);
}
#endif

#endif  // PF_LEAD_TRIAL && __CUDA_ARCH_FEAT_SM90_ALL

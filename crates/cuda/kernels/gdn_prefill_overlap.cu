// ---------------------------------------------------------------------------------------
// The state pass with its outputs on their own warps (K <= 128). The block holds two groups
// of KP / 16 warps:
//   the state group keeps S in registers and walks the recurrence: S as bf16 into shared
//     memory, V' = U - W S (and its end-decayed copy), S <- exp(G_last) S + K^T diag(e) V';
//     it also queues the next chunk's inputs;
//   the output group computes O = scale (diag(d) Q S + (Q K^T o D) V') from the S and V' the
//     state group publishes, a chunk behind it, with the scores Q K^T o D the prepare kernel
//     computed beside A.
// So the products that do not feed the next state (Q S, scores V') leave the sequential chain,
// and the scores leave the pass. Every product runs on wgmma (gdn_prefill_wgmma.cu), each
// warpgroup of a group forming all 64 chunk rows of its columns (the update: its 64 rows of
// S); S, V' and diag(e) V' are the B operands, in wgmma's layout. The groups meet through mbarriers:
//   full[s]     stage s holds its chunk's inputs (thread 0's bulk copies complete)
//   s_ready     S of chunk c is in shared memory               (state group arrives)
//   v_ready     V' of chunk c is in shared memory              (state group arrives)
//   done        the output group is done with S, V' and the stage of chunk c
// Each completes one phase per chunk (full[s] one per two) and no group can run two phases
// ahead of the other's wait, so waiting on the phase parity is exact. Shared memory: two
// stages (gates, q, k, W, the U tile, the scores), S, V', diag(e) V', the barriers.

#define OV_FULL 0
#define OV_S_READY 2
#define OV_V_READY 3
#define OV_DONE 4
#define OV_BARRIERS 5

// One stage of a chunk's inputs in shared memory: q and k rows padded for bank spread, W, the
// U tile and the scores in the prepare's `swizzled` layout (PF_W_ELEMS). Only the base is
// kept: each part's address is formed where it is used, which keeps registers free in
// a kernel at its 128-register bound.
template <int KP>
struct OverlapStage {
    static constexpr int LDK = KP + PF_PAD;
    // q, k; w; u, scores
    static constexpr int HALFS = 2 * PF_CHUNK * LDK + PF_W_ELEMS(KP) + PF_U_TILE_ELEMS + PF_SCORES_ELEMS;
    static constexpr int BYTES = PF_GATES_BYTES + 2 * HALFS;
    unsigned char* base;
    __device__ OverlapStage(unsigned char* at) : base(at) {}
    __device__ ChunkGates* gates() const { return (ChunkGates*)base; }
    __device__ unsigned short* q() const { return (unsigned short*)(base + PF_GATES_BYTES); }
    __device__ unsigned short* k() const { return q() + PF_CHUNK * LDK; }
    __device__ unsigned short* w() const { return q() + 2 * PF_CHUNK * LDK; }
    __device__ unsigned short* u() const { return w() + PF_W_ELEMS(KP); }
    __device__ unsigned short* scores() const { return u() + PF_U_TILE_ELEMS; }
};

// A barrier among the state group's `THREADS` threads (barrier 1; 0 is the block's).
template <int THREADS>
__device__ __forceinline__ void ov_state_sync() {
    asm volatile("bar.sync 1, %0;" ::"n"(THREADS) : "memory");
}

// Queues chunk `chunk`'s inputs into `stage` by six bulk copies (the caller: the state
// group's thread 0), whose one arrival on `full` expects their bytes: the gates record, q and k (the prepare's chunk
// copies, p.q_chunks and p.k_chunks), W, the U tile and the scores (each contiguous in the
// prepare's layout, PF_W_ELEMS).
template <int KP>
__device__ __forceinline__ void ov_issue_stage(const OverlapStage<KP>& stage, const PrefillParams& p,
                                               int chunk, int head, int key_head, int col0,
                                               unsigned long long* full) {
    constexpr int LDK = KP + PF_PAD;
    const long long chunk_head = (long long)chunk * p.value_heads + head;
    const long long chunk_key = key_chunk_offset<KP>(p, chunk, key_head);
    // Both groups' reads of the stage's last chunk (ordered before by the done barrier) come
    // before the copies' writes.
    fence_proxy_async();
    bulk_expect(full, PF_GATES_BYTES +
                          2u * (2 * PF_CHUNK * LDK + PF_W_ELEMS(KP) + PF_U_TILE_ELEMS + PF_SCORES_ELEMS));
    bulk_load(stage.gates(), (const unsigned char*)p.gates + chunk_head * PF_GATES_BYTES, PF_GATES_BYTES,
              full);
    bulk_load(stage.q(), (const unsigned short*)p.q_chunks + chunk_key, 2u * PF_CHUNK * LDK, full);
    bulk_load(stage.k(), (const unsigned short*)p.k_chunks + chunk_key, 2u * PF_CHUNK * LDK, full);
    bulk_load(stage.w(), (const unsigned short*)p.w + chunk_head * PF_W_ELEMS(KP), 2u * PF_W_ELEMS(KP),
              full);
    bulk_load(stage.u(),
              (const unsigned short*)p.u + u_tile_offset(chunk_head, p.value_pad / PF_TILE, col0 / PF_TILE),
              2u * PF_U_TILE_ELEMS, full);
    bulk_load(stage.scores(), (const unsigned short*)p.scores + chunk_head * PF_SCORES_ELEMS,
              2u * PF_SCORES_ELEMS, full);
}

template <int KP>
__device__ void overlap_impl(const PrefillParams& p) {
    constexpr int WARPS = KP / 16;  // per group
    constexpr int GROUP = 32 * WARPS;
    constexpr int NT = 32 / WARPS;  // n8 tiles per warp in the 64 x 64 products
    constexpr int LDK = KP + PF_PAD;
    constexpr int BATCH = wg_batch(KP / 16);
    extern __shared__ __align__(128) unsigned char smem_raw[];
    unsigned char* stage_base = smem_raw;
    // S, V' and diag(e) V' in wgmma's B layout, each in the space of a [rows][LDC] array.
    unsigned short* state_s = (unsigned short*)(stage_base + 2 * OverlapStage<KP>::BYTES);  // KP x 64
    unsigned short* new_values = state_s + KP * PF_LDC;               // 64 x 64
    unsigned short* decayed_values = new_values + PF_CHUNK * PF_LDC;  // 64 x 64
    unsigned long long* bars = (unsigned long long*)(decayed_values + PF_CHUNK * PF_LDC);

    // Grid (tile, head, segment), as in state_impl (the tiles of a head share inputs in L2).
    const int tile = blockIdx.x, head = blockIdx.y, segment = blockIdx.z;
    const bool state_group = threadIdx.x < GROUP;
    const int thread = threadIdx.x % GROUP;
    const int warp = thread >> 5, lane = threadIdx.x & 31;
    const int* seg = (const int*)p.segments + SEG_FIELDS * segment;
    const int seq = seg[SEG_SEQ], first_chunk = seg[SEG_FIRST_CHUNK], chunks = seg[SEG_CHUNKS];
    const int key_head = head / (p.value_heads / p.key_heads);
    const int col0 = tile * PF_TILE;
    const int row_tile = 16 * (warp & 3);
    const int n_first = (warp >> 2) * NT;
    const SegmentRows rows(p, first_chunk, chunks);

    if (threadIdx.x == 0) {
        bulk_barrier_init(&bars[OV_FULL]);
        bulk_barrier_init(&bars[OV_FULL + 1]);
        for (int b = OV_S_READY; b < OV_BARRIERS; ++b) bulk_barrier_init(&bars[b], GROUP);
    }
    __syncthreads();

    if (state_group) {
        const long long state_row =
            p.state_rows ? ((const long long*)p.state_rows)[seq] : (long long)seq;
        float state[8][4];
        load_entry_state<KP>(state, p, segment, state_row, head, col0, warp, lane);
        if (chunks > 0 && thread == 0) {
            ov_issue_stage<KP>(OverlapStage<KP>(stage_base), p, first_chunk, head, key_head, col0,
                               &bars[OV_FULL]);
        }
        for (int ci = 0; ci < chunks; ++ci) {
            const int s = ci & 1;
            const OverlapStage<KP> stage(stage_base + s * OverlapStage<KP>::BYTES);
            bulk_wait(&bars[OV_FULL + s], (ci >> 1) & 1);
            if (ci > 0) bulk_wait(&bars[OV_DONE], (ci - 1) & 1);

            // S as bf16 for both groups (wgmma's B layout).
            store_state_b<KP>(state, state_s, warp, lane);
            // Every state warp has written S and is done with the previous chunk's stage and
            // diag(e) V'.
            ov_state_sync<GROUP>();
            mbarrier_arrive(&bars[OV_S_READY]);
            // The next chunk's copies into the other stage (both groups are done with it: the
            // done barrier above).
            if (ci + 1 < chunks && thread == 0) {
                ov_issue_stage<KP>(OverlapStage<KP>(stage_base + (s ^ 1) * OverlapStage<KP>::BYTES), p,
                                   first_chunk + ci + 1, head, key_head, col0, &bars[OV_FULL + (s ^ 1)]);
            }

            // V' = U - W S and diag(e) V' (each warpgroup all 64 rows of its NT n8 tiles).
            const ChunkGates& gates = *stage.gates();
            float x[NT][4];
#pragma unroll
            for (int n = 0; n < NT; ++n) x[n][0] = x[n][1] = x[n][2] = x[n][3] = 0.0f;
            wg_product<NT, KP / 16, BATCH, KP>(
                x, [&](unsigned (&a)[4], int step) { frag_a_ldsm_swizzled(a, stage.w(), KP, row_tile, 16 * step, lane); },
                state_s, 8 * n_first);
            {
                unsigned fresh[NT][2], decayed[NT][2];
#pragma unroll
                for (int n = 0; n < NT; ++n) {
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        int r = row_tile + (lane >> 2) + 8 * h;
                        int c = 8 * (n_first + n) + 2 * (lane & 3);
                        unsigned bits = *(const unsigned*)(stage.u() + swizzled(r, c, PF_TILE));
                        float v0 = bf16_to_f32((unsigned short)(bits & 0xffffu)) - x[n][2 * h];
                        float v1 = bf16_to_f32((unsigned short)(bits >> 16)) - x[n][2 * h + 1];
                        fresh[n][h] = pack_bf16(v0, v1);
                        float e = gates.end_decay[r];
                        decayed[n][h] = pack_bf16(v0 * e, v1 * e);
                    }
                }
                store_b_fragments<PF_CHUNK, NT>(fresh, new_values, n_first, row_tile / 8, lane);
                store_b_fragments<PF_CHUNK, NT>(decayed, decayed_values, n_first, row_tile / 8, lane);
                fence_proxy_async();
            }
            ov_state_sync<GROUP>();
            mbarrier_arrive(&bars[OV_V_READY]);

            // S <- exp(G_last) S + K^T diag(e) V' (each warpgroup its 64 rows of S).
            const float decay = gates.state_decay;
#pragma unroll
            for (int n = 0; n < 8; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) state[n][e] *= decay;
            }
            wg_product<8, PF_CHUNK / 16, PF_CHUNK / 16, PF_CHUNK>(
                state,
                [&](unsigned (&a)[4], int step) { frag_a_transposed(a, stage.k(), LDK, 16 * warp, 16 * step, lane); },
                decayed_values, 0);
            // A checkpoint after this chunk (checkpoints fall on chunk ends, see the host's
            // table): the state group's registers, as the final state is stored.
            if (p.checkpoints) {
                const int checkpoint = ((const int*)p.chunk_checkpoint)[first_chunk + ci];
                if (checkpoint >= 0) {
                    store_state_block(state, (float*)p.checkpoints, checkpoint, head, col0, warp, lane, p);
                }
            }
        }
        if (p.final_state && segment_is_last(p, segment)) {
            store_state_block(state, (float*)p.final_state, state_row, head, col0, warp, lane, p);
        }
        return;
    }

    // The output group.
    for (int ci = 0; ci < chunks; ++ci) {
        const int s = ci & 1;
        const OverlapStage<KP> stage(stage_base + s * OverlapStage<KP>::BYTES);
        const long long first_row = rows.row(ci);
        const int len = rows.len(ci);
        bulk_wait(&bars[OV_FULL + s], (ci >> 1) & 1);
        const ChunkGates& gates = *stage.gates();

        // diag(d) Q S once S is published, then + scores V' once V' is.
        float out[NT][4];
#pragma unroll
        for (int n = 0; n < NT; ++n) out[n][0] = out[n][1] = out[n][2] = out[n][3] = 0.0f;
        bulk_wait(&bars[OV_S_READY], ci & 1);
        wg_product<NT, KP / 16, BATCH, KP>(
            out, [&](unsigned (&a)[4], int step) { frag_a_ldsm(a, stage.q(), LDK, row_tile, 16 * step, lane); },
            state_s, 8 * n_first);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float d = gates.start_decay[row_tile + (lane >> 2) + 8 * h];
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                out[n][2 * h] *= d;
                out[n][2 * h + 1] *= d;
            }
        }
        bulk_wait(&bars[OV_V_READY], ci & 1);
        wg_product<NT, PF_CHUNK / 16, PF_CHUNK / 16, PF_CHUNK>(
            out, [&](unsigned (&a)[4], int step) { frag_a_ldsm_swizzled(a, stage.scores(), PF_CHUNK, row_tile, 16 * step, lane); },
            new_values, 8 * n_first);
        mbarrier_arrive(&bars[OV_DONE]);
        store_output_rows<NT>(out, p, first_row, len, head, col0, row_tile, n_first, lane);
    }
}

#define PF_OVERLAP_ENTRY_POINT(KP)                                                            \
    extern "C" __global__ void __launch_bounds__(KP * 4, 1)                                  \
        gdn_prefill_overlap_k##KP(PrefillParams p) {                                          \
        wait_for_prepare();                                                                   \
        overlap_impl<KP>(p);                                                                  \
    }

PF_OVERLAP_ENTRY_POINT(64)
PF_OVERLAP_ENTRY_POINT(128)

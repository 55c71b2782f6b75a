// ---------------------------------------------------------------------------------------
// The state pass. Block = KP / 16 warps (KP / 64 warpgroups); warp w owns state rows
// 16w..16w+15 over the block's 64 columns (8 n8 tiles, 32 f32 per thread). The products run
// on wgmma (gdn_prefill_wgmma.cu): over the chunk (64 x 64 outputs: X = W S, O) warpgroup g
// forms all 64 rows of columns 8 g NT.. (NT = 32 / warps n8 tiles), the update each
// warpgroup's 64 rows of S; the scores Q K^T stay on mma.sync (4 row tiles x NT per warp).
//
// The inputs of chunk c + 1 (q, k, W, the U tile, g) land in shared memory while chunk c
// computes (two stages; one for KP = 256, where two do not fit): q and k rows by asynchronous
// copies, W, U and g by bulk copies (the copy engine) completing on the stage's mbarrier. Shared memory: per stage the chunk's gates (computed by the
// prepare kernel), q, k, W [64][KP + PAD], U [64][64 + PAD] (bf16 row-major, the A operands
// read into registers, with ldmatrix .trans where transposed); then the state S, V' and
// diag(e) V' in wgmma's B layout (in spaces of [KP][64 + PAD] and [64][64 + PAD] bf16), the
// scores [64][64 + PAD] and one mbarrier per stage. The host mirrors this in `state_smem`.

// The rows of a segment's chunks: consecutive 64-row chunks of one sequence (the last maybe
// shorter), so each chunk's first row and length follow from the segment's two ends, read
// once, instead of a dependent load per chunk on the sequential path.
struct SegmentRows {
    long long first_row, end_row;
    __device__ SegmentRows(const PrefillParams& p, int first_chunk, int chunks) {
        const int last = first_chunk + (chunks > 0 ? chunks - 1 : 0);
        first_row = ((const long long*)p.chunk_first_row)[first_chunk];
        end_row = ((const long long*)p.chunk_first_row)[last] + ((const int*)p.chunk_len)[last];
    }
    __device__ long long row(int index) const { return first_row + (long long)PF_CHUNK * index; }
    __device__ int len(int index) const {
        const long long left = end_row - row(index);
        return left < PF_CHUNK ? (int)left : PF_CHUNK;
    }
};

// Whether `segment` ends its sequence, read from the table where needed rather than held in a
// register through the walk.
__device__ __forceinline__ bool segment_is_last(const PrefillParams& p, int segment) {
    const int* seg = (const int*)p.segments + SEG_FIELDS * segment;
    return seg[SEG_INDEX] == seg[SEG_COUNT] - 1;
}

// Where a block's entry state comes from and where its end state goes.
#define MODE_OUTPUT 0      // outputs and (last segment) the final state
#define MODE_TRANSITION 1  // no outputs; D (zero entry, U) or M (identity entry, no U)
#define MODE_LEAD 2        // no outputs; the entry state walked to the segment's end state,
                           // stored as the next segment's entry (the relay)

template <int KP>
struct StateStage {
    static constexpr int LDK = KP + PF_PAD;
    static constexpr int HALFS = 2 * PF_CHUNK * LDK + PF_W_ELEMS(KP) + PF_U_TILE_ELEMS;  // q, k, w, u
    static constexpr int BYTES = PF_GATES_BYTES + 2 * HALFS;
    ChunkGates* gates;
    unsigned short* q;
    unsigned short* k;
    unsigned short* w;
    unsigned short* u;
    __device__ StateStage(unsigned char* base) {
        gates = (ChunkGates*)base;
        q = (unsigned short*)(base + PF_GATES_BYTES);
        k = q + PF_CHUNK * LDK;
        w = k + PF_CHUNK * LDK;
        u = w + PF_W_ELEMS(KP);
    }
};

// Queues chunk `chunk`'s inputs into `stage`: q rows (outputs only) by the block's
// asynchronous copies (a team, `copy_rows_async_team`; the caller waits for its group), the
// gates record, k (the prepare's chunk copy, p.k_chunks), W and the U tile (each contiguous in
// the prepare's layout, PF_W_ELEMS) by four bulk copies from thread 0 completing on `full`. The
// block must be done with the stage.
template <int KP, int MODE>
__device__ __forceinline__ void issue_stage(const StateStage<KP>& stage, const PrefillParams& p,
                                            int chunk, long long first_row, int len, int head,
                                            int key_head, int col0, bool m_cols,
                                            unsigned long long* full) {
    constexpr int LDK = KP + PF_PAD;
    constexpr int THREADS = 2 * KP;  // the block
    const long long chunk_head = (long long)chunk * p.value_heads + head;
    if (threadIdx.x == 0) {
        const unsigned u_bytes = m_cols ? 0u : 2u * PF_U_TILE_ELEMS;
        // The block's reads of the stage's last chunk (ordered before by a barrier) come
        // before the copies' writes.
        fence_proxy_async();
        bulk_expect(full, PF_GATES_BYTES + 2u * (PF_CHUNK * LDK + PF_W_ELEMS(KP)) + u_bytes);
        bulk_load(stage.gates, (const unsigned char*)p.gates + chunk_head * PF_GATES_BYTES,
                  PF_GATES_BYTES, full);
        bulk_load(stage.k,
                  (const unsigned short*)p.k_chunks + key_chunk_offset<KP>(p, chunk, key_head),
                  2u * PF_CHUNK * LDK, full);
        bulk_load(stage.w, (const unsigned short*)p.w + chunk_head * PF_W_ELEMS(KP),
                  2u * PF_W_ELEMS(KP), full);
        if (!m_cols) {
            bulk_load(stage.u,
                      (const unsigned short*)p.u + u_tile_offset(chunk_head, p.value_pad / PF_TILE, col0 / PF_TILE),
                      u_bytes, full);
        }
    }
    if (MODE == MODE_OUTPUT) {
        const long long key_row = (first_row * p.key_heads + key_head) * KP;
        copy_rows_async_team<KP, THREADS>(stage.q, LDK, (const unsigned short*)p.q + key_row,
                                          (long long)p.key_heads * KP, len);
        cp_async_commit();
    }
}

// A block's state lives in registers as the accumulators of m16n8 tiles: warp w holds rows
// 16 w + lane / 4 (+ 8 for e >= 2) of it, and n8 tile n columns col0 + 8 n + 2 (lane % 4)
// (+ 1 for odd e).
__device__ __forceinline__ int state_row_of(int warp, int lane, int e) {
    return 16 * warp + (lane >> 2) + 8 * (e >> 1);
}
__device__ __forceinline__ int state_col_of(int col0, int n, int lane, int e) {
    return col0 + 8 * n + 2 * (lane & 3) + (e & 1);
}

// A warp's 16 state rows (from its register tiles) as bf16 into state_s, the B operand (K = KP
// rows, 64 columns; `wg_desc_b`'s layout) of the next chunk's products, made visible to them.
template <int KP>
__device__ __forceinline__ void store_state_b(const float (&state)[8][4], unsigned short* state_s,
                                              int warp, int lane) {
    unsigned pairs[8][2];
#pragma unroll
    for (int n = 0; n < 8; ++n) {
        pairs[n][0] = pack_bf16(state[n][0], state[n][1]);
        pairs[n][1] = pack_bf16(state[n][2], state[n][3]);
    }
    store_b_fragments<KP, 8>(pairs, state_s, 0, 2 * warp, lane);
    fence_proxy_async();
}

// A segment's entry state into the registers: the combined state of the two-level scan when
// the call is segmented, else the sequence's initial state (`state_row` of it), else zero.
template <int KP>
__device__ __forceinline__ void load_entry_state(float (&state)[8][4], const PrefillParams& p,
                                                 int segment, long long state_row, int head,
                                                 int col0, int warp, int lane) {
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = state_row_of(warp, lane, e), c = state_col_of(col0, n, lane, e);
            state[n][e] = entry_state_element<KP>(p, segment, state_row, head, r, c);
        }
    }
}

// Stores a block's register state (its rows < K and columns col0.. < V) as row `state_row` of
// a [*, H, K, V] f32 tensor (the final states, checkpoints).
__device__ __forceinline__ void store_state_block(const float (&state)[8][4], float* dst,
                                                  long long state_row, int head, int col0,
                                                  int warp, int lane, const PrefillParams& p) {
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = state_row_of(warp, lane, e), c = state_col_of(col0, n, lane, e);
            if (r < p.key_dim && c < p.value_dim) {
                dst[((state_row * p.value_heads + head) * p.key_dim + r) * p.value_dim + c] = state[n][e];
            }
        }
    }
}

// Writes a warp's 16 output rows (row_tile.., those < len of the chunk that starts at token
// row `first_row`) over its NT n8 tiles from n_first, scaled, in o's dtype (bf16 pairs as one
// word where aligned).
template <int NT>
__device__ __forceinline__ void store_output_rows(const float (&out)[NT][4], const PrefillParams& p,
                                                  long long first_row, int len, int head, int col0,
                                                  int row_tile, int n_first, int lane) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int i = row_tile + (lane >> 2) + 8 * h;
        if (i >= len) continue;
        const long long row = ((first_row + i) * p.value_heads + head) * (long long)p.value_dim;
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            const int c = col0 + 8 * (n_first + n) + 2 * (lane & 3);
            const float o0 = out[n][2 * h] * p.scale, o1 = out[n][2 * h + 1] * p.scale;
            if (p.out_dtype == DT_BF16 && c + 1 < p.value_dim && ((row + c) & 1) == 0) {
                *(unsigned*)((unsigned short*)p.o + row + c) = pack_bf16(o0, o1);
            } else {
                if (c < p.value_dim) store_float((void*)p.o, row + c, p.out_dtype, o0);
                if (c + 1 < p.value_dim) store_float((void*)p.o, row + c + 1, p.out_dtype, o1);
            }
        }
    }
}


template <int KP, int MODE>
__device__ void state_impl(const PrefillParams& p) {
    constexpr int WARPS = KP / 16;
    constexpr int NT = 32 / WARPS;  // n8 tiles per warp in the 64 x 64 products
    constexpr int LDK = KP + PF_PAD;
    constexpr int STAGES = KP == 256 ? 1 : 2;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    unsigned char* stage_base = smem_raw;
    // S, V' and diag(e) V' in wgmma's B layout, each in the space of a [rows][LDC] array.
    unsigned short* state_s = (unsigned short*)(stage_base + STAGES * StateStage<KP>::BYTES);  // KP x 64
    unsigned short* new_values = state_s + KP * PF_LDC;                 // 64 x 64
    unsigned short* decayed_values = new_values + PF_CHUNK * PF_LDC;    // 64 x 64
    unsigned short* scores = decayed_values + PF_CHUNK * PF_LDC;        // [64][LDC]
    unsigned long long* full = (unsigned long long*)(scores + PF_CHUNK * PF_LDC);  // per stage

    // Grid (tile, head, segment): the column tiles of one (segment, head), which read the same
    // chunk inputs, are adjacent in launch order, so they run together and share them in L2.
    const int tile = blockIdx.x, head = blockIdx.y, segment = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int* seg = (const int*)p.segments + SEG_FIELDS * segment;
    const int seq = seg[SEG_SEQ], first_chunk = seg[SEG_FIRST_CHUNK], chunks = seg[SEG_CHUNKS];
    const int key_head = head / (p.value_heads / p.key_heads);
    const int tiles_v = p.value_pad / PF_TILE;
    if (MODE == MODE_TRANSITION && segment_is_last(p, segment)) return;  // nothing needs it
    // Columns of this block: value columns, or (transition mode, tile >= tiles_v) columns of
    // the K x K map M.
    const bool m_cols = MODE == MODE_TRANSITION && tile >= tiles_v;
    const int col0 = (m_cols ? tile - tiles_v : tile) * PF_TILE;
    const long long state_row =
        p.state_rows ? ((const long long*)p.state_rows)[seq] : (long long)seq;

    // Entry state into registers: the identity map's columns or zeros (transition mode), else
    // the segment's entry state.
    float state[8][4];
    if (MODE == MODE_TRANSITION) {
#pragma unroll
        for (int n = 0; n < 8; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = state_row_of(warp, lane, e), c = state_col_of(col0, n, lane, e);
                state[n][e] = (m_cols && r == c) ? 1.0f : 0.0f;
            }
        }
    } else {
        load_entry_state<KP>(state, p, segment, state_row, head, col0, warp, lane);
    }

    const int row_tile = 16 * (warp & 3);
    const int n_first = (warp >> 2) * NT;
    const SegmentRows rows(p, first_chunk, chunks);
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) bulk_barrier_init(&full[s]);
    }
    __syncthreads();
    if (STAGES == 2 && chunks > 0) {
        issue_stage<KP, MODE>(StateStage<KP>(stage_base), p, first_chunk, rows.row(0), rows.len(0),
                              head, key_head, col0, m_cols, &full[0]);
    }
    store_state_b<KP>(state, state_s, warp, lane);
    for (int ci = 0; ci < chunks; ++ci) {
        const int chunk = first_chunk + ci;
        const int slot = STAGES == 2 ? (ci & 1) : 0;
        const StateStage<KP> stage(stage_base + slot * StateStage<KP>::BYTES);
        if (STAGES == 1) {
            // One stage: every warp must be done with the previous chunk's inputs first.
            __syncthreads();
            issue_stage<KP, MODE>(stage, p, chunk, rows.row(ci), rows.len(ci), head, key_head, col0,
                                  m_cols, &full[0]);
        }
        cp_async_wait_all();
        bulk_wait(&full[slot], (STAGES == 2 ? ci >> 1 : ci) & 1);
        // Every warp is done with the last chunk (so the other stage is free), its copies have
        // landed, and its rows of S are in state_s.
        __syncthreads();
        if (STAGES == 2 && ci + 1 < chunks) {
            issue_stage<KP, MODE>(StateStage<KP>(stage_base + (slot ^ 1) * StateStage<KP>::BYTES), p,
                                  chunk + 1, rows.row(ci + 1), rows.len(ci + 1), head, key_head,
                                  col0, m_cols, &full[slot ^ 1]);
        }
        const long long first_row = rows.row(ci);
        const int len = rows.len(ci);

        // The state as bf16 is in state_s: each warp wrote its rows after the last chunk's
        // update (or before the loop), and the barrier above published them to every
        // warpgroup's wgmma.
        const ChunkGates& gates = *stage.gates;

        // Stage 2: V' = U - W S (and its end-decayed copy), the scores, O = diag(d) Q S.
        // Each warpgroup forms all 64 rows of its NT n8 tiles of columns (wgmma, B = S).
        constexpr int KSTEPS = KP / 16;
        constexpr int BATCH = wg_batch(KSTEPS);
        float out[NT][4];
        {
            float x[NT][4];
#pragma unroll
            for (int n = 0; n < NT; ++n) x[n][0] = x[n][1] = x[n][2] = x[n][3] = 0.0f;
            wg_product<NT, KSTEPS, BATCH, KP>(
                x, [&](unsigned (&a)[4], int step) { frag_a_ldsm_swizzled(a, stage.w, KP, row_tile, 16 * step, lane); },
                state_s, 8 * n_first);
            unsigned fresh[NT][2], decayed[NT][2];
#pragma unroll
            for (int n = 0; n < NT; ++n) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    int r = row_tile + (lane >> 2) + 8 * h;
                    int c = 8 * (n_first + n) + 2 * (lane & 3);
                    float u0 = 0.0f, u1 = 0.0f;
                    if (!m_cols) {
                        unsigned bits = *(const unsigned*)(stage.u + swizzled(r, c, PF_TILE));
                        u0 = bf16_to_f32((unsigned short)(bits & 0xffffu));
                        u1 = bf16_to_f32((unsigned short)(bits >> 16));
                    }
                    float v0 = u0 - x[n][2 * h], v1 = u1 - x[n][2 * h + 1];
                    fresh[n][h] = pack_bf16(v0, v1);
                    float e = gates.end_decay[r];
                    decayed[n][h] = pack_bf16(v0 * e, v1 * e);
                }
            }
            // V' and diag(e) V' as B operands (K = the chunk's 64 rows).
            if (MODE == MODE_OUTPUT) store_b_fragments<PF_CHUNK, NT>(fresh, new_values, n_first, row_tile / 8, lane);
            store_b_fragments<PF_CHUNK, NT>(decayed, decayed_values, n_first, row_tile / 8, lane);
            fence_proxy_async();
        }
        if (MODE == MODE_OUTPUT) {
            // The scores Q K^T o D (mma.sync: K is not in wgmma's B layout), stored before O's
            // product so their registers are free for it.
            {
                float sc[NT][4];
#pragma unroll
                for (int n = 0; n < NT; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll 4
                for (int k0 = 0; k0 < KP; k0 += 16) {
                    unsigned a[4];
                    frag_a(a, stage.q, LDK, row_tile, k0, lane);
#pragma unroll
                    for (int n = 0; n < NT; ++n) {
                        unsigned b[2];
                        frag_b(b, stage.k, LDK, k0, 8 * (n_first + n), lane);
                        mma_bf16_16816(sc[n], a, b);
                    }
                }
                const FragmentDecays<NT> decay(gates, row_tile, 8 * n_first, lane);
#pragma unroll
                for (int n = 0; n < NT; ++n) {
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        int i = row_tile + (lane >> 2) + 8 * h;
                        int j = 8 * (n_first + n) + 2 * (lane & 3);
                        *(unsigned*)(scores + i * PF_LDC + j) =
                            pack_bf16(sc[n][2 * h] * decay.at(h, n, i, j), sc[n][2 * h + 1] * decay.at(h, n, i, j + 1));
                    }
                }
            }
#pragma unroll
            for (int n = 0; n < NT; ++n) out[n][0] = out[n][1] = out[n][2] = out[n][3] = 0.0f;
            wg_product<NT, KSTEPS, BATCH, KP>(
                out, [&](unsigned (&a)[4], int step) { frag_a(a, stage.q, LDK, row_tile, 16 * step, lane); },
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
        }
        __syncthreads();

        // Stage 3: O += scores V' (then stored), S <- exp(G_last) S + K^T diag(e) V' (each
        // warpgroup its 64 rows of S, wgmma, B = diag(e) V').
        if (MODE == MODE_OUTPUT) {
            wg_product<NT, PF_CHUNK / 16, PF_CHUNK / 16, PF_CHUNK>(
                out, [&](unsigned (&a)[4], int step) { frag_a(a, scores, PF_LDC, row_tile, 16 * step, lane); },
                new_values, 8 * n_first);
            store_output_rows<NT>(out, p, first_row, len, head, col0, row_tile, n_first, lane);
        }
        {
            const float decay = gates.state_decay;
#pragma unroll
            for (int n = 0; n < 8; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) state[n][e] *= decay;
            }
            wg_product<8, PF_CHUNK / 16, PF_CHUNK / 16, PF_CHUNK>(
                state,
                [&](unsigned (&a)[4], int step) { frag_a_transposed(a, stage.k, LDK, 16 * warp, 16 * step, lane); },
                decayed_values, 0);
        }
        // The next chunk's entry state as bf16: state_s is only read before the barrier that
        // precedes the update, so every warp may write its rows now; the barrier at the top of
        // the next chunk publishes them.
        store_state_b<KP>(state, state_s, warp, lane);
        // A checkpoint after this chunk (checkpoints fall on chunk ends, see the host's table).
        if (MODE == MODE_OUTPUT && p.checkpoints) {
            const int checkpoint = ((const int*)p.chunk_checkpoint)[chunk];
            if (checkpoint >= 0) store_state_block(state, (float*)p.checkpoints, checkpoint, head, col0, warp, lane, p);
        }
    }

    // End state: the segment's map (transition mode), or the sequence's final state.
    if (MODE == MODE_TRANSITION) {
#pragma unroll
        for (int n = 0; n < 8; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = state_row_of(warp, lane, e), c = state_col_of(col0, n, lane, e);
                if (m_cols) {
                    ((float*)p.transition_m)
                        [(((long long)segment * p.value_heads + head) * KP + r) * KP + c] = state[n][e];
                } else {
                    ((float*)p.transition_d)
                        [segment_state_index<KP>(p, segment, head, r, c)] = state[n][e];
                }
            }
        }
    } else if (MODE == MODE_LEAD) {
        // Every row and column of the tile (the padding is zero), where the segment that
        // follows reads its entry state (`load_entry_state`, the same index).
#pragma unroll
        for (int n = 0; n < 8; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = state_row_of(warp, lane, e), c = state_col_of(col0, n, lane, e);
                ((float*)p.segment_states)
                    [segment_state_index<KP>(p, segment, head, r, c)] = state[n][e];
            }
        }
    } else if (p.final_state && segment_is_last(p, segment)) {
        store_state_block(state, (float*)p.final_state, state_row, head, col0, warp, lane, p);
    }
}

#define PF_STATE_ENTRY_POINTS(KP)                                                             \
    extern "C" __global__ void __launch_bounds__(KP * 2, 1)                                  \
        gdn_prefill_state_k##KP(PrefillParams p) {                                            \
        wait_for_prepare();                                                                   \
        state_impl<KP, MODE_OUTPUT>(p);                                                       \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(KP * 2, 1)                                  \
        gdn_prefill_transition_k##KP(PrefillParams p) {                                       \
        wait_for_prepare();                                                                   \
        state_impl<KP, MODE_TRANSITION>(p);                                                   \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(KP * 2, 1)                                  \
        gdn_prefill_lead_k##KP(PrefillParams p) {                                             \
        wait_for_prepare();                                                                   \
        state_impl<KP, MODE_LEAD>(p);                                                         \
    }

PF_STATE_ENTRY_POINTS(64)
PF_STATE_ENTRY_POINTS(128)
PF_STATE_ENTRY_POINTS(256)

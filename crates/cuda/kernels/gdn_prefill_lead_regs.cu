// GDN chunked prefill, the relay's lead walk (and the scan's transition, the same walk) on one
// warpgroup with the state in registers (sm_90a, K = 128; `gdn_prefill_lead_regs_k128`,
// `gdn_prefill_transition_regs_k128`), in the form that needs neither W nor U:
//
//   V' = T diag(beta) (V - diag(d) K S),   S <- exp(G_last) S + K^T diag(e) V'
//
// (the same V' as U - W S: W = T diag(beta d) K, U = T diag(beta) V), computed transposed so
// the state never leaves the registers: the warpgroup holds S^T (the tile's 64 value columns as
// rows, the 128 keys as columns) as the accumulators of two m64n64 wgmma, and per chunk
//
//   X^T = S^T K^T                 A = S^T (bf16 of the accumulators), B = k (K-major)
//   Y   = V^T - X^T diag(d)       element-wise, as the next product's A fragments
//   V'^T = Y (T diag(beta))^T     B = T diag(beta) (K-major), its bf16 hi and lo halves
//   S^T <- exp(G_last) S^T + (V'^T diag(e)) K      B = k (MN-major)
//
// An accumulator's columns 16 s .. 16 s + 15 are, thread for thread, the A fragment of k-step
// s of the next product, so nothing of the chain passes through shared memory. The prepare
// stores k's chunk rows and T diag(beta)'s halves in the core-matrix layout (`cm_index`) that
// wgmma reads K-major and MN-major alike, so each arrives by one bulk copy; V's tile rows come
// by the warpgroup's asynchronous copies.
//
// The outputs walk in the same form (`gdn_prefill_outputs_regs_k128`) adds, per chunk,
//
//   O^T = S^T Q^T diag(d) + V'^T C^T     C = Q K^T o D, the prepare's scores
//
// with S^T Q^T issued beside X^T (both take S^T as their A operand) and V'^T C^T beside the
// update, so neither sits on the chain; q's chunk rows and the scores come in the core-matrix
// layout too. O^T is staged transposed in shared memory (stmatrix) and goes to o by rows while
// the next chunk's first products run.
//
// The three walks are one template, `regs_walk`, over the walk's mode.

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// The wgmma descriptor of the 16 x 64 operand at rows r0.., columns c0.. of a core-matrix
// matrix: the leading byte offset is the next core matrix along k, the stride byte offset the
// next along n, so k along the columns (K-major) takes a column block and a core matrix, k
// along the rows (MN-major) the reverse.
template <bool K_ALONG_COLUMNS>
__device__ __forceinline__ unsigned long long lead_desc(const unsigned short* base, int r0, int c0) {
    const unsigned address = shared_address(base + cm_index(r0, c0));
    constexpr unsigned long long BLOCK = PF_CM_BLOCK * 2, CORE = 128;
    constexpr unsigned long long LEADING = K_ALONG_COLUMNS ? BLOCK : CORE;
    constexpr unsigned long long STRIDE = K_ALONG_COLUMNS ? CORE : BLOCK;
    return (unsigned long long)((address & 0x3ffffu) >> 4) | ((LEADING >> 4) << 16) | ((STRIDE >> 4) << 32);
}

// d += A (64 x 16, registers) B (16 x 64, shared memory by descriptor): TRANS_B 0 for a
// K-major B, 1 for an MN-major one. Issued by the whole warpgroup; d is valid after the wait.
template <int TRANS_B>
__device__ __forceinline__ void lead_wgmma(float (&d)[8][4], const unsigned (&a)[4], unsigned long long desc) {
    asm volatile(
        "{ .reg .pred p; setp.ne.b32 p, %37, 0; "
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
        "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %38; }"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
          "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
          "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
          "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1), "n"(TRANS_B)
        : "memory");
}

// The A fragment of k-step s (columns 16 s .. 16 s + 15) of a product whose A is the bf16 of
// the m64n64 accumulators `d`.
__device__ __forceinline__ void lead_a_from(unsigned (&a)[4], const float (&d)[8][4], int s) {
    a[0] = pack_bf16(d[2 * s][0], d[2 * s][1]);
    a[1] = pack_bf16(d[2 * s][2], d[2 * s][3]);
    a[2] = pack_bf16(d[2 * s + 1][0], d[2 * s + 1][1]);
    a[3] = pack_bf16(d[2 * s + 1][2], d[2 * s + 1][3]);
}

// Where a thread's accumulator element (n8 tile j, element e) of S^T sits: value column c of
// the tile (the row of S^T) and key (its column; half h adds 64).
__device__ __forceinline__ int lead_value_col(int warp, int lane, int e) {
    return 16 * warp + (lane >> 2) + 8 * (e >> 1);
}
__device__ __forceinline__ int lead_key(int h, int j, int lane, int e) {
    return 64 * h + 8 * j + 2 * (lane & 3) + (e & 1);
}


// f(h, j, e, r, c) for each of the thread's S^T accumulator elements state[h][j][e]: key r (the
// column of S^T) and value column c (col0 + its row).
template <typename F>
__device__ __forceinline__ void regs_each_element(int col0, int warp, int lane, F&& f) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) f(h, j, e, lead_key(h, j, lane, e), col0 + lead_value_col(warp, lane, e));
        }
    }
}

// A segment's entry state as S^T in the accumulators (entry_state_element, transposed).
template <int KP>
__device__ __forceinline__ void regs_entry_state(float (&state)[2][8][4], const PrefillParams& p, int segment,
                                                  long long state_row, int head, int col0, int warp,
                                                  int lane) {
    regs_each_element(col0, warp, lane, [&](int h, int j, int e, int r, int c) {
        state[h][j][e] = entry_state_element<KP>(p, segment, state_row, head, r, c);
    });
}

// The chain's pieces (one warpgroup; fragments as lead_a_from's).

// The A fragments of V^T for k-steps 0..3 (chunk rows 16 s ..), the warp's 16 value columns, by
// ldmatrix .trans from V's tile rows in row-major shared memory with leading dimension `ld`.
__device__ __forceinline__ void regs_v_fragments_rows(unsigned (&vt)[4][4], const unsigned short* v_rows, int ld,
                                                      int warp, int lane) {
    const int m = lane >> 3;
#pragma unroll
    for (int s = 0; s < 4; ++s) {
        ldsm_x4_trans(vt[s], v_rows + (16 * s + 8 * (m >> 1) + (lane & 7)) * ld + 16 * warp + 8 * (m & 1));
    }
}

// out = bf16 of (V^T where WITH_V) + sign x diag(scale), as A fragments (x: an m64n64
// accumulator whose columns are the chunk's rows).
template <bool WITH_V>
__device__ __forceinline__ void regs_fragments(unsigned (&out)[4][4], const unsigned (&vt)[4][4],
                                                const float (&x)[8][4], const float* scale, float sign,
                                                int lane) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int i = 8 * j + 2 * (lane & 3);
        const float s0 = sign * scale[i], s1 = sign * scale[i + 1];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float v0 = 0.0f, v1 = 0.0f;
            if (WITH_V) {
                const unsigned bits = vt[j >> 1][2 * (j & 1) + h];
                v0 = bf16_to_f32((unsigned short)(bits & 0xffffu));
                v1 = bf16_to_f32((unsigned short)(bits >> 16));
            }
            out[j >> 1][2 * (j & 1) + h] = pack_bf16(v0 + s0 * x[j][2 * h], v1 + s1 * x[j][2 * h + 1]);
        }
    }
}

// x += S^T B^T over the 128 keys (B K-major in `b_cm`) issued; the caller fences, commits and
// waits.
__device__ __forceinline__ void regs_issue_keys(float (&x)[8][4], const unsigned (&a)[8][4],
                                                 const unsigned short* b_cm) {
#pragma unroll
    for (int s = 0; s < 8; ++s) lead_wgmma<0>(x, a[s], lead_desc<true>(b_cm, 0, 16 * s));
}

// S^T <- decay S^T + P K issued (K MN-major in `k_cm`; the caller fences, commits and waits).
__device__ __forceinline__ void regs_issue_update(float (&state)[2][8][4], const unsigned (&pa)[4][4],
                                                   const unsigned short* k_cm) {
#pragma unroll
    for (int s = 0; s < 4; ++s) {
        lead_wgmma<1>(state[0], pa[s], lead_desc<false>(k_cm, 16 * s, 0));
        lead_wgmma<1>(state[1], pa[s], lead_desc<false>(k_cm, 16 * s, 64));
    }
}

__device__ __forceinline__ void regs_decay(float (&state)[2][8][4], float decay) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) state[h][j][e] *= decay;
        }
    }
}

// The lead's hand-over: S^T where the segment that follows reads its entry state.
template <int KP>
__device__ __forceinline__ void regs_hand_over(const float (&state)[2][8][4], const PrefillParams& p, int segment,
                                                int head, int col0, int warp, int lane) {
    regs_each_element(col0, warp, lane, [&](int h, int j, int e, int r, int c) {
        ((float*)p.segment_states)[segment_state_index<KP>(p, segment, head, r, c)] = state[h][j][e];
    });
}


// The transition's end state: a segment's map M (columns of the K x K map, `m_cols`) or its
// D (value columns), as `combine` reads them.
template <int KP>
__device__ __forceinline__ void regs_store_transition(const float (&state)[2][8][4], const PrefillParams& p,
                                                      int segment, int head, int col0, bool m_cols, int warp,
                                                      int lane) {
    const long long block = (long long)segment * p.value_heads + head;
    regs_each_element(col0, warp, lane, [&](int h, int j, int e, int r, int c) {
        if (m_cols) {
            ((float*)p.transition_m)[(block * KP + r) * KP + c] = state[h][j][e];
        } else {
            ((float*)p.transition_d)[(block * KP + r) * p.value_pad + c] = state[h][j][e];
        }
    });
}

// A register state S^T stored as row `state_row` of a [*, H, K, V] f32 tensor (its keys < K and
// columns col0.. < V): the final states and checkpoints.
template <int KP>
__device__ __forceinline__ void regs_store_state(const float (&state)[2][8][4], float* dst, long long state_row,
                                                 int head, int col0, int warp, int lane,
                                                 const PrefillParams& p) {
    regs_each_element(col0, warp, lane, [&](int h, int j, int e, int r, int c) {
        if (r < p.key_dim && c < p.value_dim) {
            dst[((state_row * p.value_heads + head) * p.key_dim + r) * p.value_dim + c] = state[h][j][e];
        }
    });
}

// One chunk's O staged for the outputs walk's row-wise stores: the chunk's tokens as rows, the
// tile's 64 columns and 8 halves of pad (stmatrix's eight rows on distinct banks), in o's dtype.
#define PF_O_LD (PF_TILE + PF_PAD)
#define PF_O_STAGE_HALFS (PF_CHUNK * PF_O_LD)

// Two floats rounded to f16 in one register, `lo` in the low half.
__device__ __forceinline__ unsigned pack_f16(float lo, float hi) {
    unsigned packed;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
    return packed;
}

// The warp's part of O^T (its 16 value columns as rows, the chunk's tokens as columns), scaled
// and rounded to bf16 or f16, stored transposed into `stage` (stage[token][column]) by four
// stmatrix: matrix 2 jj + h of a call holds tokens 8 (j + jj) .. and columns 16 warp + 8 h ..
__device__ __forceinline__ void regs_stage_o(unsigned short* stage, const float (&o)[8][4], float scale, bool f16,
                                             int warp, int lane) {
    const int m = lane >> 3, q = lane & 7;
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
        unsigned r[4];
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float lo = o[j + jj][2 * h] * scale, hi = o[j + jj][2 * h + 1] * scale;
                r[2 * jj + h] = f16 ? pack_f16(lo, hi) : pack_bf16(lo, hi);
            }
        }
        stsm_x4_trans(stage + (8 * (j + (m >> 1)) + q) * PF_O_LD + 16 * warp + 8 * (m & 1), r[0], r[1], r[2], r[3]);
    }
}

// A staged chunk's rows (those < len, from token row `first_row`) to o: 16-byte pieces where
// o's rows are 16-byte aligned, else element by element. Every thread of the warpgroup takes
// four of the chunk's 512 pieces.
__device__ __forceinline__ void regs_write_o(const unsigned short* stage, const PrefillParams& p, long long first_row,
                                             int len, int head, int col0) {
    const bool pieces = (p.value_dim & 7) == 0 && ((unsigned long long)p.o & 15) == 0;
#pragma unroll
    for (int k = 0; k < PF_CHUNK * PF_TILE / 8 / 128; ++k) {
        const int piece = threadIdx.x + 128 * k;
        const int i = piece >> 3, c = col0 + 8 * (piece & 7);
        if (i >= len || c >= p.value_dim) continue;
        const unsigned short* from = stage + i * PF_O_LD + (c - col0);
        unsigned short* to = (unsigned short*)p.o + ((first_row + i) * p.value_heads + head) * (long long)p.value_dim + c;
        if (pieces) {
            *(uint4*)to = *(const uint4*)from;
        } else {
            for (int e = 0; e < 8 && c + e < p.value_dim; ++e) to[e] = from[e];
        }
    }
}

// O^T's accumulators straight to an f32 o, scaled (the tile's columns < V, tokens < len).
__device__ __forceinline__ void regs_store_o_f32(const float (&o)[8][4], const PrefillParams& p, long long first_row,
                                                 int len, int head, int col0, int warp, int lane) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = 8 * j + 2 * (lane & 3) + (e & 1);
            const int c = col0 + lead_value_col(warp, lane, e);
            if (i < len && c < p.value_dim) {
                ((float*)p.o)[((first_row + i) * p.value_heads + head) * (long long)p.value_dim + c] = o[j][e] * p.scale;
            }
        }
    }
}

// One stage of a register walk: the chunk's gates, k in the core-matrix layout ([64][KP]), for
// the outputs q too, T diag(beta)'s hi and lo halves (core-matrix [64][64] each), for the
// outputs the scores (core-matrix [64][64]), and V's tile rows ([64][72]); everything but V's
// rows arrives by bulk copies in this order.
template <int KP, bool OUTPUTS>
struct RegsStage {
    static constexpr int K_ELEMS = KP / 8 * PF_CM_BLOCK;
    static constexpr int V_LD = PF_TILE + PF_PAD;
    static constexpr int BULK_HALFS = (OUTPUTS ? 2 : 1) * K_ELEMS + (OUTPUTS ? 3 : 2) * PF_T_CM_ELEMS;
    static constexpr int BYTES = PF_GATES_BYTES + 2 * (BULK_HALFS + PF_CHUNK * V_LD);
    ChunkGates* gates;
    unsigned short* k;
    unsigned short* q;  // OUTPUTS only
    unsigned short* t_hi;
    unsigned short* t_lo;
    unsigned short* scores;  // OUTPUTS only
    unsigned short* v;
    __device__ RegsStage(unsigned char* base) {
        gates = (ChunkGates*)base;
        k = (unsigned short*)(base + PF_GATES_BYTES);
        q = k + K_ELEMS;
        t_hi = OUTPUTS ? q + K_ELEMS : q;
        t_lo = t_hi + PF_T_CM_ELEMS;
        scores = t_lo + PF_T_CM_ELEMS;
        v = OUTPUTS ? scores + PF_T_CM_ELEMS : scores;
    }
};

#define REGS_LEAD 0
#define REGS_TRANSITION 1
#define REGS_OUTPUTS 2

// The register walks (see the top of the file): 128 threads per (value columns tile, head,
// segment), two stages, chunk c + 1's copies issued while chunk c computes. Shared memory: the
// two stages, for the outputs two chunks' staged O, then an mbarrier per stage (the host's
// `lead_regs_smem` and `outputs_regs_smem`).
//
// REGS_LEAD: the relay's lead, from the entry state to the hand-over (`regs_hand_over`).
// REGS_TRANSITION: the scan's transition. Blocks with tile < V / 64 walk value columns from a
// zero state (the segment's D), the others columns of the K x K map from the identity with no
// V (M: S_exit = M S_entry + D); the last segment of a sequence has no successor and walks
// nothing.
// REGS_OUTPUTS: the outputs walk from the entry state (`regs_entry_state`): O^T per chunk,
// checkpoints after the chunks the table names, the final state where the segment ends its
// sequence.
//
// STAGES: 2, chunk c + 1's copies issued at chunk c's start; 1 (the outputs walk only, where
// its blocks fill more than a wave: half the shared memory, two blocks per SM), chunk c + 1's
// copies issued once chunk c's last product has read the stage, their wait exposed.
template <int KP, int MODE, int STAGES = 2>
__device__ void regs_walk(const PrefillParams& p) {
    static_assert(KP == 128, "two m64n64 halves of S^T");
    static_assert(STAGES == 2 || (STAGES == 1 && MODE == REGS_OUTPUTS), "one stage: the outputs walk");
    constexpr bool TRANSITION = MODE == REGS_TRANSITION, OUTPUTS = MODE == REGS_OUTPUTS;
    using Stage = RegsStage<KP, OUTPUTS>;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    unsigned char* stage_base = smem_raw;
    unsigned short* o_stage = (unsigned short*)(stage_base + STAGES * Stage::BYTES);  // two chunks' O
    unsigned long long* full = (unsigned long long*)(o_stage + (OUTPUTS ? 2 * PF_O_STAGE_HALFS : 0));

    const int tile = blockIdx.x, head = blockIdx.y, segment = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int* seg = (const int*)p.segments + SEG_FIELDS * segment;
    const int seq = seg[SEG_SEQ], first_chunk = seg[SEG_FIRST_CHUNK], chunks = seg[SEG_CHUNKS];
    const int key_head = head / (p.value_heads / p.key_heads);
    if (TRANSITION && segment_is_last(p, segment)) return;
    const int tiles_v = p.value_pad / PF_TILE;
    const bool m_cols = TRANSITION && tile >= tiles_v;
    const int col0 = (m_cols ? tile - tiles_v : tile) * PF_TILE;
    const long long state_row = p.state_rows ? ((const long long*)p.state_rows)[seq] : (long long)seq;
    const SegmentRows rows(p, first_chunk, chunks);
    const bool staged_o = OUTPUTS && p.out_dtype != DT_F32, f16_o = p.out_dtype == DT_F16;
    // The stage and mbarrier of chunk ci, and the barrier's phase parity at that chunk.
    auto slot_of = [](int ci) { return STAGES == 2 ? ci & 1 : 0; };
    auto parity_of = [](int ci) { return STAGES == 2 ? (ci >> 1) & 1 : ci & 1; };
    auto stage_of = [&](int ci) { return Stage(stage_base + slot_of(ci) * Stage::BYTES); };
    // Chunk ci's inputs: gates, k, (q,) T's halves (and the scores) by thread 0's bulk copies
    // completing on the stage's barrier, V's tile rows by the warpgroup's asynchronous copies
    // (its own group).
    auto issue = [&](int ci) {
        const Stage stage = stage_of(ci);
        const int chunk = first_chunk + ci;
        if (threadIdx.x == 0) {
            const long long chunk_head = (long long)chunk * p.value_heads + head;
            auto chunk_key = [&] { return ((long long)chunk * p.key_heads + key_head) * Stage::K_ELEMS; };
            // k's offset formed before the copies in the outputs walk and at k's copy in the
            // others: the placement ptxas schedules best for each.
            const long long key_offset = OUTPUTS ? chunk_key() : 0;
            unsigned long long* bar = &full[slot_of(ci)];
            // The warpgroup's reads of the stage's last chunk (ordered before by its barrier)
            // come before the copies' writes.
            fence_proxy_async();
            bulk_expect(bar, PF_GATES_BYTES + 2u * Stage::BULK_HALFS);
            bulk_load(stage.gates, (const unsigned char*)p.gates + chunk_head * PF_GATES_BYTES, PF_GATES_BYTES, bar);
            const long long chunk_key_offset = OUTPUTS ? key_offset : chunk_key();
            bulk_load(stage.k, (const unsigned short*)p.k_cm + chunk_key_offset, 2u * Stage::K_ELEMS, bar);
            if (OUTPUTS) bulk_load(stage.q, (const unsigned short*)p.q_cm + chunk_key_offset, 2u * Stage::K_ELEMS, bar);
            bulk_load(stage.t_hi, (const unsigned short*)p.t_cm + chunk_head * 2 * PF_T_CM_ELEMS,
                      2u * 2 * PF_T_CM_ELEMS, bar);
            if (OUTPUTS) {
                bulk_load(stage.scores, (const unsigned short*)p.scores + chunk_head * PF_T_CM_ELEMS,
                          2u * PF_T_CM_ELEMS, bar);
            }
        }
        if (!m_cols) {
            const unsigned short* v_rows =
                (const unsigned short*)p.v + (rows.row(ci) * p.value_heads + head) * p.value_pad + col0;
            copy_rows_async_team<PF_TILE, 128>(stage.v, Stage::V_LD, v_rows,
                                               (long long)p.value_heads * p.value_pad, rows.len(ci));
        }
        cp_async_commit();
    };
    // Chunk ci's staged O to o (ordered after its stmatrix by a barrier at a chunk's start).
    auto write_o = [&](int ci) {
        regs_write_o(o_stage + (ci & 1) * PF_O_STAGE_HALFS, p, rows.row(ci), rows.len(ci), head, col0);
    };

    float state[2][8][4];
    if (TRANSITION) {
        regs_each_element(col0, warp, lane, [&](int h, int j, int e, int r, int c) {
            state[h][j][e] = (m_cols && r == c) ? 1.0f : 0.0f;
        });
    } else {
        regs_entry_state<KP>(state, p, segment, state_row, head, col0, warp, lane);
    }
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) bulk_barrier_init(&full[s]);
    }
    __syncthreads();
    if (chunks > 0) issue(0);
    for (int ci = 0; ci < chunks; ++ci) {
        const Stage stage = stage_of(ci);
        cp_async_wait_all();
        bulk_wait(&full[slot_of(ci)], parity_of(ci));
        // Every warp's V rows have landed and every warp is done with the other stage.
        __syncthreads();
        if (STAGES == 2 && ci + 1 < chunks) issue(ci + 1);
        const ChunkGates& gates = *stage.gates;
        // X^T = S^T K^T (and O^T = S^T Q^T in the same group).
        float x[8][4], o[8][4];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            x[j][0] = x[j][1] = x[j][2] = x[j][3] = 0.0f;
            if (OUTPUTS) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
        }
        unsigned a[8][4];
#pragma unroll
        for (int s = 0; s < 8; ++s) lead_a_from(a[s], state[s >> 2], s & 3);
        wg_fence(x);
        if (OUTPUTS) wg_fence(o);
        wg_fence(a);
        wgmma_fence();
        regs_issue_keys(x, a, stage.k);
        if (OUTPUTS) regs_issue_keys(o, a, stage.q);
        wgmma_commit();
        // The last chunk's O leaves while the products run (its stage is rewritten two chunks
        // on, after the barrier at that chunk's start).
        if (staged_o && ci > 0) write_o(ci - 1);
        unsigned vt[4][4];
        if (!m_cols) regs_v_fragments_rows(vt, stage.v, Stage::V_LD, warp, lane);
        wgmma_wait_all();
        wg_fence(x);
        if (OUTPUTS) wg_fence(o);
        wg_fence(a);
        // V'^T = (V^T - X^T diag(d)) (T diag(beta))^T, T's halves in turn (no V for M's
        // columns); diag(d) on O^T's columns meanwhile.
        unsigned y[4][4];
        if (m_cols) {
            regs_fragments<false>(y, vt, x, gates.start_decay, -1.0f, lane);
        } else {
            regs_fragments<true>(y, vt, x, gates.start_decay, -1.0f, lane);
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            x[j][0] = x[j][1] = x[j][2] = x[j][3] = 0.0f;
            if (OUTPUTS) {
                const int i = 8 * j + 2 * (lane & 3);
                const float d0 = gates.start_decay[i], d1 = gates.start_decay[i + 1];
                o[j][0] *= d0, o[j][1] *= d1, o[j][2] *= d0, o[j][3] *= d1;
            }
        }
        wg_fence(x);
        wg_fence(y);
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < 4; ++s) lead_wgmma<0>(x, y[s], lead_desc<true>(stage.t_lo, 0, 16 * s));
#pragma unroll
        for (int s = 0; s < 4; ++s) lead_wgmma<0>(x, y[s], lead_desc<true>(stage.t_hi, 0, 16 * s));
        wgmma_commit();
        wgmma_wait_all();
        wg_fence(x);
        wg_fence(y);
        // S^T <- exp(G_last) S^T + (V'^T diag(e)) K (and O^T += V'^T C^T in the same group).
        unsigned pa[4][4], va[4][4];
        regs_fragments<false>(pa, vt, x, gates.end_decay, 1.0f, lane);
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
        if (OUTPUTS) wg_fence(o);
        wg_fence(pa);
        if (OUTPUTS) wg_fence(va);
        wgmma_fence();
        regs_issue_update(state, pa, stage.k);
        if (OUTPUTS) {
#pragma unroll
            for (int s = 0; s < 4; ++s) lead_wgmma<0>(o, va[s], lead_desc<true>(stage.scores, 0, 16 * s));
        }
        wgmma_commit();
        wgmma_wait_all();
        wg_fence(state[0]);
        wg_fence(state[1]);
        if (OUTPUTS) wg_fence(o);
        wg_fence(pa);
        if (STAGES == 1) {
            // Every warp's products have read the one stage: the next chunk's copies may land.
            __syncthreads();
            if (ci + 1 < chunks) issue(ci + 1);
        }
        if (OUTPUTS) {
            wg_fence(va);
            // O: staged in o's 2-byte dtype for the next chunk to write out, or straight to an
            // f32 o.
            if (staged_o) {
                regs_stage_o(o_stage + (ci & 1) * PF_O_STAGE_HALFS, o, p.scale, f16_o, warp, lane);
            } else {
                regs_store_o_f32(o, p, rows.row(ci), rows.len(ci), head, col0, warp, lane);
            }
            if (p.checkpoints) {
                const int checkpoint = ((const int*)p.chunk_checkpoint)[first_chunk + ci];
                if (checkpoint >= 0) {
                    regs_store_state<KP>(state, (float*)p.checkpoints, checkpoint, head, col0, warp, lane, p);
                }
            }
        }
    }
    if (TRANSITION) {
        regs_store_transition<KP>(state, p, segment, head, col0, m_cols, warp, lane);
    } else if (OUTPUTS) {
        if (staged_o && chunks > 0) {
            __syncthreads();
            write_o(chunks - 1);
        }
        if (p.final_state && segment_is_last(p, segment)) {
            regs_store_state<KP>(state, (float*)p.final_state, state_row, head, col0, warp, lane, p);
        }
    } else {
        regs_hand_over<KP>(state, p, segment, head, col0, warp, lane);
    }
}

extern "C" __global__ void __launch_bounds__(128, 1) gdn_prefill_lead_regs_k128(PrefillParams p) {
    wait_for_prepare();
    regs_walk<128, REGS_LEAD>(p);
}

extern "C" __global__ void __launch_bounds__(128, 1) gdn_prefill_transition_regs_k128(PrefillParams p) {
    wait_for_prepare();
    regs_walk<128, REGS_TRANSITION>(p);
}

extern "C" __global__ void __launch_bounds__(128, 1) gdn_prefill_outputs_regs_k128(PrefillParams p) {
    wait_for_prepare();
    regs_walk<128, REGS_OUTPUTS>(p);
}

// The outputs walk with one stage (two blocks per SM), for walks of more than a wave.
extern "C" __global__ void __launch_bounds__(128, 2) gdn_prefill_outputs1_regs_k128(PrefillParams p) {
    wait_for_prepare();
    regs_walk<128, REGS_OUTPUTS, 1>(p);
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

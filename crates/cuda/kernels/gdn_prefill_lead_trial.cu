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

// Elements of one 8-column block of a 64-row core-matrix matrix: its eight 8 x 8 core
// matrices (128 bytes each) and 16 bytes that put consecutive blocks on different banks.
#define LEAD_CM_BLOCK (PF_CHUNK * 8 + 8)

// Index of element (r, c) of a [64][cols] bf16 matrix in the core-matrix layout.
__device__ __forceinline__ int lead_cm(int r, int c) {
    return (c >> 3) * LEAD_CM_BLOCK + (r >> 3) * 64 + (r & 7) * 8 + (c & 7);
}

// The wgmma descriptor of the 16 x 64 operand at rows r0.., columns c0.. of a core-matrix
// matrix: the leading byte offset is the next core matrix along k, the stride byte offset the
// next along n, so k along the columns (K-major) takes a column block and a core matrix, k
// along the rows (MN-major) the reverse.
template <bool K_ALONG_COLUMNS>
__device__ __forceinline__ unsigned long long lead_desc(const unsigned short* base, int r0, int c0) {
    const unsigned address = shared_address(base + lead_cm(r0, c0));
    constexpr unsigned long long BLOCK = LEAD_CM_BLOCK * 2, CORE = 128;
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


// A segment's entry state as S^T in the accumulators (load_entry_state's sources, transposed).
template <int KP>
__device__ __forceinline__ void trial_entry_state(float (&state)[2][8][4], const PrefillParams& p, int segment,
                                                  long long state_row, int head, int col0, int warp,
                                                  int lane) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = lead_key(h, j, lane, e), c = col0 + lead_value_col(warp, lane, e);
                float x = 0.0f;
                if (p.use_segment_states) {
                    x = ((const float*)p.segment_states)
                        [(((long long)segment * p.value_heads + head) * KP + r) * p.value_pad + c];
                } else if (p.initial_state && r < p.key_dim && c < p.value_dim) {
                    x = ((const float*)p.initial_state)
                        [((state_row * p.value_heads + head) * p.key_dim + r) * p.value_dim + c];
                }
                state[h][j][e] = x;
            }
        }
    }
}

// The chain's pieces, shared by both trial walks (one warpgroup; fragments as lead_a_from's).

// The A fragments of V^T (U's tile standing in) for k-steps 0..3 (chunk rows 16 s ..), the
// warp's 16 value columns, by ldmatrix .trans.
__device__ __forceinline__ void trial_v_fragments(unsigned (&vt)[4][4], const unsigned short* u_tile, int warp,
                                                  int lane) {
    const int m = lane >> 3;
#pragma unroll
    for (int s = 0; s < 4; ++s) {
        ldsm_x4_trans(vt[s], u_tile + swizzled(16 * s + 8 * (m >> 1) + (lane & 7), 16 * warp + 8 * (m & 1), PF_TILE));
    }
}

// out = bf16 of (V^T where WITH_V) + sign x diag(scale), as A fragments (x: an m64n64
// accumulator whose columns are the chunk's rows).
template <bool WITH_V>
__device__ __forceinline__ void trial_fragments(unsigned (&out)[4][4], const unsigned (&vt)[4][4],
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
__device__ __forceinline__ void trial_issue_keys(float (&x)[8][4], const unsigned (&a)[8][4],
                                                 const unsigned short* b_cm) {
#pragma unroll
    for (int s = 0; s < 8; ++s) lead_wgmma<0>(x, a[s], lead_desc<true>(b_cm, 0, 16 * s));
}

// x = y M over the chunk's 64 rows (M K-major in `m_cm`), waited for.
__device__ __forceinline__ void trial_times_m(float (&x)[8][4], unsigned (&y)[4][4], const unsigned short* m_cm) {
#pragma unroll
    for (int j = 0; j < 8; ++j) x[j][0] = x[j][1] = x[j][2] = x[j][3] = 0.0f;
    wg_fence(x);
    wg_fence(y);
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < 4; ++s) lead_wgmma<0>(x, y[s], lead_desc<true>(m_cm, 0, 16 * s));
    wgmma_commit();
    wgmma_wait_all();
    wg_fence(x);
    wg_fence(y);
}

// S^T <- decay S^T + P K issued (K MN-major in `k_cm`; the caller fences, commits and waits).
__device__ __forceinline__ void trial_issue_update(float (&state)[2][8][4], const unsigned (&pa)[4][4],
                                                   const unsigned short* k_cm) {
#pragma unroll
    for (int s = 0; s < 4; ++s) {
        lead_wgmma<1>(state[0], pa[s], lead_desc<false>(k_cm, 16 * s, 0));
        lead_wgmma<1>(state[1], pa[s], lead_desc<false>(k_cm, 16 * s, 64));
    }
}

__device__ __forceinline__ void trial_decay(float (&state)[2][8][4], float decay) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) state[h][j][e] *= decay;
        }
    }
}

// The hand-over of a trial lead: S^T where the segment that follows reads its entry state.
template <int KP>
__device__ __forceinline__ void trial_hand_over(const float (&state)[2][8][4], const PrefillParams& p, int segment,
                                                int head, int col0, int warp, int lane) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = lead_key(h, j, lane, e), c = col0 + lead_value_col(warp, lane, e);
                ((float*)p.segment_states)[(((long long)segment * p.value_heads + head) * KP + r) * p.value_pad + c] =
                    state[h][j][e];
            }
        }
    }
}

// Both trial walks: the lead (OUTPUTS false; trials 1 and 2, 3's lead is 2's) and the outputs
// walk of trial 3. Two stages of the lockstep pass's layout; the core-matrix buffers w_cm and
// k_cm stand in for every B operand.
template <int KP, bool OUTPUTS>
__device__ void trial_walk(const PrefillParams& p) {
    static_assert(KP == 128, "two m64n64 halves of S^T");
    constexpr int CM_ELEMS = (KP / 8) * LEAD_CM_BLOCK;
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
    trial_entry_state<KP>(state, p, segment, state_row, head, col0, warp, lane);
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
        trial_issue_keys(x, a, W_FORM ? w_cm : k_cm);
        if (OUTPUTS) trial_issue_keys(o, a, w_cm);
        wgmma_commit();
        unsigned vt[4][4];
        trial_v_fragments(vt, stage.u, warp, lane);
        wgmma_wait_all();
        wg_fence(x);
        wg_fence(o);
        wg_fence(a);
        if (!W_FORM) {
            // V'^T = (V^T - X^T diag(d)) M into x.
            unsigned y[4][4];
            trial_fragments<true>(y, vt, x, gates.start_decay, -1.0f, lane);
            trial_times_m(x, y, w_cm);
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
            trial_fragments<true>(pa, vt, x, gates.end_decay, -1.0f, lane);
        } else {
            trial_fragments<false>(pa, vt, x, gates.end_decay, 1.0f, lane);
        }
        if (OUTPUTS) {
#pragma unroll
            for (int j = 0; j < 8; ++j) {
#pragma unroll
                for (int h = 0; h < 2; ++h) va[j >> 1][2 * (j & 1) + h] = pack_bf16(x[j][2 * h], x[j][2 * h + 1]);
            }
        }
        trial_decay(state, gates.state_decay);
        wg_fence(state[0]);
        wg_fence(state[1]);
        wg_fence(o);
        wg_fence(pa);
        wg_fence(va);
        wgmma_fence();
        trial_issue_update(state, pa, k_cm);
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
    if (!OUTPUTS) trial_hand_over<KP>(state, p, segment, head, col0, warp, lane);
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

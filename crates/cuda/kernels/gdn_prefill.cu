// GDN chunked prefill on tensor cores (bf16 operands, f32 accumulation).
//
// For one (sequence, value head) and a chunk of c <= 64 tokens entered with state S (K x V),
// G the within-chunk cumsum of g (restarting at a reset gate), D_ij = exp(G_i - G_j) for
// j <= i in the same reset segment (else 0), d_i = exp(G_i) while no reset came before i,
// e_i = exp(G_last - G_i) for tokens in the last reset segment:
//
//   A  = strictly_lower( diag(beta) K K^T o D )          T = (I + A)^-1
//   W  = T diag(beta d) K                                U = T diag(beta) V
//   V' = U - W S                                         (the delta-rule values)
//   O  = scale * ( diag(d) Q S + (Q K^T o D) V' )
//   S <- exp(G_last) S + K^T diag(e) V'                  (exp(G_last) = 0 after a reset)
//
// Three kernels run a call:
//   gdn_prefill_prepare_*: every (chunk, head) in parallel: A, T (forward substitution in
//     f32), W and U (T split into two bf16 halves so the products keep ~16 bits), stored bf16.
//   gdn_prefill_state_*: one block per (segment of chunks, head, 64 value columns) walks its
//     chunks in order with S in registers (f32), computing V', O and the next S. In transition
//     mode it runs without outputs from a zero state (the segment's own contribution D) or
//     from the identity on K extra columns (the segment's linear map M on entry states).
//   gdn_prefill_combine: per (sequence, head, 16 columns), the entry state of each segment:
//     S_{s+1} = M_s S_s + D_s in f32, so long sequences with few heads use every SM.
//
// Rows past a sequence end are zero in Q, K, V and W/U and are masked before any exp.

#define PF_CHUNK 64
#define PF_TILE 64   // value columns per state block
#define PF_PAD 8     // bf16 elements of padding per shared-memory row (bank spread)
#define PF_LDC (PF_CHUNK + PF_PAD)

// Fields of one segment record (i32): the sequence, its first chunk and chunk count, the
// segment's position in its sequence and the sequence's segment count.
#define SEG_SEQ 0
#define SEG_FIRST_CHUNK 1
#define SEG_CHUNKS 2
#define SEG_INDEX 3
#define SEG_COUNT 4
#define SEG_FIELDS 5

struct PrefillParams {
    u64 q, k, v, g, beta;
    u64 o;                // [rows, H, V] in out_dtype
    u64 w, u;             // bf16 [chunks, H, 64, KP] and [chunks, H, 64, VP]
    u64 chunk_first_row;  // i64 [chunks]
    u64 chunk_len;        // i32 [chunks]
    u64 segments;         // i32 [segments, SEG_FIELDS]
    u64 seq_first_segment;// i32 [N + 1]
    u64 initial_state;    // f32 [*, H, K, V] or 0 (zero initial state)
    u64 final_state;      // f32 [*, H, K, V] or 0 (not written)
    u64 state_rows;       // i64 [N]: the row of initial/final state of each sequence, or 0 (= n)
    u64 segment_states;   // f32 [segments, H, KP, VP]: entry state of each segment
    u64 transition_d;     // f32 [segments, H, KP, VP]
    u64 transition_m;     // f32 [segments, H, KP, KP]
    int key_heads, value_heads, key_dim, value_dim;
    int key_pad, value_pad;  // KP, VP: K and V rounded up to the kernel's tile sizes
    int act_dtype, out_dtype, g_dtype, beta_dtype;
    int l2norm;
    int use_segment_states;  // entry states come from segment_states (set when any sequence
                             // has several segments)
    float scale;
    float reset_gate;
};

__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const unsigned (&a)[4],
                                               const unsigned (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The A operand (16 x 16) at (row0, col0) of a row-major bf16 matrix with leading dimension ld.
__device__ __forceinline__ void frag_a(unsigned (&a)[4], const unsigned short* x, int ld,
                                       int row0, int col0, int lane) {
    const unsigned short* p = x + (row0 + (lane >> 2)) * ld + col0 + 2 * (lane & 3);
    a[0] = *(const unsigned*)p;
    a[1] = *(const unsigned*)(p + 8 * ld);
    a[2] = *(const unsigned*)(p + 8);
    a[3] = *(const unsigned*)(p + 8 * ld + 8);
}

// The B operand (16 x 8) at (k0, n0) of B[k][n] = z[n][k], z row-major with leading dimension
// ld (so B's columns are z's rows).
__device__ __forceinline__ void frag_b(unsigned (&b)[2], const unsigned short* z, int ld, int k0,
                                       int n0, int lane) {
    const unsigned short* p = z + (n0 + (lane >> 2)) * ld + k0 + 2 * (lane & 3);
    b[0] = *(const unsigned*)p;
    b[1] = *(const unsigned*)(p + 8);
}

__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    return (unsigned)f32_to_bf16(lo) | ((unsigned)f32_to_bf16(hi) << 16);
}

// The chunk's gates in shared memory: within-chunk cumsum `g_cum` restarting after a reset
// gate, the reset segment `seg` of each token, and the per-token decays. Rows >= len get
// seg = -1 so every mask drops them. Needs `threads >= 64`; ends with a barrier.
struct ChunkGates {
    float g_cum[PF_CHUNK];
    int seg[PF_CHUNK];
    float start_decay[PF_CHUNK];  // d_i
    float end_decay[PF_CHUNK];    // e_i
    float beta[PF_CHUNK];
    float state_decay;            // exp(G_last), 0 after a reset in the chunk
};

// Bytes the gates take at the start of dynamic shared memory (a multiple of 128, so the bf16
// arrays after them keep the alignment of 16-byte copies).
#define PF_GATES_BYTES ((sizeof(ChunkGates) + 127) / 128 * 128)

__device__ void load_chunk_gates(ChunkGates& s, const PrefillParams& p, long long first_row,
                                 int len, int head, bool with_beta) {
    int t = threadIdx.x;
    if (t < PF_CHUNK) {
        long long at = (first_row + t) * p.value_heads + head;
        s.g_cum[t] = t < len ? load_float((const void*)p.g, at, p.g_dtype) : 0.0f;
        if (with_beta) s.beta[t] = t < len ? load_float((const void*)p.beta, at, p.beta_dtype) : 0.0f;
    }
    __syncthreads();
    if (t == 0) {
        float running = 0.0f;
        int segment = 0;
        for (int i = 0; i < PF_CHUNK; ++i) {
            float g = s.g_cum[i];
            if (g < p.reset_gate) {
                segment += 1;
                running = 0.0f;
            } else {
                running += g;
            }
            s.g_cum[i] = running;
            s.seg[i] = i < len ? segment : -1;
        }
    }
    __syncthreads();
    if (t < PF_CHUNK) {
        float last = s.g_cum[len - 1];
        int last_seg = s.seg[len - 1];
        s.start_decay[t] = s.seg[t] == 0 ? expf(s.g_cum[t]) : 0.0f;
        s.end_decay[t] = s.seg[t] == last_seg ? expf(last - s.g_cum[t]) : 0.0f;
        if (t == 0) s.state_decay = last_seg == 0 ? expf(last) : 0.0f;
    }
    __syncthreads();
}

// D_ij of the chunk (0 outside j <= i within one reset segment).
__device__ __forceinline__ float pair_decay(const ChunkGates& s, int i, int j) {
    return (j <= i && s.seg[i] >= 0 && s.seg[i] == s.seg[j]) ? expf(s.g_cum[i] - s.g_cum[j])
                                                               : 0.0f;
}

// Rows first_row .. first_row + 64 of head `head` of a [rows, heads, dim] tensor into
// bf16 shared memory, `dst[r * ld + c]` and/or `dst_t[c * ld_t + r]` (each when given), one warp per
// row, l2-normalised when asked; columns dim..cols_pad and rows >= len are zero.
template <int COLS_PAD>
__device__ void load_rows(unsigned short* dst, int ld, unsigned short* dst_t, int ld_t,
                          const void* src, int dtype, long long first_row, int len, int heads,
                          int head, int dim, bool l2norm, int warps) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    constexpr int PER_LANE = COLS_PAD / 32;
    for (int r = warp; r < PF_CHUNK; r += warps) {
        float x[PER_LANE];
        float sum_sq = 0.0f;
#pragma unroll
        for (int j = 0; j < PER_LANE; ++j) {
            int c = lane + 32 * j;
            x[j] = (r < len && c < dim)
                       ? load_float(src, ((first_row + r) * heads + head) * (long long)dim + c, dtype)
                       : 0.0f;
            sum_sq += x[j] * x[j];
        }
        float factor = 1.0f;
        if (l2norm) factor = 1.0f / sqrtf(warp_sum(sum_sq) + 1e-6f);
#pragma unroll
        for (int j = 0; j < PER_LANE; ++j) {
            int c = lane + 32 * j;
            unsigned short b = f32_to_bf16(x[j] * factor);
            if (dst) dst[r * ld + c] = b;
            if (dst_t) dst_t[c * ld_t + r] = b;
        }
    }
}

// ---------------------------------------------------------------------------------------
// Prepare: A, T, W, U for one (chunk, head). 4 warps.

template <int KP, int VP>
__device__ void prepare_impl(const PrefillParams& p) {
    constexpr int LDK = KP + PF_PAD;
    constexpr int LDF = PF_CHUNK + 1;  // f32 rows of A and T
    extern __shared__ __align__(128) unsigned char smem_raw[];
    ChunkGates& gates = *(ChunkGates*)smem_raw;
    unsigned short* keys = (unsigned short*)(smem_raw + PF_GATES_BYTES);  // [64][LDK]
    unsigned short* keys_t = keys + PF_CHUNK * LDK;                          // [KP][LDC]
    unsigned short* values_t = keys_t + KP * PF_LDC;                         // [VP][LDC]
    unsigned short* t_hi = values_t + VP * PF_LDC;                           // [64][LDC]
    unsigned short* t_lo = t_hi + PF_CHUNK * PF_LDC;                         // [64][LDC]
    float* a_mat = (float*)(t_lo + PF_CHUNK * PF_LDC);                       // [64][LDF]
    float* t_mat = a_mat + PF_CHUNK * LDF;                                   // [64][LDF]

    const int chunk = blockIdx.x, head = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long long first_row = ((const long long*)p.chunk_first_row)[chunk];
    const int len = ((const int*)p.chunk_len)[chunk];
    const int key_head = head / (p.value_heads / p.key_heads);

    load_rows<KP>(keys, LDK, keys_t, PF_LDC, (const void*)p.k, p.act_dtype, first_row, len,
                  p.key_heads, key_head, p.key_dim, p.l2norm != 0, 4);
    load_rows<VP>(nullptr, 0, values_t, PF_LDC, (const void*)p.v, p.act_dtype, first_row, len,
                  p.value_heads, head, p.value_dim, false, 4);
    load_chunk_gates(gates, p, first_row, len, head, true);  // ends with a barrier

    // A = strictly_lower(diag(beta) K K^T o D): warp w owns rows 16w..16w+15.
    {
        float acc[8][4];
#pragma unroll
        for (int n = 0; n < 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
        for (int k0 = 0; k0 < KP; k0 += 16) {
            unsigned a[4];
            frag_a(a, keys, LDK, 16 * warp, k0, lane);
#pragma unroll
            for (int n = 0; n < 8; ++n) {
                unsigned b[2];
                frag_b(b, keys, LDK, k0, 8 * n, lane);
                mma_bf16_16816(acc[n], a, b);
            }
        }
#pragma unroll
        for (int n = 0; n < 8; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int i = 16 * warp + (lane >> 2) + 8 * (e >> 1);
                int j = 8 * n + 2 * (lane & 3) + (e & 1);
                a_mat[i * LDF + j] = j < i ? gates.beta[i] * acc[n][e] * pair_decay(gates, i, j) : 0.0f;
            }
        }
    }
    __syncthreads();
    // T = (I + A)^-1, column j by thread j: T_ij = -sum_{m=j}^{i-1} A_im T_mj for i > j.
    if (threadIdx.x < PF_CHUNK) {
        int j = threadIdx.x;
        for (int i = 0; i < PF_CHUNK; ++i) {
            float t = i == j ? 1.0f : 0.0f;
            if (i > j) {
                for (int m = j; m < i; ++m) t -= a_mat[i * LDF + m] * t_mat[m * LDF + j];
            }
            t_mat[i * LDF + j] = t;
        }
    }
    __syncthreads();

    // W = (T diag(beta d)) K and U = (T diag(beta)) V, each as hi + lo bf16 halves of the
    // scaled T times the bf16 operand.
    for (int pass = 0; pass < 2; ++pass) {
        for (int idx = threadIdx.x; idx < PF_CHUNK * PF_CHUNK; idx += blockDim.x) {
            int i = idx / PF_CHUNK, m = idx % PF_CHUNK;
            float scale_m = gates.beta[m] * (pass == 0 ? gates.start_decay[m] : 1.0f);
            float x = t_mat[i * LDF + m] * scale_m;
            unsigned short hi = f32_to_bf16(x);
            t_hi[i * PF_LDC + m] = hi;
            t_lo[i * PF_LDC + m] = f32_to_bf16(x - bf16_to_f32(hi));
        }
        __syncthreads();
        const unsigned short* operand_t = pass == 0 ? keys_t : values_t;
        const int cols = pass == 0 ? KP : VP;
        unsigned short* out = (unsigned short*)(pass == 0 ? p.w : p.u);
        long long out_base = ((long long)chunk * p.value_heads + head) * PF_CHUNK * cols;
        unsigned a_hi[4][4], a_lo[4][4];
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            frag_a(a_hi[kk], t_hi, PF_LDC, 16 * warp, 16 * kk, lane);
            frag_a(a_lo[kk], t_lo, PF_LDC, 16 * warp, 16 * kk, lane);
        }
        for (int n0 = 0; n0 < cols; n0 += 8) {
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                unsigned b[2];
                frag_b(b, operand_t, PF_LDC, 16 * kk, n0, lane);
                mma_bf16_16816(acc, a_hi[kk], b);
                mma_bf16_16816(acc, a_lo[kk], b);
            }
            int r = 16 * warp + (lane >> 2), c = n0 + 2 * (lane & 3);
            *(unsigned*)(out + out_base + (long long)r * cols + c) = pack_bf16(acc[0], acc[1]);
            *(unsigned*)(out + out_base + (long long)(r + 8) * cols + c) = pack_bf16(acc[2], acc[3]);
        }
        __syncthreads();
    }
}

// ---------------------------------------------------------------------------------------
// The state pass. Block = KP / 16 warps; warp w owns state rows 16w..16w+15 over the block's
// 64 columns (8 mma tiles, 32 f32 per thread). Products over the chunk (64 x 64 outputs: X,
// scores, O) are split as 4 row tiles x (32 / warps) column tiles per warp.

// Shared memory of a state block (the host mirrors this sum in `state_smem`): the gates, then
// bf16 queries, keys, W [64][KP + PAD]; keys^T [KP][64 + PAD]; the state^T [64][KP + PAD];
// V'^T, (diag(e) V')^T and the scores [64][64 + PAD].

// Where a block's entry state comes from and where its end state goes.
#define MODE_OUTPUT 0      // outputs and (last segment) the final state
#define MODE_TRANSITION 1  // no outputs; D (zero entry, U) or M (identity entry, no U)

template <int KP, int MODE>
__device__ void state_impl(const PrefillParams& p) {
    constexpr int WARPS = KP / 16;
    constexpr int NT = 32 / WARPS;  // n8 tiles per warp in the 64 x 64 products
    constexpr int LDK = KP + PF_PAD;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    ChunkGates& gates = *(ChunkGates*)smem_raw;
    unsigned short* queries = (unsigned short*)(smem_raw + PF_GATES_BYTES);  // [64][LDK]
    unsigned short* keys = queries + PF_CHUNK * LDK;                            // [64][LDK]
    unsigned short* w_s = keys + PF_CHUNK * LDK;                                // [64][LDK]
    unsigned short* keys_t = w_s + PF_CHUNK * LDK;                              // [KP][LDC]
    unsigned short* state_t = keys_t + KP * PF_LDC;                             // [64][LDK]
    unsigned short* new_values_t = state_t + PF_TILE * LDK;                     // [64][LDC]
    unsigned short* decayed_values_t = new_values_t + PF_TILE * PF_LDC;         // [64][LDC]
    unsigned short* scores = decayed_values_t + PF_TILE * PF_LDC;               // [64][LDC]

    const int segment = blockIdx.x, head = blockIdx.y, tile = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int* seg = (const int*)p.segments + SEG_FIELDS * segment;
    const int seq = seg[SEG_SEQ], first_chunk = seg[SEG_FIRST_CHUNK], chunks = seg[SEG_CHUNKS];
    const int seg_index = seg[SEG_INDEX], seg_count = seg[SEG_COUNT];
    const int key_head = head / (p.value_heads / p.key_heads);
    const int tiles_v = p.value_pad / PF_TILE;
    if (MODE == MODE_TRANSITION && seg_index == seg_count - 1) return;  // nothing needs it
    // Columns of this block: value columns, or (transition mode, tile >= tiles_v) columns of
    // the K x K map M.
    const bool m_cols = MODE == MODE_TRANSITION && tile >= tiles_v;
    const int col0 = (m_cols ? tile - tiles_v : tile) * PF_TILE;
    const long long state_row =
        p.state_rows ? ((const long long*)p.state_rows)[seq] : (long long)seq;

    // Entry state into registers: rows 16 warp + lane/4 (+8), columns 8n + 2(lane%4) (+1).
    float state[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            int r = 16 * warp + (lane >> 2) + 8 * (e >> 1);
            int c = col0 + 8 * n + 2 * (lane & 3) + (e & 1);
            float x = 0.0f;
            if (MODE == MODE_TRANSITION) {
                x = (m_cols && r == c) ? 1.0f : 0.0f;
            } else if (p.use_segment_states) {
                x = ((const float*)p.segment_states)
                    [(((long long)segment * p.value_heads + head) * KP + r) * p.value_pad + c];
            } else if (p.initial_state && r < p.key_dim && c < p.value_dim) {
                x = ((const float*)p.initial_state)
                    [((state_row * p.value_heads + head) * p.key_dim + r) * p.value_dim + c];
            }
            state[n][e] = x;
        }
    }

    for (int ci = 0; ci < chunks; ++ci) {
        const int chunk = first_chunk + ci;
        const long long first_row = ((const long long*)p.chunk_first_row)[chunk];
        const int len = ((const int*)p.chunk_len)[chunk];
        // Stage 1: the chunk's inputs and the entry state as bf16 (transposed) in shared memory.
        if (MODE == MODE_OUTPUT) {
            load_rows<KP>(queries, LDK, nullptr, 0, (const void*)p.q, p.act_dtype, first_row, len,
                          p.key_heads, key_head, p.key_dim, p.l2norm != 0, WARPS);
        }
        load_rows<KP>(keys, LDK, keys_t, PF_LDC, (const void*)p.k, p.act_dtype, first_row, len,
                      p.key_heads, key_head, p.key_dim, p.l2norm != 0, WARPS);
        {
            const uint4* src = (const uint4*)((const unsigned short*)p.w +
                                              ((long long)chunk * p.value_heads + head) * PF_CHUNK * KP);
            constexpr int PER_ROW = KP / 8;  // uint4 per row
            for (int idx = threadIdx.x; idx < PF_CHUNK * PER_ROW; idx += blockDim.x) {
                int r = idx / PER_ROW, c = idx % PER_ROW;
                *(uint4*)(w_s + r * LDK + 8 * c) = src[idx];
            }
        }
#pragma unroll
        for (int n = 0; n < 8; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                int r = 16 * warp + (lane >> 2) + 8 * (e >> 1);
                int c = 8 * n + 2 * (lane & 3) + (e & 1);
                state_t[c * LDK + r] = f32_to_bf16(state[n][e]);
            }
        }
        load_chunk_gates(gates, p, first_row, len, head, false);  // ends with a barrier

        // Stage 2: V' = U - W S (and its end-decayed copy), the scores, O = diag(d) Q S.
        const int row_tile = 16 * (warp & 3);
        const int n_first = (warp >> 2) * NT;
        float out[NT][4];
        {
            float x[NT][4];
#pragma unroll
            for (int n = 0; n < NT; ++n) x[n][0] = x[n][1] = x[n][2] = x[n][3] = 0.0f;
#pragma unroll
            for (int k0 = 0; k0 < KP; k0 += 16) {
                unsigned a[4];
                frag_a(a, w_s, LDK, row_tile, k0, lane);
#pragma unroll
                for (int n = 0; n < NT; ++n) {
                    unsigned b[2];
                    frag_b(b, state_t, LDK, k0, 8 * (n_first + n), lane);
                    mma_bf16_16816(x[n], a, b);
                }
            }
            const unsigned short* u_src =
                (const unsigned short*)p.u + ((long long)chunk * p.value_heads + head) * PF_CHUNK * p.value_pad;
#pragma unroll
            for (int n = 0; n < NT; ++n) {
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    int r = row_tile + (lane >> 2) + 8 * half;
                    int c = 8 * (n_first + n) + 2 * (lane & 3);
                    float u0 = 0.0f, u1 = 0.0f;
                    if (!m_cols) {
                        unsigned bits = *(const unsigned*)(u_src + (long long)r * p.value_pad + col0 + c);
                        u0 = bf16_to_f32((unsigned short)(bits & 0xffffu));
                        u1 = bf16_to_f32((unsigned short)(bits >> 16));
                    }
                    float v0 = u0 - x[n][2 * half], v1 = u1 - x[n][2 * half + 1];
                    if (MODE == MODE_OUTPUT) {
                        new_values_t[c * PF_LDC + r] = f32_to_bf16(v0);
                        new_values_t[(c + 1) * PF_LDC + r] = f32_to_bf16(v1);
                    }
                    float e = gates.end_decay[r];
                    decayed_values_t[c * PF_LDC + r] = f32_to_bf16(v0 * e);
                    decayed_values_t[(c + 1) * PF_LDC + r] = f32_to_bf16(v1 * e);
                }
            }
        }
        if (MODE == MODE_OUTPUT) {
            float sc[NT][4];
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
                out[n][0] = out[n][1] = out[n][2] = out[n][3] = 0.0f;
            }
#pragma unroll
            for (int k0 = 0; k0 < KP; k0 += 16) {
                unsigned a[4];
                frag_a(a, queries, LDK, row_tile, k0, lane);
#pragma unroll
                for (int n = 0; n < NT; ++n) {
                    unsigned b[2];
                    frag_b(b, keys, LDK, k0, 8 * (n_first + n), lane);
                    mma_bf16_16816(sc[n], a, b);
                    frag_b(b, state_t, LDK, k0, 8 * (n_first + n), lane);
                    mma_bf16_16816(out[n], a, b);
                }
            }
#pragma unroll
            for (int n = 0; n < NT; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    int i = row_tile + (lane >> 2) + 8 * (e >> 1);
                    int j = 8 * (n_first + n) + 2 * (lane & 3) + (e & 1);
                    scores[i * PF_LDC + j] = f32_to_bf16(sc[n][e] * pair_decay(gates, i, j));
                    out[n][e] *= gates.start_decay[i];
                }
            }
        }
        __syncthreads();

        // Stage 3: O += scores V' (then stored), S <- exp(G_last) S + K^T diag(e) V'.
        if (MODE == MODE_OUTPUT) {
#pragma unroll
            for (int k0 = 0; k0 < PF_CHUNK; k0 += 16) {
                unsigned a[4];
                frag_a(a, scores, PF_LDC, row_tile, k0, lane);
#pragma unroll
                for (int n = 0; n < NT; ++n) {
                    unsigned b[2];
                    frag_b(b, new_values_t, PF_LDC, k0, 8 * (n_first + n), lane);
                    mma_bf16_16816(out[n], a, b);
                }
            }
#pragma unroll
            for (int n = 0; n < NT; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    int i = row_tile + (lane >> 2) + 8 * (e >> 1);
                    int c = col0 + 8 * (n_first + n) + 2 * (lane & 3) + (e & 1);
                    if (i < len && c < p.value_dim) {
                        store_float((void*)p.o,
                                    ((first_row + i) * p.value_heads + head) * (long long)p.value_dim + c,
                                    p.out_dtype, out[n][e] * p.scale);
                    }
                }
            }
        }
        {
            const float decay = gates.state_decay;
#pragma unroll
            for (int n = 0; n < 8; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) state[n][e] *= decay;
            }
#pragma unroll
            for (int k0 = 0; k0 < PF_CHUNK; k0 += 16) {
                unsigned a[4];
                frag_a(a, keys_t, PF_LDC, 16 * warp, k0, lane);
#pragma unroll
                for (int n = 0; n < 8; ++n) {
                    unsigned b[2];
                    frag_b(b, decayed_values_t, PF_LDC, k0, 8 * n, lane);
                    mma_bf16_16816(state[n], a, b);
                }
            }
        }
        __syncthreads();
    }

    // End state.
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            int r = 16 * warp + (lane >> 2) + 8 * (e >> 1);
            int c = col0 + 8 * n + 2 * (lane & 3) + (e & 1);
            if (MODE == MODE_TRANSITION) {
                if (m_cols) {
                    ((float*)p.transition_m)
                        [(((long long)segment * p.value_heads + head) * KP + r) * KP + c] = state[n][e];
                } else {
                    ((float*)p.transition_d)
                        [(((long long)segment * p.value_heads + head) * KP + r) * p.value_pad + c] = state[n][e];
                }
            } else if (p.final_state && seg_index == seg_count - 1 && r < p.key_dim &&
                       c < p.value_dim) {
                ((float*)p.final_state)
                    [((state_row * p.value_heads + head) * p.key_dim + r) * p.value_dim + c] = state[n][e];
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Combine: the entry state of every segment of one sequence, for one head and 16 columns:
// S_0 = the initial state (or 0), S_{s+1} = M_s S_s + D_s. 256 threads; M is read through
// shared memory 16 columns at a time.

#define COMBINE_COLS 16
#define COMBINE_M_COLS 16

template <int KP>
__device__ void combine_impl(const PrefillParams& p) {
    constexpr int ROWS_PER_PASS = 256 / COMBINE_COLS;  // each thread: one column, KP/16 rows
    constexpr int ROWS_PER_THREAD = KP / ROWS_PER_PASS;
    __shared__ float entry[KP][COMBINE_COLS];
    __shared__ float m_block[KP][COMBINE_M_COLS + 1];
    const int seq = blockIdx.x, head = blockIdx.y, col0 = blockIdx.z * COMBINE_COLS;
    const int col = threadIdx.x % COMBINE_COLS, row_group = threadIdx.x / COMBINE_COLS;
    const int first = ((const int*)p.seq_first_segment)[seq];
    const int count = ((const int*)p.seq_first_segment)[seq + 1] - first;
    const long long state_row =
        p.state_rows ? ((const long long*)p.state_rows)[seq] : (long long)seq;
    float* seg_states = (float*)p.segment_states;

    for (int i = 0; i < ROWS_PER_THREAD; ++i) {
        int r = row_group + ROWS_PER_PASS * i, c = col0 + col;
        float x = 0.0f;
        if (p.initial_state && r < p.key_dim && c < p.value_dim) {
            x = ((const float*)p.initial_state)
                [((state_row * p.value_heads + head) * p.key_dim + r) * p.value_dim + c];
        }
        entry[r][col] = x;
        seg_states[(((long long)first * p.value_heads + head) * KP + r) * p.value_pad + c] = x;
    }
    __syncthreads();
    for (int s = 0; s + 1 < count; ++s) {
        const long long seg_head = (long long)(first + s) * p.value_heads + head;
        const float* m = (const float*)p.transition_m + seg_head * KP * KP;
        const float* d = (const float*)p.transition_d + seg_head * KP * p.value_pad;
        float acc[ROWS_PER_THREAD];
        for (int i = 0; i < ROWS_PER_THREAD; ++i) acc[i] = 0.0f;
        for (int m0 = 0; m0 < KP; m0 += COMBINE_M_COLS) {
            for (int idx = threadIdx.x; idx < KP * COMBINE_M_COLS; idx += blockDim.x) {
                int r = idx / COMBINE_M_COLS, mm = idx % COMBINE_M_COLS;
                m_block[r][mm] = m[(long long)r * KP + m0 + mm];
            }
            __syncthreads();
            for (int i = 0; i < ROWS_PER_THREAD; ++i) {
                int r = row_group + ROWS_PER_PASS * i;
                float a = acc[i];
#pragma unroll
                for (int mm = 0; mm < COMBINE_M_COLS; ++mm) a += m_block[r][mm] * entry[m0 + mm][col];
                acc[i] = a;
            }
            __syncthreads();
        }
        for (int i = 0; i < ROWS_PER_THREAD; ++i) {
            int r = row_group + ROWS_PER_PASS * i, c = col0 + col;
            float x = acc[i] + d[(long long)r * p.value_pad + c];
            entry[r][col] = x;
            seg_states[((seg_head + p.value_heads) * KP + r) * p.value_pad + c] = x;
        }
        __syncthreads();
    }
}

#define PF_ENTRY_POINTS(KP, VP)                                                               \
    extern "C" __global__ void __launch_bounds__(128)                                        \
        gdn_prefill_prepare_k##KP##_v##VP(PrefillParams p) {                                  \
        prepare_impl<KP, VP>(p);                                                              \
    }

PF_ENTRY_POINTS(64, 64)
PF_ENTRY_POINTS(64, 128)
PF_ENTRY_POINTS(64, 256)
PF_ENTRY_POINTS(128, 64)
PF_ENTRY_POINTS(128, 128)
PF_ENTRY_POINTS(128, 256)
PF_ENTRY_POINTS(256, 64)
PF_ENTRY_POINTS(256, 128)
PF_ENTRY_POINTS(256, 256)

#define PF_STATE_ENTRY_POINTS(KP)                                                             \
    extern "C" __global__ void __launch_bounds__(KP * 2)                                     \
        gdn_prefill_state_k##KP(PrefillParams p) {                                            \
        state_impl<KP, MODE_OUTPUT>(p);                                                       \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(KP * 2)                                     \
        gdn_prefill_transition_k##KP(PrefillParams p) {                                       \
        state_impl<KP, MODE_TRANSITION>(p);                                                   \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(256) gdn_prefill_combine_k##KP(PrefillParams p) { \
        combine_impl<KP>(p);                                                                  \
    }

PF_STATE_ENTRY_POINTS(64)
PF_STATE_ENTRY_POINTS(128)
PF_STATE_ENTRY_POINTS(256)

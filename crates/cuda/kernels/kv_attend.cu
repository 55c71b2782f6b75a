// Flash-decoding over the paged compressed KV cache, reading the packed codes (never a
// dequantised copy). Layout: deltakv_contract::kv::paged; math: deltakv_contract::kv.
//
//   pass 1, one block per (split, KV head x row chunk, sequence): the block's rows are
//     ROWS query rows sharing the KV head (a GQA group, times Tq for the causal-chunk form);
//     q' = Pi (scale q) is made once in shared memory. Tiles of TILE tokens (one page or a
//     part of one) stream into shared memory through cp.async, STAGES tiles ahead. Per tile:
//       scores  s_rt = norm_k[t] <q'_r, c(idx_k[t])>   (-inf past the row's causal limit,
//               applied in the softmax step)
//       softmax m_r = max(m_r, max_t s_rt), p_rt = e^(s_rt - m_r), l_r = l_r e^(dm) + sum p
//       values  a_r = a_r e^(dm) + sum_t p_rt norm_v[t] c(idx_v[t])
//     A token is decoded once for all rows: LPT lanes share a token, lane j owning C
//     consecutive dimensions (q'_r of those in registers, their accumulators too); the codes
//     of a lane are C * bits consecutive bits, extracted with compile-time shifts.
//     Output per (row, split): (m, l) and a (d_pad floats).
//   pass 2, one block per (sequence, query, head): m = max m_s, l = sum l_s e^(m_s - m),
//     o' = sum a_s e^(m_s - m) / l, then o = Pi^T o'.
//
// d_pad is d rounded up to a power of two (64, 128, 256); q' is zero past d, so the codes
// read past a vector's d codes (junk within the row or the page) never count.

#define KV_THREADS 128
#define KV_WARPS 4
#define KV_FULLMASK 0xffffffffu
#define KV_NEG_INF __int_as_float(0xff800000)

struct KvAttnParams {
    const void* q;             // [B, Tq, Hq, d]
    const unsigned* pool;
    const int* block_table;    // [B, max_pages]
    const int* seq_lens;       // [B]
    const float* consts;       // levels K at 0, V at 512, rotation at 1024 (see kv_encode.cu)
    float* part_ml;            // [B * Tq * Hq, splits, 2]
    float* part_acc;           // [B * Tq * Hq, splits, d_pad]
    float* o;                  // [B, Tq, Hq, d] f32
    int batch, tq, hq, kv_heads, dim, dim_pad, group, rows, row_chunks, q_dtype;
    int bits_k, bits_v, norm_f16, hadamard;
    int page_tokens, max_pages, page_words, head_words, row_words_k, row_words_v, norm_words;
    int splits, tile, stages, stage_words, lanes_per_token;
    float scale, hadamard_norm;
    float level_scale_k, level_scale_v;  // powers of two for the f16 level tables (mma kernels)
    int ml_log2;                         // part_ml's m in base 2 (mma kernels) or base e
};

// Norm `t` of a staged norm section.
__device__ __forceinline__ float kv_norm_at(const unsigned* section, int t, int f16) {
    return f16 ? f16_to_f32(((const unsigned short*)section)[t]) : __uint_as_float(section[t]);
}

// The byte offsets (code * 4) into a level table of the C codes of B bits starting at code
// `first` (a multiple of 8) of a row. 2- and 4-bit codes are spread into the bytes of a few
// words by a shift and a mask each, then every offset is one byte permute (`prmt`): about 1.5
// instructions per code, the address computation included.
template <int B, int C>
__device__ __forceinline__ void kv_offsets(const unsigned* row, int first, unsigned (&off)[C]) {
    constexpr int NW = (C * B + 31) / 32;
    const int byte0 = first * B / 8;
    const unsigned* src = row + (byte0 >> 2);
    const int shift = (byte0 & 3) * 8;
    unsigned w[NW + 1];
#pragma unroll
    for (int k = 0; k <= NW; ++k) w[k] = src[k];
    unsigned x[NW + 1];
#pragma unroll
    for (int k = 0; k < NW; ++k) x[k] = __funnelshift_r(w[k], w[k + 1], shift);
    x[NW] = 0u;
    if (B == 4) {
        // Word k holds codes 8k .. 8k+7; byte m of lo (hi) is code 8k + 2m (+ 1) times 4.
#pragma unroll
        for (int k = 0; k < NW; ++k) {
            const unsigned lo = (x[k] << 2) & 0x3C3C3C3Cu, hi = (x[k] >> 2) & 0x3C3C3C3Cu;
#pragma unroll
            for (int m = 0; m < 4; ++m) {
                if (8 * k + 2 * m < C) off[8 * k + 2 * m] = __byte_perm(lo, 0u, 0x4440 + m);
                if (8 * k + 2 * m + 1 < C) off[8 * k + 2 * m + 1] = __byte_perm(hi, 0u, 0x4440 + m);
            }
        }
    } else if (B == 2) {
        // Byte m of t[r] is code 4m + r times 4.
        const unsigned t[4] = {(x[0] << 2) & 0x0C0C0C0Cu, x[0] & 0x0C0C0C0Cu,
                               (x[0] >> 2) & 0x0C0C0C0Cu, (x[0] >> 4) & 0x0C0C0C0Cu};
#pragma unroll
        for (int m = 0; m < 4; ++m) {
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                if (4 * m + r < C) off[4 * m + r] = __byte_perm(t[r], 0u, 0x4440 + m);
            }
        }
    } else {
#pragma unroll
        for (int c = 0; c < C; ++c) {
            constexpr unsigned mask = (1u << B) - 1u;
            const int pos = c * B, k = pos / 32, s = pos % 32;
            unsigned v = x[k] >> s;
            if (s + B > 32) v |= x[k + 1] << (32 - s);
            off[c] = (v & mask) << 2;
        }
    }
}

// The level at byte offset `off` of a table.
__device__ __forceinline__ float kv_level(const float* table, unsigned off) {
    return *(const float*)((const char*)table + off);
}

// Shared-memory carving of pass 1 (all offsets in floats, multiples of 4).
struct KvSmem {
    float* q;        // [ROWS][dim_pad], q' rows
    float* qin;      // [ROWS][dim_pad], scaled q before the rotation
    float* lk;       // [256] key levels
    float* lv;       // [256] value levels
    float* s;        // [ROWS][TILE] scores
    float* w;        // [TILE][ROWS] weights p * norm_v
    float* m;        // [ROWS] running max
    float* l;        // [ROWS] running sum
    float* alpha;    // [ROWS] this tile's rescale
    unsigned* ring;  // stages x stage_words
};

template <int ROWS>
__device__ __forceinline__ KvSmem kv_carve(const KvAttnParams& p, float* base) {
    KvSmem sm;
    float* at = base;
    sm.q = at; at += ROWS * p.dim_pad;
    sm.qin = at; at += ROWS * p.dim_pad;
    sm.lk = at; at += 256;
    sm.lv = at; at += 256;
    sm.s = at; at += ROWS * p.tile;
    sm.w = at; at += ROWS * p.tile;
    sm.m = at; at += ROWS < 4 ? 4 : ROWS;
    sm.l = at; at += ROWS < 4 ? 4 : ROWS;
    sm.alpha = at; at += ROWS < 4 ? 4 : ROWS;
    sm.ring = (unsigned*)at;
    return sm;
}

// Queues the copy of tile `tile` (global tile index of the sequence) into ring stage `stage`.
__device__ __forceinline__ void kv_load_tile(const KvAttnParams& p, const unsigned* head_base0,
                                             const int* table_row, int tile, unsigned* stage) {
    const int first = tile * p.tile;
    const long long page = table_row[first / p.page_tokens];
    const int off = first % p.page_tokens;
    const unsigned* head = p.pool + page * p.page_words + (head_base0 - p.pool);
    const int kcodes = p.page_tokens * p.row_words_k, vcodes = p.page_tokens * p.row_words_v;
    const int nk = p.tile * p.row_words_k / 4, nv = p.tile * p.row_words_v / 4;
    const int norm_chunks = p.norm_f16 ? p.tile * 2 / 16 : p.tile * 4 / 16;
    const int norm_off = p.norm_f16 ? off / 2 : off;
    const unsigned* src_k = head + (long long)off * p.row_words_k;
    const unsigned* src_v = head + kcodes + (long long)off * p.row_words_v;
    const unsigned* src_kn = head + kcodes + vcodes + norm_off;
    const unsigned* src_vn = head + kcodes + vcodes + p.norm_words + norm_off;
    unsigned* dst_v = stage + 4 * nk;
    unsigned* dst_kn = dst_v + 4 * nv;
    unsigned* dst_vn = dst_kn + 4 * norm_chunks;
    for (int i = threadIdx.x; i < nk; i += KV_THREADS) cp_async16(stage + 4 * i, src_k + 4 * i);
    for (int i = threadIdx.x; i < nv; i += KV_THREADS) cp_async16(dst_v + 4 * i, src_v + 4 * i);
    for (int i = threadIdx.x; i < norm_chunks; i += KV_THREADS) {
        cp_async16(dst_kn + 4 * i, src_kn + 4 * i);
        cp_async16(dst_vn + 4 * i, src_vn + 4 * i);
    }
}

// Scores of one staged tile for this thread's tokens, unmasked (the softmax applies the causal
// limits). The LPT lanes of a token sum their partial dots by a reduce-scatter: each halving
// step keeps half the rows (lanes with the step's bit set keep the upper half) and adds the
// partner's copy of them, so after log2(ROWS) steps a lane holds one row summed over
// 2^log2(ROWS) lanes, and plain butterflies finish the sum (LPT >= ROWS always).
template <int B, int ROWS, int C>
__device__ __forceinline__ void kv_scores(const KvAttnParams& p, const KvSmem& sm,
                                          const unsigned* stage, const float (&q)[ROWS][C],
                                          int group_index, int groups, int j) {
    const unsigned* kn = stage + p.tile * (p.row_words_k + p.row_words_v);
    for (int tl = group_index; tl < p.tile; tl += groups) {
        unsigned code[C];
        kv_offsets<B, C>(stage + tl * p.row_words_k, j * C, code);
        float dot[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) dot[r] = 0.0f;
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const float level = kv_level(sm.lk, code[c]);
#pragma unroll
            for (int r = 0; r < ROWS; ++r) dot[r] = fmaf(q[r][c], level, dot[r]);
        }
        int off = p.lanes_per_token >> 1, row = 0;
#pragma unroll
        for (int half = ROWS / 2; half >= 1; half /= 2) {
            const bool upper = (j & off) != 0;
#pragma unroll
            for (int i = 0; i < half; ++i) {
                const float send = upper ? dot[i] : dot[i + half];
                const float keep = upper ? dot[i + half] : dot[i];
                dot[i] = keep + __shfl_xor_sync(KV_FULLMASK, send, off);
            }
            row += upper ? half : 0;
            off >>= 1;
        }
        // Lanes j .. j + same - 1 (same = LPT / ROWS) now share one row; the first writes it.
        const int same = p.lanes_per_token / ROWS;
        for (; off > 0; off >>= 1) dot[0] += __shfl_xor_sync(KV_FULLMASK, dot[0], off);
        if (j % same == 0) sm.s[row * p.tile + tl] = dot[0] * kv_norm_at(kn, tl, p.norm_f16);
    }
}

// Values of one staged tile into this thread's accumulators.
template <int B, int ROWS, int C>
__device__ __forceinline__ void kv_values(const KvAttnParams& p, const KvSmem& sm,
                                          const unsigned* stage, float (&acc)[ROWS][C],
                                          int group_index, int groups, int j) {
    const unsigned* vrows = stage + p.tile * p.row_words_k;
    for (int tl = group_index; tl < p.tile; tl += groups) {
        unsigned code[C];
        kv_offsets<B, C>(vrows + tl * p.row_words_v, j * C, code);
        float w[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) w[r] = sm.w[tl * ROWS + r];
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const float level = kv_level(sm.lv, code[c]);
#pragma unroll
            for (int r = 0; r < ROWS; ++r) acc[r][c] = fmaf(w[r], level, acc[r][c]);
        }
    }
}

// q' = Pi (scale q) for the block's rows, in shared memory (zero past d).
template <int ROWS>
__device__ __forceinline__ void kv_rotate_queries(const KvAttnParams& p, const KvSmem& sm,
                                                  int b, int h, int chunk) {
    const int d = p.dim, dp = p.dim_pad;
    const float* rot = p.consts + 1024;
    for (int idx = threadIdx.x; idx < ROWS * dp; idx += KV_THREADS) {
        const int r = idx / dp, c = idx % dp, row = chunk * ROWS + r;
        float x = 0.0f;
        if (row < p.rows && c < d) {
            const int i = row / p.group, g = row % p.group;
            const long long at = (((long long)b * p.tq + i) * p.hq + h * p.group + g) * d + c;
            x = load_float(p.q, at, p.q_dtype) * p.scale;
            if (p.hadamard) x *= rot[c];
        }
        sm.qin[idx] = x;
    }
    __syncthreads();
    if (p.hadamard) {
        for (int hb = 1; hb < d; hb <<= 1) {
            for (int idx = threadIdx.x; idx < ROWS * d / 2; idx += KV_THREADS) {
                const int r = idx / (d / 2), k = idx % (d / 2);
                const int i = (k / hb) * 2 * hb + k % hb;
                float* x = sm.qin + r * dp;
                const float a = x[i], c = x[i + hb];
                x[i] = a + c;
                x[i + hb] = a - c;
            }
            __syncthreads();
        }
        for (int idx = threadIdx.x; idx < ROWS * dp; idx += KV_THREADS)
            sm.q[idx] = sm.qin[idx] * p.hadamard_norm;
    } else {
        // y_i = sum_c M[i][c] x_c, with the transposed matrix [c][i] for coalesced reads.
        for (int idx = threadIdx.x; idx < ROWS * dp; idx += KV_THREADS) {
            const int r = idx / dp, i = idx % dp;
            float y = 0.0f;
            if (i < d) {
                for (int c = 0; c < d; ++c) y = fmaf(rot[(long long)c * d + i], sm.qin[r * dp + c], y);
            }
            sm.q[idx] = y;
        }
    }
    __syncthreads();
}

template <int ROWS, int C>
__device__ __forceinline__ void kv_attend_pass1(const KvAttnParams& p) {
    extern __shared__ __align__(16) float kv_smem[];
    const KvSmem sm = kv_carve<ROWS>(p, kv_smem);
    const int split = blockIdx.x, h = blockIdx.y / p.row_chunks, chunk = blockIdx.y % p.row_chunks;
    const int b = blockIdx.z;
    for (int i = threadIdx.x; i < 256; i += KV_THREADS) {
        sm.lk[i] = p.consts[i];
        sm.lv[i] = p.consts[512 + i];
    }
    if (threadIdx.x < ROWS) {
        sm.m[threadIdx.x] = KV_NEG_INF;
        sm.l[threadIdx.x] = 0.0f;
    }
    kv_rotate_queries<ROWS>(p, sm, b, h, chunk);
    const int len = p.seq_lens[b];
    int limit[ROWS];
    int reach = 0;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const int row = chunk * ROWS + r;
        limit[r] = row < p.rows ? len - p.tq + row / p.group + 1 : 0;
        reach = max(reach, limit[r]);
    }
    const int lpt = p.lanes_per_token, groups = KV_THREADS / lpt;
    const int group_index = threadIdx.x / lpt, j = threadIdx.x % lpt;
    float q[ROWS][C];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
        for (int c = 0; c < C; ++c) q[r][c] = sm.q[r * p.dim_pad + j * C + c];
    }
    float acc[ROWS][C];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
        for (int c = 0; c < C; ++c) acc[r][c] = 0.0f;
    }
    // This split's tiles.
    const int tiles = (reach + p.tile - 1) / p.tile;
    const int all_tiles = (len + p.tile - 1) / p.tile;
    const int per_split = (all_tiles + p.splits - 1) / p.splits;
    const int tile0 = split * per_split, tile1 = min(tile0 + per_split, tiles);
    const int* table_row = p.block_table + (long long)b * p.max_pages;
    const unsigned* head0 = p.pool + (long long)h * p.head_words;
    for (int s = 0; s < p.stages - 1; ++s) {
        if (tile0 + s < tile1) kv_load_tile(p, head0, table_row, tile0 + s, sm.ring + s * p.stage_words);
        cp_async_commit();
    }
    for (int t = tile0; t < tile1; ++t) {
        const int ahead = t + p.stages - 1;
        if (ahead < tile1)
            kv_load_tile(p, head0, table_row, ahead, sm.ring + ((ahead - tile0) % p.stages) * p.stage_words);
        cp_async_commit();
        // Every group but the newest stages - 1 has landed: tile t is here.
        if (p.stages == 4) cp_async_wait<3>();
        else if (p.stages == 3) cp_async_wait<2>();
        else cp_async_wait<1>();
        __syncthreads();
        const unsigned* stage = sm.ring + ((t - tile0) % p.stages) * p.stage_words;
        switch (p.bits_k) {
            case 2: kv_scores<2, ROWS, C>(p, sm, stage, q, group_index, groups, j); break;
            case 3: kv_scores<3, ROWS, C>(p, sm, stage, q, group_index, groups, j); break;
            case 4: kv_scores<4, ROWS, C>(p, sm, stage, q, group_index, groups, j); break;
            default: kv_scores<8, ROWS, C>(p, sm, stage, q, group_index, groups, j); break;
        }
        __syncthreads();
        // Online softmax, one warp per row.
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        const unsigned* vn = stage + p.tile * (p.row_words_k + p.row_words_v) +
                             (p.norm_f16 ? p.tile * 2 / 4 : p.tile);
        for (int r = warp; r < ROWS; r += KV_WARPS) {
            // Row r sees tokens below its causal limit (none for a padding row).
            const int row = chunk * ROWS + r, t0 = t * p.tile;
            const int lim = row < p.rows ? len - p.tq + row / p.group + 1 : 0;
            const float s0 = lane < p.tile && t0 + lane < lim ? sm.s[r * p.tile + lane] : KV_NEG_INF;
            const float s1 =
                lane + 32 < p.tile && t0 + lane + 32 < lim ? sm.s[r * p.tile + lane + 32] : KV_NEG_INF;
            float mt = fmaxf(s0, s1);
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) mt = fmaxf(mt, __shfl_xor_sync(KV_FULLMASK, mt, off));
            const float m_old = sm.m[r], m_new = fmaxf(m_old, mt);
            const float p0 = s0 == KV_NEG_INF ? 0.0f : expf(s0 - m_new);
            const float p1 = s1 == KV_NEG_INF ? 0.0f : expf(s1 - m_new);
            if (lane < p.tile) sm.w[lane * ROWS + r] = p0 == 0.0f ? 0.0f : p0 * kv_norm_at(vn, lane, p.norm_f16);
            if (lane + 32 < p.tile)
                sm.w[(lane + 32) * ROWS + r] = p1 == 0.0f ? 0.0f : p1 * kv_norm_at(vn, lane + 32, p.norm_f16);
            const float sum = warp_sum(p0 + p1);
            const float alpha = m_old == KV_NEG_INF ? 0.0f : expf(m_old - m_new);
            __syncwarp();
            if (lane == 0) {
                sm.l[r] = sm.l[r] * alpha + sum;
                sm.m[r] = m_new;
                sm.alpha[r] = alpha;
            }
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const float alpha = sm.alpha[r];
            if (alpha != 1.0f) {
#pragma unroll
                for (int c = 0; c < C; ++c) acc[r][c] *= alpha;
            }
        }
        switch (p.bits_v) {
            case 2: kv_values<2, ROWS, C>(p, sm, stage, acc, group_index, groups, j); break;
            case 3: kv_values<3, ROWS, C>(p, sm, stage, acc, group_index, groups, j); break;
            case 4: kv_values<4, ROWS, C>(p, sm, stage, acc, group_index, groups, j); break;
            default: kv_values<8, ROWS, C>(p, sm, stage, acc, group_index, groups, j); break;
        }
        __syncthreads();
    }
    cp_async_wait<0>();
    __syncthreads();
    // Sum the token groups: within a warp by shuffles, then the warps in a fixed order.
    for (int off = lpt; off < 32; off <<= 1) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
#pragma unroll
            for (int c = 0; c < C; ++c) acc[r][c] += __shfl_xor_sync(KV_FULLMASK, acc[r][c], off);
        }
    }
    float* red = (float*)sm.ring;  // [KV_WARPS][ROWS][dim_pad]
    const int warp = threadIdx.x >> 5;
    if ((threadIdx.x & 31) < lpt) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
#pragma unroll
            for (int c = 0; c < C; ++c) red[(warp * ROWS + r) * p.dim_pad + j * C + c] = acc[r][c];
        }
    }
    __syncthreads();
    // With lpt = 32 (one token per warp) and more than one group per block, each warp's lanes
    // are one group; with lpt < 32 a warp holds several, already summed above.
    for (int idx = threadIdx.x; idx < ROWS * p.dim_pad; idx += KV_THREADS) {
        const int r = idx / p.dim_pad, c = idx % p.dim_pad, row = chunk * ROWS + r;
        if (row >= p.rows) continue;
        float sum = 0.0f;
        for (int w = 0; w < KV_WARPS; ++w) sum += red[(w * ROWS + r) * p.dim_pad + c];
        const int i = row / p.group, g = row % p.group;
        const long long out_row = ((long long)b * p.tq + i) * p.hq + h * p.group + g;
        const long long part = out_row * p.splits + split;
        p.part_acc[part * p.dim_pad + c] = sum;
        if (c == 0) {
            p.part_ml[2 * part] = sm.m[r];
            p.part_ml[2 * part + 1] = sm.l[r];
        }
    }
}

// The scalar pass 1 lives in the module without KVM_BK (the tensor-core modules define it).
#ifndef KVM_BK
extern "C" __global__ void __launch_bounds__(KV_THREADS, 3) kv_attend_rows4(KvAttnParams p) {
    kv_attend_pass1<4, 16>(p);
}
extern "C" __global__ void __launch_bounds__(KV_THREADS, 3) kv_attend_rows8(KvAttnParams p) {
    kv_attend_pass1<8, 8>(p);
}
#endif

// Pass 2: one block per output row (b, i, head) of up to KV_MERGE_GROUPS x dim_pad threads. The
// splits' weights e^(m_s - m) are formed once per row in shared memory (dynamic: `splits`
// floats, 0 for a split that saw no token); thread group g sums its dimension over the g-th
// run of splits in split order, eight splits' loads in flight at a time, and the groups' sums
// are added in group order: the row's merge is a few memory latencies, not one per split.
#define KV_MERGE_GROUPS 4
extern "C" __global__ void kv_attend_merge(KvAttnParams p) {
    __shared__ float y[256];
    __shared__ float group_a[KV_MERGE_GROUPS][256];
    __shared__ float group_l[KV_MERGE_GROUPS];
    __shared__ float warp_max[32];
    extern __shared__ float kv_merge_weight[];  // [splits]
    const long long row = blockIdx.x;
    const int threads = blockDim.x, d = p.dim, dp = p.dim_pad;
    const int c = threadIdx.x % dp, group = threadIdx.x / dp, groups = threads / dp;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float* ml = p.part_ml + row * p.splits * 2;
    // Launched as pass 1's programmatic dependent: nothing of pass 1 is read before it has
    // completed and its writes are visible (without that launch this returns at once).
    asm volatile("griddepcontrol.wait;" ::: "memory");
    float m = KV_NEG_INF;
    for (int s = threadIdx.x; s < p.splits; s += threads) m = fmaxf(m, ml[2 * s]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(KV_FULLMASK, m, o));
    if (lane == 0) warp_max[warp] = m;
    __syncthreads();
    m = warp_max[0];
    for (int w = 1; w < threads / 32; ++w) m = fmaxf(m, warp_max[w]);
    for (int s = threadIdx.x; s < p.splits; s += threads) {
        const float ms = ml[2 * s];
        kv_merge_weight[s] =
            ms == KV_NEG_INF ? 0.0f : (p.ml_log2 ? exp2f(ms - m) : expf(ms - m));
    }
    __syncthreads();
    // fmaf(x, 0, sum) leaves sum as it is, so an empty split (its l and a are 0) adds nothing.
    const float* acc = p.part_acc + row * p.splits * dp + c;
    const int s1 = p.splits * (group + 1) / groups;
    float l = 0.0f, a = 0.0f;
    int s = p.splits * group / groups;
    for (; s + 8 <= s1; s += 8) {
        float x[8], ls[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            x[k] = acc[(long long)(s + k) * dp];
            ls[k] = ml[2 * (s + k) + 1];
        }
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const float e = kv_merge_weight[s + k];
            l = fmaf(ls[k], e, l);
            a = fmaf(x[k], e, a);
        }
    }
    for (; s < s1; ++s) {
        const float e = kv_merge_weight[s];
        l = fmaf(ml[2 * s + 1], e, l);
        a = fmaf(acc[(long long)s * dp], e, a);
    }
    group_a[group][c] = a;
    if (c == 0) group_l[group] = l;
    __syncthreads();
    if (group == 0) {
        for (int g = 1; g < groups; ++g) {
            a += group_a[g][c];
            l += group_l[g];
        }
        y[c] = l > 0.0f ? a / l : 0.0f;
    }
    __syncthreads();
    const float* rot = p.consts + 1024;
    const bool mine_c = group == 0 && c < d;  // the threads that rotate and store
    float out = 0.0f;
    if (p.hadamard) {
        for (int hb = 1; hb < d; hb <<= 1) {
            float mine = 0.0f;
            if (mine_c) {
                const float other = y[c ^ hb];
                mine = (c & hb) ? other - y[c] : y[c] + other;
            }
            __syncthreads();
            if (mine_c) y[c] = mine;
            __syncthreads();
        }
        if (mine_c) out = y[c] * (rot[c] * p.hadamard_norm);
    } else if (mine_c) {
        // x_c = sum_i M[i][c] y_i (M row-major after its transpose in consts).
        const float* matrix = rot + (long long)d * d;
        for (int i = 0; i < d; ++i) out = fmaf(matrix[(long long)i * d + c], y[i], out);
    }
    if (mine_c) p.o[row * d + c] = out;
}

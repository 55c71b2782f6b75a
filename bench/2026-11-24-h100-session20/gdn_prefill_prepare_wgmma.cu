// GDN chunked prefill, the prepare kernel on Hopper's warpgroup instructions (sm_90a; the
// tensor-core module only, after gdn_prefill_prepare.cu, whose helpers it uses): the same
// results as prepare_impl (A, T = (I + A)^-1, W, U, the scores and the gates of one chunk and
// a group of value heads of one key head), with every bf16 product a wgmma whose operands both
// come from shared memory, so no operand fragment passes through registers or the load/store
// pipe.
//
// The bf16 operands (k, q, v and T's scaled halves) sit in the core-matrix layout
// (`cm_index`), which serves a 64-row matrix as a K-major operand (A of every product, B of
// K K^T: the k index along its columns) and as an MN-major one (B of W and U: the k index
// along its rows, the chunk's tokens) alike. The two warpgroups split the work: warpgroup 0
// forms K K^T and masks it into A (once per value head: recomputing it costs 8 wgmma, holding
// it would cost 32 registers through the inverse), warpgroup 1 forms Q K^T and writes every
// head's scores; the inverse runs on all eight warps (gdn_prefill_inverse.cu); then T's scaled
// halves for W and U are built in one pass, and the warpgroups take the 64-column tiles of W
// and U in turn.
//
// Shared memory (within the launcher's prepare_smem): heads_per_block ChunkGates records, k
// and v in the core-matrix layout, A [64][PF_LDF] (f32) and 816 floats, T [64][PF_LDF]. q takes
// the space after A until T is formed; W's halves (hi, lo) take A's space and U's take T's once
// T has been read.

#if defined(PF_PREPARE_MMA) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#ifndef PF_CM_MN_SWAP
#define PF_CM_MN_SWAP 0
#endif

// The wgmma descriptor of the operand at rows r0.., columns c0.. (multiples of 8) of a
// core-matrix-layout matrix: with the k index along the columns (K-major) the leading byte
// offset (the next core matrix along k) is a column block and the stride byte offset (along m
// or n) a core matrix; with k along the rows (MN-major, no swizzle) the same two strides
// swap roles.
template <bool K_ALONG_COLUMNS>
__device__ __forceinline__ unsigned long long cm_desc(const unsigned short* base, int r0, int c0) {
    const unsigned address = shared_address(base + cm_index(r0, c0));
    constexpr unsigned long long BLOCK = PF_CM_BLOCK * 2, CORE = 128;
    // PF_CM_MN_SWAP (tools/prefill-lab only) gives the MN-major operand the K-major roles.
    constexpr bool COLUMN_LEADING = K_ALONG_COLUMNS || PF_CM_MN_SWAP;
    constexpr unsigned long long LEADING = COLUMN_LEADING ? BLOCK : CORE;
    constexpr unsigned long long STRIDE = COLUMN_LEADING ? CORE : BLOCK;
    return (unsigned long long)((address & 0x3ffffu) >> 4) | ((LEADING >> 4) << 16) | ((STRIDE >> 4) << 32);
}

// d += A (64 x 16) B (16 x 8 NT), both from shared memory: TRANS_B 0 for a K-major B, 1 for an
// MN-major one. Issued by the four warps of a warpgroup together; d is valid only after the
// group holding it is waited for.
template <int TRANS_B>
__device__ __forceinline__ void wgmma_ss(float (&d)[4][4], unsigned long long desc_a, unsigned long long desc_b) {
    asm volatile(
        "{ .reg .pred p; setp.ne.b32 p, %19, 0; "
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, %18; }"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
          "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
        : "l"(desc_a), "l"(desc_b), "n"(TRANS_B), "r"(1)
        : "memory");
}
template <int TRANS_B>
__device__ __forceinline__ void wgmma_ss(float (&d)[8][4], unsigned long long desc_a, unsigned long long desc_b) {
    asm volatile(
        "{ .reg .pred p; setp.ne.b32 p, %35, 0; "
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
        "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, %34; }"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
          "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
          "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
          "+f"(d[7][2]), "+f"(d[7][3])
        : "l"(desc_a), "l"(desc_b), "n"(TRANS_B), "r"(1)
        : "memory");
}

// K K^T and (with_scores) Q K^T of the chunk's rows against k, columns 32 half .. 32 half + 31
// of both (the calling warpgroup's half), as one wgmma group: warp w of the warpgroup holds rows
// 16 w .. 16 w + 15 (d[n] the n8 tile n of the half).
template <int KP>
__device__ __forceinline__ void wg_grams(float (&kk)[4][4], float (&qk)[4][4], const unsigned short* keys,
                                         const unsigned short* queries, bool with_scores, int half) {
#pragma unroll
    for (int n = 0; n < 4; ++n) {
        kk[n][0] = kk[n][1] = kk[n][2] = kk[n][3] = 0.0f;
        qk[n][0] = qk[n][1] = qk[n][2] = qk[n][3] = 0.0f;
    }
    wg_fence(kk);
    wg_fence(qk);
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < KP / 16; ++s) wgmma_ss<0>(kk, cm_desc<true>(keys, 0, 16 * s), cm_desc<true>(keys, 32 * half, 16 * s));
    if (with_scores) {
#pragma unroll
        for (int s = 0; s < KP / 16; ++s) {
            wgmma_ss<0>(qk, cm_desc<true>(queries, 0, 16 * s), cm_desc<true>(keys, 32 * half, 16 * s));
        }
    }
    wgmma_commit();
    wgmma_wait_all();
    wg_fence(kk);
    wg_fence(qk);
}

// 64 rows of COLS bf16 (row r at src + r * row_stride; zeros from row `len`) into x in the
// core-matrix layout, by 16-byte asynchronous copies shared by the whole block.
template <int COLS>
__device__ __forceinline__ void copy_rows_cm_async(unsigned short* x, const unsigned short* src,
                                                   long long row_stride, int len) {
    constexpr int PIECES = COLS / 8;
    for (int idx = threadIdx.x; idx < PF_CHUNK * PIECES; idx += blockDim.x) {
        const int r = idx / PIECES, piece = idx % PIECES;
        const bool valid = r < len;
        cp_async16(x + cm_index(r, 8 * piece), src + (valid ? r : 0) * row_stride + 8 * piece, valid);
    }
}

// From the complete T (f32 [64][PF_LDF]): T diag(beta d) as bf16 hi + lo halves into w_hi,
// w_lo and T diag(beta) into u_hi, u_lo (core-matrix layout, 64 columns). u_hi and u_lo take
// T's own space, so every thread reads its 16 elements of T before the barrier inside. Warp w
// takes rows 8 w .. 8 w + 7, lane l row 8 w + l % 8 at columns 4 (l / 8) + 16 s (s < 4): each
// float4 load of T and each 8-byte store reaches the fewest wavefronts.
__device__ __forceinline__ void build_scaled_halves_cm(const float* t_mat, const ChunkGates& gates,
                                                       unsigned short* w_hi, unsigned short* w_lo,
                                                       unsigned short* u_hi, unsigned short* u_lo,
                                                       int warp, int lane) {
    const int i = 8 * warp + (lane & 7);
    float4 t[4];
#pragma unroll
    for (int s = 0; s < 4; ++s) t[s] = *(const float4*)(t_mat + i * PF_LDF + 4 * (lane >> 3) + 16 * s);
    __syncthreads();
#pragma unroll
    for (int s = 0; s < 4; ++s) {
        const int m = 4 * (lane >> 3) + 16 * s;
        const float4 b = *(const float4*)(gates.beta + m);
        const float4 d = *(const float4*)(gates.start_decay + m);
        const float u[4] = {t[s].x * b.x, t[s].y * b.y, t[s].z * b.z, t[s].w * b.w};
        const float w[4] = {u[0] * d.x, u[1] * d.y, u[2] * d.z, u[3] * d.w};
        const int at = cm_index(i, m);
        const float* halves[2] = {w, u};
        unsigned short* his[2] = {w_hi, u_hi};
        unsigned short* los[2] = {w_lo, u_lo};
#pragma unroll
        for (int which = 0; which < 2; ++which) {
            const float* x = halves[which];
            const unsigned hi0 = pack_bf16(x[0], x[1]), hi1 = pack_bf16(x[2], x[3]);
            const unsigned lo0 = pack_bf16(x[0] - bf16_to_f32((unsigned short)(hi0 & 0xffffu)),
                                           x[1] - bf16_to_f32((unsigned short)(hi0 >> 16)));
            const unsigned lo1 = pack_bf16(x[2] - bf16_to_f32((unsigned short)(hi1 & 0xffffu)),
                                           x[3] - bf16_to_f32((unsigned short)(hi1 >> 16)));
            *(uint2*)(his[which] + at) = make_uint2(hi0, hi1);
            *(uint2*)(los[which] + at) = make_uint2(lo0, lo1);
        }
    }
}

// One 64-column tile of W or U, (T_hi + T_lo) X[:, n0 .. n0 + 63], by the calling warpgroup,
// stored as bf16 rows of `cols` at out.
__device__ __forceinline__ void wg_scaled_product(const unsigned short* t_hi, const unsigned short* t_lo,
                                                  const unsigned short* x, int n0, unsigned short* out,
                                                  int cols, int row_tile, int lane) {
    float acc[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    wg_fence(acc);
    wgmma_fence();
#pragma unroll
    for (int s = 0; s < 4; ++s) wgmma_ss<1>(acc, cm_desc<true>(t_hi, 0, 16 * s), cm_desc<false>(x, 16 * s, n0));
#pragma unroll
    for (int s = 0; s < 4; ++s) wgmma_ss<1>(acc, cm_desc<true>(t_lo, 0, 16 * s), cm_desc<false>(x, 16 * s, n0));
    wgmma_commit();
    wgmma_wait_all();
    wg_fence(acc);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        unsigned short* row = out + (long long)(row_tile + (lane >> 2) + 8 * h) * cols + n0 + 2 * (lane & 3);
#pragma unroll
        for (int n = 0; n < 8; ++n) *(unsigned*)(row + 8 * n) = pack_bf16(acc[n][2 * h], acc[n][2 * h + 1]);
    }
}

template <int KP, int VP>
__device__ void prepare_wgmma_impl(const PrefillParams& p) {
    constexpr int LDF = PF_LDF;
    static_assert(LDF % 4 == 0, "16-byte rows of T");
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const int group_heads = p.heads_per_block;
    auto gates_of = [&](int j) -> ChunkGates& {
        return *(ChunkGates*)(smem_raw + j * PF_GATES_BYTES);
    };
    unsigned short* keys = (unsigned short*)(smem_raw + group_heads * PF_GATES_BYTES);  // KP columns
    unsigned short* values = keys + cm_elements(KP);                                    // VP columns
    float* a_mat = (float*)(values + cm_elements(VP));                                  // [64][LDF]
    float* t_mat = a_mat + PF_CHUNK * LDF + 3 * 16 * 17;                                // [64][LDF]
    unsigned short* queries = (unsigned short*)(a_mat + PF_CHUNK * LDF);                // until T
    unsigned short* w_hi = (unsigned short*)a_mat;
    unsigned short* w_lo = w_hi + cm_elements(PF_CHUNK);
    unsigned short* u_hi = (unsigned short*)t_mat;
    unsigned short* u_lo = u_hi + cm_elements(PF_CHUNK);

    const int chunk = blockIdx.x;
    const int key_head = blockIdx.y / p.head_groups, group = blockIdx.y - key_head * p.head_groups;
    const int ratio = p.value_heads / p.key_heads;
    const int head0 = key_head * ratio + group * group_heads;
    const int count = min(group_heads, ratio - group * group_heads);  // >= 1 (the launcher's plan)
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int warpgroup = warp >> 2, row_tile = 16 * (warp & 3);
    const bool with_scores = p.scores != 0;
    PF_MARK(0);
    const long long first_row = ((const long long*)p.chunk_first_row)[chunk];
    const int len = ((const int*)p.chunk_len)[chunk];
    const long long key_offset = (first_row * p.key_heads + key_head) * KP;
    const long long key_stride = (long long)p.key_heads * KP;
    const unsigned short* chunk_values = (const unsigned short*)p.v + first_row * p.value_heads * VP;
    const long long value_stride = (long long)p.value_heads * VP;

    copy_rows_cm_async<VP>(values, chunk_values + (long long)head0 * VP, value_stride, len);
    if (!p.fused_qk_norm) {
        copy_rows_cm_async<KP>(keys, (const unsigned short*)p.k + key_offset, key_stride, len);
        if (with_scores) copy_rows_cm_async<KP>(queries, (const unsigned short*)p.q + key_offset, key_stride, len);
    }
    cp_async_commit();
    if (warp < count) {
        const float* g = (const float*)p.g + first_row * p.value_heads + head0 + warp;
        const int t0 = 2 * lane;
        float g_even = t0 < len ? g[(long long)t0 * p.value_heads] : 0.0f;
        float g_odd = t0 + 1 < len ? g[(long long)(t0 + 1) * p.value_heads] : 0.0f;
        scan_chunk_gates(gates_of(warp), g_even, g_odd, len, p.reset_gate);
    }
    {
        const int j = threadIdx.x / PF_CHUNK, t = threadIdx.x % PF_CHUNK;
        if (j < count) {
            gates_of(j).beta[t] =
                t < len ? load_float((const void*)p.beta, (first_row + t) * p.value_heads + head0 + j,
                                     p.beta_dtype)
                        : 0.0f;
        }
    }
    if (p.fused_qk_norm) {
        const bool write = group == 0;
        const NormRows sets[2] = {
            {(const unsigned short*)p.k_src + key_offset, keys,
             write ? (unsigned short*)p.k + key_offset : nullptr},
            {with_scores || write ? (const unsigned short*)p.q_src + key_offset : nullptr,
             with_scores ? queries : nullptr, write ? (unsigned short*)p.q + key_offset : nullptr},
        };
        normalize_rows<KP, true>(sets, 0, key_stride, len, warp, lane);
    }
    cp_async_wait_all();
    fence_proxy_async();
    __syncthreads();
    PF_MARK(1);
    if (p.prefetch_ahead > 0) {
        prefetch_block_inputs<KP, VP>(p, blockIdx.x + (long long)gridDim.x * blockIdx.y + p.prefetch_ahead);
    }
    {
        const unsigned* from = (const unsigned*)smem_raw;
        unsigned* to = (unsigned*)((unsigned char*)p.gates +
                                   ((long long)chunk * p.value_heads + head0) * PF_GATES_BYTES);
        for (int i = threadIdx.x; i < count * (int)(PF_GATES_BYTES / 4); i += blockDim.x) to[i] = from[i];
    }

    // K K^T (kept for every head's A) and Q K^T, each warpgroup over half of their columns; each
    // head's scores go to device memory now.
    float kk[4][4];
    {
        float qk[4][4];
        wg_grams<KP>(kk, qk, keys, queries, with_scores, warpgroup);
        for (int j = 0; j < count; ++j) {
            unsigned short* scores =
                with_scores ? (unsigned short*)p.scores + ((long long)chunk * p.value_heads + head0 + j) * PF_CHUNK * PF_CHUNK
                            : nullptr;
            store_masked_products(kk, qk, gates_of(j), j == 0 ? a_mat : nullptr, scores, row_tile, warpgroup, lane);
        }
    }

    constexpr int W_TILES = KP / 64, TILES = (KP + VP) / 64;
    for (int j = 0; j < count; ++j) {
        const int head = head0 + j;
        const ChunkGates& gates = gates_of(j);
        // A of this head (the first head's was stored with the products).
        if (j > 0) store_masked_products(kk, kk, gates, a_mat, nullptr, row_tile, warpgroup, lane);
        __syncthreads();
        PF_MARK(2 + 5 * j);
        invert_unit_lower<true>(a_mat, t_mat, 3 + 5 * j);
        PF_MARK(4 + 5 * j);

        build_scaled_halves_cm(t_mat, gates, w_hi, w_lo, u_hi, u_lo, warp, lane);
        // This head's v (copied in during the previous head's work) is in place.
        cp_async_wait_all();
        fence_proxy_async();
        __syncthreads();
        PF_MARK(5 + 5 * j);
        for (int tile = warpgroup; tile < TILES; tile += 2) {
            const bool is_w = tile < W_TILES;
            const int cols = is_w ? KP : VP;
            unsigned short* out = (unsigned short*)(is_w ? p.w : p.u) +
                                  ((long long)chunk * p.value_heads + head) * PF_CHUNK * cols;
            wg_scaled_product(is_w ? w_hi : u_hi, is_w ? w_lo : u_lo, is_w ? keys : values,
                              64 * (is_w ? tile : tile - W_TILES), out, cols, row_tile, lane);
        }
        __syncthreads();
        PF_MARK(6 + 5 * j);
        // The next head's v into the buffer U has finished reading.
        if (j + 1 < count) {
            copy_rows_cm_async<VP>(values, chunk_values + (long long)(head + 1) * VP, value_stride, len);
            cp_async_commit();
        }
    }
}

#endif  // PF_PREPARE_MMA && __CUDA_ARCH_FEAT_SM90_ALL

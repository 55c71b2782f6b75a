// GDN chunked prefill, the prepare kernel: A, T = (I + A)^-1, W and U of every chunk (the math
// and the other kernels are in gdn_prefill.cu, whose helpers this file uses; the library
// compiles the prepare's module as one source: gdn_prefill.cu, gdn_prefill_inverse.cu, this
// file).

// Phase marks for tools/prefill-lab (which defines PF_MARK to record clocks); none here.
// The prepare kernel marks 0 at entry, 1 when its inputs are in shared memory, then for the
// j-th value head of its group: 2 + 5j when A is in shared memory (for j = 0 after the
// products, every head's scores and its A), 3 + 5j after T's diagonal blocks, 4 + 5j after the
// blocks below them, 5 + 5j after W, 6 + 5j after U.
#ifndef PF_MARK
#define PF_MARK(phase)
#endif
// Timing trials (`DELTAKV_CUDA_DEFINES=PF_TRIAL=n`; wrong results on purpose, never a default):
// each set bit leaves one part of the prepare out, so ncu's duration of the kernel without it
// says what that part costs at full occupancy. 1: the stores of W, U, the scores and the k / q
// chunks to device memory (the values are still formed: a store runs only when its first
// value has one bit pattern no product forms); 2: the inverse (T is whatever A's and T's space
// held); 4: the W and U products with their stores; 8: the products of T's lo halves in W and
// U; 16: the fused l2 norm (raw rows copied in instead); 32: K K^T, Q K^T and the masked
// stores of A and the scores.
#ifndef PF_TRIAL
#define PF_TRIAL 0
#endif
// True unless trial 1 leaves stores out (then only for one bit pattern of `x`).
#define PF_KEEP_STORE(x) (!(PF_TRIAL & 1) || __float_as_uint(x) == 0x7fc01234u)
#define PF_MAX_GROUP 4  // value heads per prepare block (ChunkGates records in shared memory)
#define PF_PREPARE_THREADS 256  // 8 warps per block (the launcher's block size)
// Prepare blocks per SM: 3, the library's (80 registers), or 2 (128 registers). A switch for
// tools/prefill-lab, which builds both; the launcher's shared memory fits either at
// K = V = 128 with two value heads per block.
#ifndef PF_PREPARE_BLOCKS_PER_SM
#define PF_PREPARE_BLOCKS_PER_SM 3
#endif
// The register walks' prepare (no v, W or U; 38-46 KB of shared memory): 4 blocks per SM,
// 64 registers.
#ifndef PF_REGS_PREPARE_BLOCKS_PER_SM
#define PF_REGS_PREPARE_BLOCKS_PER_SM 4
#endif

// T = (I + A)^-1 of the chunk's strictly lower A (f32 [64][PF_LDF] in shared memory) into
// t_mat (gdn_prefill_inverse.cu): the blocks below the diagonal blocks on tf32 tensor cores
// (A only read). Every thread of the block (256) takes part; ends with a barrier. Marks `mark`
// after the diagonal blocks.
// COLUMNS: the diagonal blocks by one thread per column (invert_diagonal_columns), for callers
// that hold no other registers through the inverse.
template <bool COLUMNS = false>
__device__ __forceinline__ void invert_unit_lower(float* a_mat, float* t_mat, int mark) {
    if constexpr (COLUMNS) {
        invert_diagonal_columns(a_mat, t_mat);
    } else {
        invert_diagonal_blocks(a_mat, t_mat);
    }
    __syncthreads();
    PF_MARK(mark);
    invert_below_mma(a_mat, t_mat);
}

// One value head's share of the chunk products (each warp's 16 x 32 fragments at rows
// row_tile.., columns 32 half..): A = strictly_lower(diag(beta) K K^T o D) into `a_mat` (f32)
// when given, and the scores Q K^T o D (bf16) to `scores` when given. D_ij from `decay` when
// FACTORED (the caller has checked that the chunk's decays factor), else the exact form.
template <bool FACTORED, bool SCORES_CM>
__device__ __forceinline__ void store_masked_entries(const float (&kk)[4][4], const float (&qk)[4][4],
                                                     const ChunkGates& gates, float* a_mat,
                                                     unsigned short* scores, int row_tile, int half,
                                                     int lane, const FragmentDecays<4>& decay) {
    float beta[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) beta[h] = a_mat ? gates.beta[row_tile + (lane >> 2) + 8 * h] : 0.0f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int i = row_tile + (lane >> 2) + 8 * h;
#pragma unroll
        for (int n = 0; n < 4; ++n) {
            const int j = 32 * half + 8 * n + 2 * (lane & 3);
            const float d0 = FACTORED ? decay.factored_at(h, n, i, j) : pair_decay_exact(gates, i, j);
            const float d1 = FACTORED ? decay.factored_at(h, n, i, j + 1) : pair_decay_exact(gates, i, j + 1);
            if (a_mat) {
                const float a0 = j < i ? beta[h] * kk[n][2 * h] * d0 : 0.0f;
                const float a1 = j + 1 < i ? beta[h] * kk[n][2 * h + 1] * d1 : 0.0f;
                if constexpr (PF_LDF % 2 == 0) {
                    *(float2*)(a_mat + i * PF_LDF + j) = make_float2(a0, a1);
                } else {
                    a_mat[i * PF_LDF + j] = a0;
                    a_mat[i * PF_LDF + j + 1] = a1;
                }
            }
            if (scores && PF_KEEP_STORE(qk[n][2 * h])) {
                const int at = SCORES_CM ? cm_index(i, j) : swizzled(i, j, PF_CHUNK);
                *(unsigned*)(scores + at) = pack_bf16(qk[n][2 * h] * d0, qk[n][2 * h + 1] * d1);
            }
        }
    }
}

// store_masked_entries with the decays of `gates`: where they factor, every entry's D_ij is
// up_i down_j from registers (one path without a branch per entry); otherwise the exact form.
// The scores go `swizzled`, or in the core-matrix layout where SCORES_CM.
template <bool SCORES_CM = false>
__device__ __forceinline__ void store_masked_products(const float (&kk)[4][4], const float (&qk)[4][4],
                                                      const ChunkGates& gates, float* a_mat,
                                                      unsigned short* scores, int row_tile,
                                                      int half, int lane) {
    const FragmentDecays<4> decay(gates, row_tile, 32 * half, lane);
    if (decay.factored) {
        store_masked_entries<true, SCORES_CM>(kk, qk, gates, a_mat, scores, row_tile, half, lane, decay);
    } else {
        store_masked_entries<false, SCORES_CM>(kk, qk, gates, a_mat, scores, row_tile, half, lane, decay);
    }
}

// x as bf16 hi + lo halves (lo = x - hi rounded to bf16), two values per word.
__device__ __forceinline__ void bf16_halves4(const float (&x)[4], uint2& hi, uint2& lo) {
    hi = make_uint2(pack_bf16(x[0], x[1]), pack_bf16(x[2], x[3]));
    lo = make_uint2(pack_bf16(x[0] - bf16_to_f32((unsigned short)(hi.x & 0xffffu)),
                              x[1] - bf16_to_f32((unsigned short)(hi.x >> 16))),
                    pack_bf16(x[2] - bf16_to_f32((unsigned short)(hi.y & 0xffffu)),
                              x[3] - bf16_to_f32((unsigned short)(hi.y >> 16))));
}

// Both scaled forms of T (f32 [64][LDF]) as bf16 hi + lo halves ([64][PF_LDC] each): T diag(beta
// d) for W into w_hi / w_lo, T diag(beta) for U into u_hi / u_lo, four columns per thread and
// step (16-byte loads of T, beta and d, 8-byte stores). U's halves may overlap T's rows (the
// prepare puts them there), so every thread holds its T values in registers and the block meets
// before they are stored; W's halves must not overlap T. The whole block (256 threads); ends
// without a barrier after U's stores.
template <int LDF>
__device__ __forceinline__ void build_scaled_halves(const float* t_mat, const ChunkGates& gates,
                                                    unsigned short* w_hi, unsigned short* w_lo,
                                                    unsigned short* u_hi, unsigned short* u_lo) {
    static_assert(LDF % 4 == 0, "16-byte rows");
    constexpr int THREADS = PF_PREPARE_THREADS, STEPS = PF_CHUNK * PF_CHUNK / 4 / THREADS;
    float tb[STEPS][4];  // T diag(beta), the products U takes
#pragma unroll
    for (int step = 0; step < STEPS; ++step) {
        const int idx = threadIdx.x + THREADS * step;
        const int i = idx / (PF_CHUNK / 4), m = 4 * (idx % (PF_CHUNK / 4));
        const float4 t = *(const float4*)(t_mat + i * LDF + m);
        const float4 b = *(const float4*)(gates.beta + m);
        const float4 d = *(const float4*)(gates.start_decay + m);
        tb[step][0] = t.x * b.x, tb[step][1] = t.y * b.y, tb[step][2] = t.z * b.z, tb[step][3] = t.w * b.w;
        const float x[4] = {tb[step][0] * d.x, tb[step][1] * d.y, tb[step][2] * d.z, tb[step][3] * d.w};
        uint2 hi, lo;
        bf16_halves4(x, hi, lo);
        *(uint2*)(w_hi + i * PF_LDC + m) = hi;
        *(uint2*)(w_lo + i * PF_LDC + m) = lo;
    }
    // Every thread's T values are in registers before U's halves overwrite T's rows.
    __syncthreads();
#pragma unroll
    for (int step = 0; step < STEPS; ++step) {
        const int idx = threadIdx.x + THREADS * step;
        const int i = idx / (PF_CHUNK / 4), m = 4 * (idx % (PF_CHUNK / 4));
        uint2 hi, lo;
        bf16_halves4(tb[step], hi, lo);
        *(uint2*)(u_hi + i * PF_LDC + m) = hi;
        *(uint2*)(u_lo + i * PF_LDC + m) = lo;
    }
}

// T diag(beta) (T f32 [64][LDF] in shared memory, lower triangular by 16 x 16 blocks) as bf16
// hi + lo halves, stored straight into `to` in the core-matrix layout the register walks read
// (hi at `to`, lo PF_T_CM_ELEMS later; the blocks above T's diagonal blocks as zeros): each
// thread takes 8 columns of a row per step (two 16-byte loads of T and of beta, one 16-byte
// store per half); consecutive threads take consecutive rows, whose pieces are adjacent in that
// layout. The halves equal build_scaled_halves's U halves bit for bit. Reads only shared
// memory the caller has completed; no barrier.
template <int LDF>
__device__ __forceinline__ void store_t_beta_cm(const float* t_mat, const ChunkGates& gates, unsigned short* to) {
    static_assert(LDF % 4 == 0, "16-byte rows");
#pragma unroll
    for (int step = 0; step < PF_CHUNK * 8 / PF_PREPARE_THREADS; ++step) {
        const int piece = threadIdx.x + PF_PREPARE_THREADS * step;
        const int i = piece % PF_CHUNK, c = 8 * (piece / PF_CHUNK);
        uint2 hi[2] = {make_uint2(0u, 0u), make_uint2(0u, 0u)}, lo[2] = {hi[0], hi[1]};
        if (c / 16 <= i / 16) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float4 t = *(const float4*)(t_mat + i * LDF + c + 4 * h);
                const float4 b = *(const float4*)(gates.beta + c + 4 * h);
                const float x[4] = {t.x * b.x, t.y * b.y, t.z * b.z, t.w * b.w};
                bf16_halves4(x, hi[h], lo[h]);
            }
        }
        *(uint4*)(to + cm_index(i, c)) = make_uint4(hi[0].x, hi[0].y, hi[1].x, hi[1].y);
        *(uint4*)(to + PF_T_CM_ELEMS + cm_index(i, c)) = make_uint4(lo[0].x, lo[0].y, lo[1].x, lo[1].y);
    }
}

// One matrix of chunk rows for normalize_rows: bf16 rows at src + r * row_stride, normalised
// into x[64][ld] in shared memory (zeros from row `len`) and to dst + r * row_stride when
// `dst`; skipped when `src` is null.
struct NormRows {
    const unsigned short* src;
    unsigned short* x;
    unsigned short* dst;
};

// Sums each of v's N values (N a power of two, at most 32) over the warp's lanes with
// warp_sum's additions: at offsets 16, 8, .. 1 every lane adds its partner's partial sum to its
// own, as warp_sum does, but while more than one value is left it keeps only half of them (the
// upper half where its lane has the offset's bit) and sends the partner the other half. Lane l
// ends with the total of value l >> (5 - log2 N), bit for bit warp_sum's total of that value.
template <int N, int OFFSET = 16>
__device__ __forceinline__ float warp_reduce_scatter(const float (&v)[N], int lane) {
    if constexpr (N > 1) {
        constexpr int HALF = N / 2;
        const bool upper = (lane & OFFSET) != 0;
        float kept[HALF];
#pragma unroll
        for (int k = 0; k < HALF; ++k) {
            const float send = upper ? v[k] : v[k + HALF];
            const float keep = upper ? v[k + HALF] : v[k];
            kept[k] = keep + __shfl_xor_sync(0xffffffffu, send, OFFSET);
        }
        if constexpr (OFFSET > 1) {
            return warp_reduce_scatter<HALF, OFFSET / 2>(kept, lane);
        } else {
            return kept[0];
        }
    } else {
        float x = v[0];
#pragma unroll
        for (int offset = OFFSET; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
        return x;
    }
}

// l2-normalises the chunk's rows of one key head (KP = K elements per row) in both `sets`
// with the convert kernel's arithmetic, bit for bit. Warp w takes rows w, w + 8, ...; each
// batch of rows of both sets is loaded before any is used, so their loads are in flight
// together, and stored raw into x while this lane's share of each row's |row|^2 is taken;
// the batch's sums are then reduced together (warp_reduce_scatter), so each lane takes one
// square root and division per batch instead of one per row, and each row is scaled in x.
template <int KP>
__device__ __forceinline__ void normalize_rows(const NormRows (&sets)[2], int ld, long long row_stride,
                                               int len, int warp, int lane) {
    constexpr int PER = KP / 32, WORDS = PER / 2;
    constexpr int ROWS = PF_CHUNK / 8;                  // per warp
    constexpr int BATCH = WORDS <= 2 ? ROWS : ROWS / 2;  // 32 registers of loads in flight
    constexpr int SUMS = 2 * BATCH;                     // rows of both sets in a batch
    static_assert(SUMS == 8 || SUMS == 16, "warp_reduce_scatter's value count");
    constexpr int SHIFT = SUMS == 16 ? 1 : 2;           // lane (k << SHIFT) holds row k's factor
#pragma unroll
    for (int b = 0; b < ROWS; b += BATCH) {
        float sums[SUMS];
        {
            unsigned bits[2][BATCH][WORDS];
#pragma unroll
            for (int s = 0; s < 2; ++s) {
#pragma unroll
                for (int i = 0; i < BATCH; ++i) {
                    const int r = warp + 8 * (b + i);
                    if (sets[s].src && r < len) {
                        load_bf16_words<PER>(sets[s].src + r * row_stride, lane, bits[s][i]);
                    } else {
#pragma unroll
                        for (int w = 0; w < WORDS; ++w) bits[s][i][w] = 0u;
                    }
                }
            }
#pragma unroll
            for (int s = 0; s < 2; ++s) {
#pragma unroll
                for (int i = 0; i < BATCH; ++i) {
                    sums[s * BATCH + i] = bf16_words_sum_sq<PER>(bits[s][i]);
                    if (sets[s].src) store_bf16_words<PER>(sets[s].x + (warp + 8 * (b + i)) * ld, lane, bits[s][i]);
                }
            }
        }
        const float factor = l2_factor(warp_reduce_scatter<SUMS>(sums, lane));
#pragma unroll
        for (int s = 0; s < 2; ++s) {
            if (!sets[s].src) continue;
#pragma unroll
            for (int i = 0; i < BATCH; ++i) {
                const int r = warp + 8 * (b + i);  // the same for the whole warp
                const float row_factor = __shfl_sync(0xffffffffu, factor, (s * BATCH + i) << SHIFT);
                if (r < len) {
                    unsigned bits[WORDS];
                    load_bf16_words<PER>(sets[s].x + r * ld, lane, bits);
                    scale_bf16_words<PER>(bits, row_factor);
                    store_bf16_words<PER>(sets[s].x + r * ld, lane, bits);
                    if (sets[s].dst) store_bf16_words<PER>(sets[s].dst + r * row_stride, lane, bits);
                }
            }
        }
    }
}

// One warp's part of W = (T diag(beta d)) K or U = (T diag(beta)) V at rows row_tile .. + 15:
// columns n0 = 16 q, 16 q + 64, .. in 16-column steps, from T's bf16 halves (t_hi, t_lo:
// [64][PF_LDC]) and the operand's rows ([64][LD] bf16), stored bf16 into `out` `swizzled` with
// rows of LD_OUT (TILED: by 64-column tiles of PF_U_TILE_ELEMS, as U's stage layout). T is
// lower triangular, so these rows take only T's first KSTEPS = row_tile / 16 + 1 k steps (the
// blocks after them are zero). Each k step's fragments are read one step ahead of its four
// products, from 32-bit shared-window addresses formed once.
template <int KSTEPS, int COLS, int LD, int LD_OUT, bool TILED>
__device__ __forceinline__ void scaled_t_rows(const unsigned short* t_hi, const unsigned short* t_lo,
                                              const unsigned short* operand, unsigned short* out,
                                              int row_tile, int q, int lane) {
    // This lane's ldmatrix row addresses: T's halves as frag_a_ldsm reads them, the operand's
    // rows as frag_b2_rowmajor does.
    const int m8 = lane >> 3, i8 = lane & 7;
    const unsigned t_lane = 2u * ((row_tile + i8 + 8 * (m8 & 1)) * PF_LDC + 8 * (m8 >> 1));
    const unsigned hi_at = shared_address(t_hi) + t_lane, lo_at = shared_address(t_lo) + t_lane;
    const unsigned b_lane = shared_address(operand) + 2u * ((i8 + 8 * (m8 & 1)) * LD + 8 * (m8 >> 1));
    // The lane's output rows r and r + 8, columns c and c + 8 of each 16-column step: with n0 a
    // multiple of 16, piece (c + 8) / 8 of a swizzled row is piece c / 8 ^ 1.
    const int out_row = row_tile + (lane >> 2);
    unsigned short* lane_out = out + out_row * LD_OUT + 2 * (lane & 3);
#pragma unroll 1
    for (int n0 = 16 * q; n0 < COLS; n0 += 64) {
        float acc0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, acc1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        unsigned hi[2][4], lo[2][4], b[2][4];
        const unsigned b_at = b_lane + 2u * n0;
        ldsm_x4_at(hi[0], hi_at);
        if (!(PF_TRIAL & 8)) ldsm_x4_at(lo[0], lo_at);
        ldsm_x4_trans_at(b[0], b_at);
#pragma unroll
        for (int kb = 0; kb < KSTEPS; ++kb) {
            const int cur = kb & 1, next = cur ^ 1;
            if (kb + 1 < KSTEPS) {
                ldsm_x4_at(hi[next], hi_at + 32u * (kb + 1));
                if (!(PF_TRIAL & 8)) ldsm_x4_at(lo[next], lo_at + 32u * (kb + 1));
                ldsm_x4_trans_at(b[next], b_at + 2u * 16 * LD * (kb + 1));
            }
            const unsigned b0[2] = {b[cur][0], b[cur][1]}, b1[2] = {b[cur][2], b[cur][3]};
            mma_bf16_16816(acc0, hi[cur], b0);
            if (!(PF_TRIAL & 8)) mma_bf16_16816(acc0, lo[cur], b0);
            mma_bf16_16816(acc1, hi[cur], b1);
            if (!(PF_TRIAL & 8)) mma_bf16_16816(acc1, lo[cur], b1);
        }
        // U's tile n0 / 64 (W has one); n0 and n0 + 8 are in the same 64-column tile.
        const int tile = TILED ? n0 / PF_TILE : 0;
        const int c = n0 - PF_TILE * tile;
        const int piece = ((c >> 3) ^ out_row) & 7;
        unsigned short* row = lane_out + tile * PF_U_TILE_ELEMS + (c & ~63);
        if (!PF_KEEP_STORE(acc0[0])) continue;
        *(unsigned*)(row + 8 * piece) = pack_bf16(acc0[0], acc0[1]);
        *(unsigned*)(row + 8 * LD_OUT + 8 * piece) = pack_bf16(acc0[2], acc0[3]);
        *(unsigned*)(row + 8 * (piece ^ 1)) = pack_bf16(acc1[0], acc1[1]);
        *(unsigned*)(row + 8 * LD_OUT + 8 * (piece ^ 1)) = pack_bf16(acc1[2], acc1[3]);
    }
}

// W = (T diag(beta d)) K or U = (T diag(beta)) V by the block's 8 warps (scaled_t_rows). Row
// tile r takes r + 1 of T's k steps, so the warps pair row tiles 0 and 3, or 1 and 2 (5 steps
// either way): each warp takes a quarter of both tiles' 16-column steps, and every warp the
// same number of products.
template <int COLS, int LD, int LD_OUT, bool TILED>
__device__ __forceinline__ void scaled_t_product(const unsigned short* t_hi, const unsigned short* t_lo,
                                                 const unsigned short* operand, unsigned short* out,
                                                 int warp, int lane) {
    static_assert(COLS % 64 == 0, "four warps share each row tile's 16-column steps");
    const int tile = warp & 3;
    const int q = 2 * (warp >> 2) + (tile >> 1);  // 0 .. 3 among the warps of a pair of tiles
    if (tile == 0 || tile == 3) {
        scaled_t_rows<4, COLS, LD, LD_OUT, TILED>(t_hi, t_lo, operand, out, 48, q, lane);
        scaled_t_rows<1, COLS, LD, LD_OUT, TILED>(t_hi, t_lo, operand, out, 0, q, lane);
    } else {
        scaled_t_rows<3, COLS, LD, LD_OUT, TILED>(t_hi, t_lo, operand, out, 32, q, lane);
        scaled_t_rows<2, COLS, LD, LD_OUT, TILED>(t_hi, t_lo, operand, out, 16, q, lane);
    }
}

// ---------------------------------------------------------------------------------------
// Prepare: A, T, W, U for one chunk and a group of value heads of one key head (GVA: the
// heads_per_block consecutive value heads starting at group * heads_per_block of the key
// head's r = H / Hg). K K^T and Q K^T depend on the key head only: the block loads k and q
// once, forms both products once (K K^T stays in registers), writes every head's scores,
// then per value head masks A with its beta and decays, inverts, and forms W and U from its v
// (the next head's v lands while the current one is inverted). With fused_qk_norm the block
// l2-normalises k and q itself. The first group of each key head stores the chunk's k (and q)
// rows as the walks' stages hold them (k_chunks, q_chunks), and with fused_qk_norm the
// normalised rows of q the lockstep pass reads (p.q, where set).
// 8 warps: in K K^T and Q K^T warp w computes rows 16 (w % 4) .. + 15 over half of the columns
// (w / 4 picks which); W and U split their lower-triangular work as scaled_t_product says.
//
// Shared memory (the launcher's prepare_smem mirrors it): heads_per_block ChunkGates records
// (PF_GATES_BYTES each), k [64][LDK], v [64][LDV] (bf16), A [64][LDF] (f32), 816 floats, T
// [64][LDF] (f32). q [64][LDK] takes the space after A until T is formed (at K > 128 A's
// space, for the l2 norm only); once T is complete, its bf16 halves for W ([64][LDC] twice)
// take A's space and the 816 floats, and those for U the space after them, into T's rows.
//
// REGISTER_WALKS (K = 128; prepare_regs_smem mirrors it): no v, W or U. The gates records, k
// [64][LDK], whose space A takes once K K^T is formed, and T [64][LDF], whose space holds q's
// rows until then; T diag(beta)'s halves go from T's rows straight to device memory.

template <int KP, int VP, bool REGISTER_WALKS, bool PAIR = false>
__device__ void prepare_impl(const PrefillParams& p) {
    constexpr int LDK = KP + PF_PAD, LDV = VP + PF_PAD;
    constexpr int LDF = PF_LDF;  // f32 rows of A and T
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const int group_heads = p.heads_per_block;
    auto gates_of = [&](int j) -> ChunkGates& {
        return *(ChunkGates*)(smem_raw + j * PF_GATES_BYTES);
    };
    unsigned short* keys = (unsigned short*)(smem_raw + group_heads * PF_GATES_BYTES);  // [64][LDK]
    unsigned short* values = keys + PF_CHUNK * LDK;                                    // [64][LDV]
    // The register walks' prepare has no v, W or U: A takes k's space once K K^T is formed,
    // and T follows it (q's rows in T's space until then).
    float* a_mat = REGISTER_WALKS ? (float*)keys : (float*)(values + PF_CHUNK * LDV);  // [64][LDF]
    float* t_mat = a_mat + PF_CHUNK * LDF + (REGISTER_WALKS ? 0 : 3 * 16 * 17);       // [64][LDF]
    static_assert(!REGISTER_WALKS || (KP == 128 && 2 * PF_CHUNK * LDK == 4 * PF_CHUNK * LDF),
                  "the register walks' prepare: k's and q's rows fill A's and T's spaces");
    static_assert(!PAIR || REGISTER_WALKS, "the pair form is the register walks' prepare");
    // PAIR (at most two value heads per block): the second head's A after T, both heads' A
    // stored once K K^T and Q K^T are formed.
    float* a_second = t_mat + PF_CHUNK * LDF;  // [64][LDF], PAIR only
    // T's bf16 halves for W and then U's, [64][LDC] each, from A's start once T is complete:
    // W's in A's space and the 816 floats (1.8 KB more than A), U's from there into T's rows.
    unsigned short* w_hi = (unsigned short*)a_mat;
    unsigned short* w_lo = w_hi + PF_CHUNK * PF_LDC;
    unsigned short* u_hi = w_lo + PF_CHUNK * PF_LDC;
    unsigned short* u_lo = u_hi + PF_CHUNK * PF_LDC;
    static_assert(2 * 2 * PF_CHUNK * PF_LDC <= 4 * (PF_CHUNK * LDF + 3 * 16 * 17),
                  "W's halves end before T's rows");
    static_assert(4 * 2 * PF_CHUNK * PF_LDC <= 4 * (2 * PF_CHUNK * LDF + 3 * 16 * 17),
                  "U's halves end with T's rows");
    // q's rows: at K <= 128 in the space T takes later (the scores read them after A's
    // space is written); at K > 128, which has no scores (the lockstep pass alone), only the
    // l2 norm stages them, in A's and T's space (38 KB against the 33 KB of 64 rows of 264).
    unsigned short* queries = (unsigned short*)(REGISTER_WALKS ? t_mat : KP <= 128 ? a_mat + PF_CHUNK * LDF : a_mat);
    static_assert(KP <= 128 || 2 * PF_CHUNK * LDK <= 4 * (2 * PF_CHUNK * LDF + 3 * 16 * 17),
                  "q's staging rows fit in A's and T's space");
    static_assert(KP > 128 || 2 * PF_CHUNK * LDK <= 4 * PF_CHUNK * LDF, "q's rows fit in T's space");

    const int chunk = blockIdx.x;
    const int key_head = blockIdx.y / p.head_groups, group = blockIdx.y - key_head * p.head_groups;
    const int ratio = p.value_heads / p.key_heads;
    const int head0 = key_head * ratio + group * group_heads;
    const int count = min(group_heads, ratio - group * group_heads);  // >= 1 (the launcher's plan)
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row_tile = 16 * (warp & 3), half = warp >> 2;
    const bool with_scores = KP <= 128 && p.scores != 0;  // the overlapped pass's, K <= 128
    PF_MARK(0);
    release_dependents();
    const long long first_row = ((const long long*)p.chunk_first_row)[chunk];
    const int len = ((const int*)p.chunk_len)[chunk];
    const long long key_offset = (first_row * p.key_heads + key_head) * KP;
    const long long key_stride = (long long)p.key_heads * KP;
    const long long value_stride = (long long)p.value_heads * VP;

    // v for U's product (the register walks read v themselves).
    if constexpr (!REGISTER_WALKS) {
        const unsigned short* chunk_values = (const unsigned short*)p.v + first_row * p.value_heads * VP;
        copy_rows_async<VP>(values, LDV, chunk_values + (long long)head0 * VP, value_stride, len);
    }
    if (!p.fused_qk_norm) {
        copy_rows_async<KP>(keys, LDK, (const unsigned short*)p.k + key_offset, key_stride, len);
        if (with_scores) {
            copy_rows_async<KP>(queries, LDK, (const unsigned short*)p.q + key_offset, key_stride, len);
        }
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
    if (p.fused_qk_norm && (PF_TRIAL & 16)) {
        copy_rows_async<KP>(keys, LDK, (const unsigned short*)p.k_src + key_offset, key_stride, len);
        if (with_scores) {
            copy_rows_async<KP>(queries, LDK, (const unsigned short*)p.q_src + key_offset, key_stride, len);
        }
        cp_async_commit();
    } else if (p.fused_qk_norm) {
        // The first group of the key head writes the normalised copy of q the lockstep pass
        // reads by rows (p.q, where set; the walks take k from k_chunks, stored below); q is
        // needed here only for the scores.
        const bool write = group == 0;
        unsigned short* q_rows = write && p.q ? (unsigned short*)p.q + key_offset : nullptr;
        const NormRows sets[2] = {
            {(const unsigned short*)p.k_src + key_offset, keys,
             nullptr},
            {with_scores || q_rows ? (const unsigned short*)p.q_src + key_offset : nullptr, queries, q_rows},
        };
        normalize_rows<KP>(sets, LDK, key_stride, len, warp, lane);
    }
    cp_async_wait_all();
    // The rows in keys and queries, for the bulk copies below.
    fence_proxy_async();
    __syncthreads();
    PF_MARK(1);
    if (!REGISTER_WALKS && group == 0 && threadIdx.x == 0 && p.k_chunks && !(PF_TRIAL & 1)) {
        // The chunk's k (and q) rows as the walks' stages hold them, one bulk copy each: q's
        // space is T's later (the copy has read it by then: bulk_store_wait_read below).
        const long long at = key_chunk_offset<KP>(p, chunk, key_head);
        bulk_store_async((unsigned short*)p.k_chunks + at, keys, 2 * PF_CHUNK * LDK);
        if (p.q_chunks) bulk_store_async((unsigned short*)p.q_chunks + at, queries, 2 * PF_CHUNK * LDK);
    }
    if (REGISTER_WALKS && group == 0) {
        // The chunk's k rows (and q's, for the register outputs walk) in the core-matrix
        // layout, for the register walks.
        const long long at = ((long long)chunk * p.key_heads + key_head) * (KP / 8) * PF_CM_BLOCK;
        for (int piece = threadIdx.x; piece < PF_CHUNK * KP / 8; piece += PF_PREPARE_THREADS) {
            // Consecutive threads take consecutive rows: in the core-matrix layout their 16-byte
            // pieces are adjacent.
            const int i = piece % PF_CHUNK, c = 8 * (piece / PF_CHUNK);
            *(uint4*)((unsigned short*)p.k_cm + at + cm_index(i, c)) = *(const uint4*)(keys + i * LDK + c);
            if (with_scores) {
                *(uint4*)((unsigned short*)p.q_cm + at + cm_index(i, c)) = *(const uint4*)(queries + i * LDK + c);
            }
        }
        // The 16-byte pad after each 8-column block, never read by wgmma, zeroed so that the
        // walks' bulk copies read only written memory.
        if (threadIdx.x < KP / 8) {
            const long long pad = at + threadIdx.x * PF_CM_BLOCK + PF_CHUNK * 8;
            *(uint4*)((unsigned short*)p.k_cm + pad) = make_uint4(0u, 0u, 0u, 0u);
            if (with_scores) *(uint4*)((unsigned short*)p.q_cm + pad) = make_uint4(0u, 0u, 0u, 0u);
        }
    }
    {
        // The chunk's gates for the state kernels, which copy them in with the chunk's inputs.
        const unsigned* from = (const unsigned*)smem_raw;
        unsigned* to = (unsigned*)((unsigned char*)p.gates +
                                   ((long long)chunk * p.value_heads + head0) * PF_GATES_BYTES);
        for (int i = threadIdx.x; i < count * (int)(PF_GATES_BYTES / 4); i += blockDim.x) to[i] = from[i];
    }

    // K K^T and, for the overlapped state pass, Q K^T (both products share the K operands):
    // K K^T is kept for every head's A; each head's scores Q K^T o D go to device memory first.
    float kk[4][4];
    {
        float qk[4][4];
#pragma unroll
        for (int n = 0; n < 4; ++n) {
            kk[n][0] = kk[n][1] = kk[n][2] = kk[n][3] = 0.0f;
            qk[n][0] = qk[n][1] = qk[n][2] = qk[n][3] = 0.0f;
        }
        // Rows 0 .. 31 against columns 32 .. 63 (two of the eight warps' blocks) lie wholly
        // above the diagonal, where both products are masked to zero: those warps skip them.
        const int k_end = (PF_TRIAL & 32) || row_tile + 16 <= 32 * half ? 0 : KP;
#pragma unroll
        for (int k0 = 0; k0 < k_end; k0 += 16) {
            unsigned a[4], aq[4];
            frag_a_ldsm(a, keys, LDK, row_tile, k0, lane);
            if (with_scores) frag_a_ldsm(aq, queries, LDK, row_tile, k0, lane);
#pragma unroll
            for (int n = 0; n < 4; n += 2) {
                unsigned b0[2], b1[2];
                frag_b2_ldsm(b0, b1, keys, LDK, k0, 8 * (4 * half + n), lane);
                mma_bf16_16816(kk[n], a, b0);
                mma_bf16_16816(kk[n + 1], a, b1);
                if (with_scores) {
                    mma_bf16_16816(qk[n], aq, b0);
                    mma_bf16_16816(qk[n + 1], aq, b1);
                }
            }
        }
        if constexpr (PAIR) {
            // The host launches the pair form for groups of at most two heads only.
            if (count > 2) __trap();
            // Both heads' A and scores now, each entry's decay formed once for both (A into
            // k's space once every warp's products and the core-matrix copy have read k);
            // K K^T's and Q K^T's registers are free after them.
            __syncthreads();
            for (int j = 0; !(PF_TRIAL & 32) && j < count; ++j) {
                unsigned short* scores =
                    with_scores ? (unsigned short*)p.scores + ((long long)chunk * p.value_heads + head0 + j) * PF_T_CM_ELEMS
                                : nullptr;
                store_masked_products<true>(kk, qk, gates_of(j), j == 0 ? a_mat : a_second, scores, row_tile,
                                            half, lane);
            }
        } else {
            // Every head's scores now (Q K^T's registers are free after them); A later, per head.
            for (int j = 0; with_scores && !(PF_TRIAL & 32) && j < count; ++j) {
                unsigned short* scores = (unsigned short*)p.scores + ((long long)chunk * p.value_heads + head0 + j) *
                                                                         (REGISTER_WALKS ? PF_T_CM_ELEMS : PF_SCORES_ELEMS);
                store_masked_products<REGISTER_WALKS>(kk, qk, gates_of(j), nullptr, scores, row_tile, half, lane);
            }
        }
    }

    for (int j = 0; j < count; ++j) {
        const int head = head0 + j;
        const ChunkGates& gates = gates_of(j);
        // A of this head (into k's space for the register walks, once every warp's products
        // and the core-matrix copy have read k); the pair form stored both above.
        if constexpr (!PAIR) {
            if (REGISTER_WALKS && j == 0) __syncthreads();
            if (!(PF_TRIAL & 32)) store_masked_products(kk, kk, gates, a_mat, nullptr, row_tile, half, lane);
        }
        // The bulk copies of k and q have read them (T takes q's space); in the pair form,
        // the previous head's T has been read too.
        if (j == 0 && threadIdx.x == 0) bulk_store_wait_read();
        __syncthreads();
        PF_MARK(2 + 5 * j);
        if (!(PF_TRIAL & 2)) invert_unit_lower<PAIR>(PAIR && j > 0 ? a_second : a_mat, t_mat, 3 + 5 * j);
        PF_MARK(4 + 5 * j);

        const long long chunk_head = (long long)chunk * p.value_heads + head;
        if constexpr (REGISTER_WALKS) {
            // T diag(beta)'s halves in the core-matrix layout, the only product of T the
            // register walks read, and the blocks' pads (see k's above) of T's halves and of
            // this head's scores. The next head's A goes to A's space (the inverse ended with a
            // barrier) and its T to T's space only after the barrier that follows A: no barrier.
            unsigned short* to = (unsigned short*)p.t_cm + chunk_head * 2 * PF_T_CM_ELEMS;
            store_t_beta_cm<LDF>(t_mat, gates, to);
            if (threadIdx.x < 24) {
                const int block = threadIdx.x % 8, part = threadIdx.x / 8;
                unsigned short* base = part < 2 ? to + part * PF_T_CM_ELEMS
                                                : (unsigned short*)p.scores + chunk_head * PF_T_CM_ELEMS;
                *(uint4*)(base + block * PF_CM_BLOCK + PF_CHUNK * 8) = make_uint4(0u, 0u, 0u, 0u);
            }
            PF_MARK(6 + 5 * j);
            continue;
        }
        // W = (T diag(beta d)) K and U = (T diag(beta)) V, each as hi + lo bf16 halves of the
        // scaled T times the bf16 operand; W as [64][KP], U as 64-column tiles [VP / 64][64][64],
        // both `swizzled` (the state passes' stage layouts, see PF_W_ELEMS). Both products run
        // between one pair of barriers.
        build_scaled_halves<LDF>(t_mat, gates, w_hi, w_lo, u_hi, u_lo);
        // This head's v (copied in during the previous head's work) is in place.
        cp_async_wait_all();
        __syncthreads();
        if (!(PF_TRIAL & 4)) {
            scaled_t_product<KP, LDK, KP, false>(w_hi, w_lo, keys,
                                                 (unsigned short*)p.w + chunk_head * PF_W_ELEMS(KP), warp, lane);
            PF_MARK(5 + 5 * j);
            scaled_t_product<VP, LDV, PF_TILE, true>(
                u_hi, u_lo, values, (unsigned short*)p.u + u_tile_offset(chunk_head, VP / PF_TILE, 0), warp, lane);
        }
        __syncthreads();
        PF_MARK(6 + 5 * j);
        // The next head's v into the buffer U has finished reading.
        if (j + 1 < count) {
            // The chunk's first row read again rather than held in registers through the block
            // (an opaque load, so the compiler cannot keep the first one's value instead).
            long long row;
            asm volatile("ld.global.nc.b64 %0, [%1];"
                         : "=l"(row)
                         : "l"((const long long*)p.chunk_first_row + chunk));
            const unsigned short* next = (const unsigned short*)p.v + (row * p.value_heads + head + 1) * VP;
            copy_rows_async<VP>(values, LDV, next, value_stride, len);
            cp_async_commit();
        }
    }
}

// `gdn_prefill_prepare_mma_*` (the inverse's levels on tf32 tensor cores).
#define PF_ENTRY_POINTS(KP, VP)                                                               \
    extern "C" __global__ void __launch_bounds__(PF_PREPARE_THREADS, PF_PREPARE_BLOCKS_PER_SM) \
        gdn_prefill_prepare_mma_k##KP##_v##VP(PrefillParams p) {                              \
        prepare_impl<KP, VP, false>(p);                                                       \
    }
// For the register walks (gdn_prefill_lead_regs.cu, K = 128): k's and q's chunk rows, T
// diag(beta)'s halves and the scores in the core-matrix layout, and neither W nor U.
#define PF_REGISTER_ENTRY_POINT(VP)                                                           \
    extern "C" __global__ void __launch_bounds__(PF_PREPARE_THREADS, PF_REGS_PREPARE_BLOCKS_PER_SM) \
        gdn_prefill_prepare_regs_k128_v##VP(PrefillParams p) {                               \
        prepare_impl<128, VP, true>(p);                                                       \
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
// The same for groups of at most two value heads, both heads' A stored with the scores
// (`prepare_impl`'s PAIR) and T's diagonal blocks by one thread per column.
#define PF_REGISTER_PAIR_ENTRY_POINT(VP)                                                      \
    extern "C" __global__ void __launch_bounds__(PF_PREPARE_THREADS, PF_REGS_PREPARE_BLOCKS_PER_SM) \
        gdn_prefill_prepare_regs_pair_k128_v##VP(PrefillParams p) {                          \
        prepare_impl<128, VP, true, true>(p);                                                 \
    }

PF_REGISTER_PAIR_ENTRY_POINT(64)
PF_REGISTER_PAIR_ENTRY_POINT(128)
PF_REGISTER_PAIR_ENTRY_POINT(256)
PF_REGISTER_ENTRY_POINT(64)
PF_REGISTER_ENTRY_POINT(128)
PF_REGISTER_ENTRY_POINT(256)

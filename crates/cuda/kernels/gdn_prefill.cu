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
//   gdn_prefill_prepare_* (gdn_prefill_prepare.cu): every (chunk, key head, group of its
//     value heads) in parallel, K K^T and Q K^T once per key head, then per value head: A,
//     T (blockwise forward substitution in f32: 16 x 16 diagonal blocks, then the blocks
//     below them; gdn_prefill_inverse.cu), W and U (T split into two bf16 halves so the
//     products keep ~16 bits), stored bf16.
//   gdn_prefill_state_*: one block per (segment of chunks, head, 64 value columns) walks its
//     chunks in order with S in registers (f32), computing V', O and the next S. In transition
//     mode it runs without outputs from a zero state (the segment's own contribution D) or
//     from the identity on K extra columns (the segment's linear map M on entry states).
//   gdn_prefill_combine: per (sequence, head, 16 columns), the entry state of each segment:
//     S_{s+1} = M_s S_s + D_s in f32, so long sequences with few heads use every SM.
//
// Rows past a sequence end are zero in Q, K, V and W/U and are masked before any exp.
//
// The kernels read q, k and v as bf16 with K and V padded to the compiled sizes KP and VP
// ([rows, heads, KP]; q and k already l2-normalised when asked) and g as f32: the caller's
// tensors when they already are, else copies made by gdn_prefill_convert, or, for bf16 q and k
// of K = KP with the l2 norm, by the prepare kernel as it reads them (fused_qk_norm).

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
    u64 q, k, v;          // bf16 [rows, Hg, KP], [rows, Hg, KP], [rows, H, VP]
    u64 g;                // f32 [rows, H]
    u64 beta;             // [rows, H] in beta_dtype
    u64 o;                // [rows, H, V] in out_dtype
    u64 w, u;             // bf16 [chunks, H, 64, KP] and [chunks, H, VP / 64, 64, 64] (swizzled,
                          // PF_W_ELEMS); both 0 where the register walks run (no W, U)
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
    u64 gates;            // [chunks, H] ChunkGates records (PF_GATES_BYTES each), from prepare
    u64 scores;           // bf16 [chunks, H, 64, 64] (swizzled): Q K^T o D per chunk, from
                          // prepare; or 0
    u64 checkpoints;      // f32 [C, H, K, V] state checkpoints, or 0 (none asked)
    u64 chunk_checkpoint; // i32 [chunks]: the checkpoint row taken after each chunk, or -1
    u64 q_src, k_src;     // bf16 [rows, Hg, K] raw q and k when the prepare normalises them
                          // (fused_qk_norm), else 0
    u64 q_chunks, k_chunks;  // bf16 [chunks, Hg, 64, KP + PF_PAD]: each chunk's (normalised) q
                             // and k rows as the walks' stages hold them, padding included,
                             // stored by the prepare; q_chunks 0 where the walks do not take
                             // q from it (the lockstep pass), both 0 in the lab
    u64 t_cm;             // bf16 [chunks, H, 2, PF_T_CM_ELEMS]: T diag(beta)'s hi and lo halves
                          // in the core-matrix layout, stored by the prepare for the register
                          // walks (gdn_prefill_lead_regs.cu); or 0
    u64 k_cm;             // bf16 [chunks, Hg, KP / 8 * PF_CM_BLOCK]: each chunk's k rows in the
                          // core-matrix layout, for the same walks; or 0
    u64 q_cm;             // bf16 [chunks, Hg, KP / 8 * PF_CM_BLOCK]: q's the same, for the
                          // register outputs walk; or 0. Where set, the scores are stored in
                          // the core-matrix layout too ([chunks, H, PF_T_CM_ELEMS])
    int key_heads, value_heads, key_dim, value_dim;
    int key_pad, value_pad;  // KP, VP: K and V rounded up to the kernel's tile sizes
    int out_dtype, beta_dtype;
    int use_segment_states;  // entry states come from segment_states (set when any sequence
                             // has several segments)
    int heads_per_block;     // value heads of one key head that a prepare block handles (<= 4)
    int head_groups;         // prepare blocks per (chunk, key head)
    int fused_qk_norm;       // the prepare l2-normalises q_src/k_src (into q where set, and the
                             // chunk copies; bf16, K == KP)
    float scale;
    float reset_gate;
};

// Element (key r, value column c) of segment `segment`'s head `head` in an f32 [segments, H, KP,
// VP] array (segment_states, transition_d).
template <int KP>
__device__ __forceinline__ long long segment_state_index(const PrefillParams& p, int segment, int head, int r,
                                                         int c) {
    return (((long long)segment * p.value_heads + head) * KP + r) * p.value_pad + c;
}

// Element (r, c) of the initial state of `state_row`'s head `head`: zero where the call has
// none and in the padding (r >= K or c >= V).
__device__ __forceinline__ float initial_state_element(const PrefillParams& p, long long state_row, int head, int r,
                                                       int c) {
    if (p.initial_state && r < p.key_dim && c < p.value_dim) {
        return ((const float*)p.initial_state)[((state_row * p.value_heads + head) * p.key_dim + r) * p.value_dim + c];
    }
    return 0.0f;
}

// Element (r, c) of a segment's entry state: the combined state of the two-level scan when the
// call is segmented, else the sequence's initial state (`state_row` of it).
template <int KP>
__device__ __forceinline__ float entry_state_element(const PrefillParams& p, int segment, long long state_row,
                                                     int head, int r, int c) {
    if (p.use_segment_states) {
        return ((const float*)p.segment_states)[segment_state_index<KP>(p, segment, head, r, c)];
    }
    return initial_state_element(p, state_row, head, r, c);
}

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

// Two floats rounded to bf16 (nearest even) in one register, `lo` in the low half: one
// conversion instruction for the pair.
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    unsigned packed;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
    return packed;
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
    float up[PF_CHUNK];           // exp(G_i) and exp(-G_i), used when `factored`
    float down[PF_CHUNK];
    float state_decay;            // exp(G_last), 0 after a reset in the chunk
    int factored;                 // no reset and |G| < 40: D_ij = up_i down_j
};

// Bytes the gates take at the start of dynamic shared memory (a multiple of 128, so the bf16
// arrays after them keep the alignment of 16-byte copies).
#define PF_GATES_BYTES ((sizeof(ChunkGates) + 127) / 128 * 128)

// The gates of a chunk from its log decays (g[2 lane], g[2 lane + 1]; 0 past `len`), by warp
// 0 alone: a segmented inclusive scan across the warp (a reset token restarts the sum at 0),
// then the decays. The caller puts a block barrier between this and any reader.
__device__ void scan_chunk_gates(ChunkGates& s, float g_even, float g_odd, int len,
                                 float reset_gate) {
    const int lane = threadIdx.x & 31;
    const int t0 = 2 * lane, t1 = t0 + 1;
    const int reset0 = t0 < len && g_even < reset_gate, reset1 = t1 < len && g_odd < reset_gate;
    const float x0 = reset0 ? 0.0f : g_even, x1 = reset1 ? 0.0f : g_odd;
    // This lane's pair as one element of the scan: (has a reset, sum since the last reset,
    // resets).
    float sum = reset1 ? x1 : x0 + x1;
    int restarts = reset0 | reset1, resets = reset0 + reset1;
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
        float sum_up = __shfl_up_sync(0xffffffffu, sum, offset);
        int restarts_up = __shfl_up_sync(0xffffffffu, restarts, offset);
        int resets_up = __shfl_up_sync(0xffffffffu, resets, offset);
        if (lane >= offset) {
            sum = restarts ? sum : sum_up + sum;
            restarts |= restarts_up;
            resets += resets_up;
        }
    }
    float before = __shfl_up_sync(0xffffffffu, sum, 1);
    int resets_before = __shfl_up_sync(0xffffffffu, resets, 1);
    if (lane == 0) {
        before = 0.0f;
        resets_before = 0;
    }
    const float cum0 = reset0 ? 0.0f : before + x0;
    const float cum1 = reset1 ? 0.0f : cum0 + x1;
    const int seg0 = resets_before + reset0, seg1 = seg0 + reset1;
    s.g_cum[t0] = cum0;
    s.g_cum[t1] = cum1;
    s.seg[t0] = t0 < len ? seg0 : -1;
    s.seg[t1] = t1 < len ? seg1 : -1;
    __syncwarp();
    const float last = s.g_cum[len - 1];
    const int last_seg = s.seg[len - 1];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int t = t0 + h;
        s.start_decay[t] = s.seg[t] == 0 ? expf(s.g_cum[t]) : 0.0f;
        s.end_decay[t] = s.seg[t] == last_seg ? expf(last - s.g_cum[t]) : 0.0f;
    }
    if (lane == 0) s.state_decay = last_seg == 0 ? expf(last) : 0.0f;
    // Within +-40 the pairwise decays factor without overflow (exp(40) ~ 2e17) and without the
    // cancellation of large cumsums; otherwise pair_decay_exact takes each difference.
    const bool in_range = (t0 >= len || fabsf(cum0) < 40.0f) && (t1 >= len || fabsf(cum1) < 40.0f);
    const int factored = __all_sync(0xffffffffu, in_range) && last_seg == 0;
    s.up[t0] = expf(cum0);
    s.up[t1] = expf(cum1);
    s.down[t0] = expf(-cum0);
    s.down[t1] = expf(-cum1);
    if (lane == 0) s.factored = factored;
}

// Shared memory written by this thread's ordinary stores, made visible to later reads by the
// async proxy (wgmma operands, bulk copies) after a barrier.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// One bulk copy (the copy engine) of `bytes` of shared memory to global memory, in this
// thread's bulk group; the writers of the shared side must have run fence_proxy_async and a
// barrier first, and nothing may overwrite it before bulk_store_wait_read.
__device__ __forceinline__ void bulk_store_async(void* dst, const void* src, unsigned bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst),
                 "r"(shared_address(src)), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Waits until this thread's bulk stores have read their shared memory.
__device__ __forceinline__ void bulk_store_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}

// Four 8 x 8 bf16 matrices from shared memory, transposed (ldmatrix .trans): lane l gives the
// row address of matrix l / 8 (`address` in the shared window).
__device__ __forceinline__ void ldsm_x4_trans_at(unsigned (&r)[4], unsigned address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
}

__device__ __forceinline__ void ldsm_x4_trans(unsigned (&r)[4], const unsigned short* p) {
    ldsm_x4_trans_at(r, shared_address(p));
}

// Four 8 x 8 bf16 matrices from shared memory as stored (ldmatrix): lane l gives the row
// address of matrix l / 8 (`address` in the shared window).
__device__ __forceinline__ void ldsm_x4_at(unsigned (&r)[4], unsigned address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
}

__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], const unsigned short* p) {
    ldsm_x4_at(r, shared_address(p));
}

// `frag_a` in one ldmatrix: the A operand (16 x 16) at (row0, col0) of a row-major x.
__device__ __forceinline__ void frag_a_ldsm(unsigned (&a)[4], const unsigned short* x, int ld,
                                            int row0, int col0, int lane) {
    const int m = lane >> 3, i = lane & 7;
    ldsm_x4(a, x + (row0 + i + 8 * (m & 1)) * ld + col0 + 8 * (m >> 1));
}

// Index of element (r, c) in a swizzled [rows][ld] bf16 array (ld a multiple of 64): piece
// c / 8 of row r stored at piece (c / 8) ^ (r % 8).
__device__ __forceinline__ int swizzled(int r, int c, int ld) {
    return r * ld + ((((c >> 3) ^ r) & 7) << 3) + (c & ~63) + (c & 7);
}

// `frag_a_ldsm` of a `swizzled` x (row0 a multiple of 8, col0 of 16).
__device__ __forceinline__ void frag_a_ldsm_swizzled(unsigned (&a)[4], const unsigned short* x, int ld,
                                                     int row0, int col0, int lane) {
    const int m = lane >> 3, i = lane & 7;
    ldsm_x4(a, x + swizzled(row0 + i + 8 * (m & 1), col0 + 8 * (m >> 1), ld));
}

// `frag_b` for the two n8 tiles at n0 and n0 + 8 in one ldmatrix: B[k][n] = z[n][k] with z
// row-major.
__device__ __forceinline__ void frag_b2_ldsm(unsigned (&b0)[2], unsigned (&b1)[2],
                                             const unsigned short* z, int ld, int k0, int n0,
                                             int lane) {
    const int m = lane >> 3, i = lane & 7;
    unsigned r[4];
    ldsm_x4(r, z + (n0 + i + 8 * (m >> 1)) * ld + k0 + 8 * (m & 1));
    b0[0] = r[0];
    b0[1] = r[1];
    b1[0] = r[2];
    b1[1] = r[3];
}

// B operands of the two n8 tiles at n0 and n0 + 8, k rows k0..k0+15, of a row-major x[k][n].
__device__ __forceinline__ void frag_b2_rowmajor(unsigned (&b0)[2], unsigned (&b1)[2],
                                                 const unsigned short* x, int ld, int k0, int n0,
                                                 int lane) {
    const int m = lane >> 3, i = lane & 7;
    unsigned r[4];
    ldsm_x4_trans(r, x + (k0 + i + 8 * (m & 1)) * ld + n0 + 8 * (m >> 1));
    b0[0] = r[0];
    b0[1] = r[1];
    b1[0] = r[2];
    b1[1] = r[3];
}

// The A operand (16 x 16 at row m0, column k0) of A = x^T for a row-major x[k][m].
__device__ __forceinline__ void frag_a_transposed(unsigned (&a)[4], const unsigned short* x,
                                                  int ld, int m0, int k0, int lane) {
    const int m = lane >> 3, i = lane & 7;
    ldsm_x4_trans(a, x + (k0 + i + 8 * (m >> 1)) * ld + m0 + 8 * (m & 1));
}

// Copies 64 rows of KP bf16 (row r of the chunk at src + r * row_stride; zeros from row `len`)
// into x[64][ld] with 16-byte asynchronous copies, shared by threads `first`..`first + count`
// of the block (the whole block by default).
template <int KP>
__device__ __forceinline__ void copy_rows_async(unsigned short* x, int ld, const unsigned short* src,
                                                long long row_stride, int len, int thread = -1,
                                                int threads = 0) {
    constexpr int PIECES = KP / 8;
    if (thread < 0) {
        thread = threadIdx.x;
        threads = blockDim.x;
    }
    for (int idx = thread; idx < PF_CHUNK * PIECES; idx += threads) {
        const int r = idx / PIECES, piece = idx % PIECES;
        const bool valid = r < len;
        cp_async16(x + r * ld + 8 * piece, src + (valid ? r : 0) * row_stride + 8 * piece, valid);
    }
}

// The prepare kernel's outputs for the state passes, per (chunk, value head), each laid out
// as the state passes' shared-memory stages hold it, so one bulk copy (the copy engine) moves
// it: W [64][KP], U by 64-column tiles [VP / 64][64][64], the scores [64][64] (bf16), dense
// rows with their 16-byte pieces permuted by the row (`swizzled`), so the eight rows that one
// ldmatrix reads fall on eight different bank groups without padding (padded rows would leave
// each row's last 32-byte sector partly written, which costs the memory a read-modify-write
// when it leaves L2). The host sizes its buffers to match.
#define PF_W_ELEMS(KP) (PF_CHUNK * (KP))
#define PF_U_TILE_ELEMS (PF_CHUNK * PF_TILE)
#define PF_SCORES_ELEMS (PF_CHUNK * PF_CHUNK)

// Element offset in p.u of U's tile `tile` of (chunk, value head) `chunk_head`, with `tiles`
// 64-column tiles a row (PF_W_ELEMS's layout).
__device__ __forceinline__ long long u_tile_offset(long long chunk_head, int tiles, int tile) {
    return (chunk_head * tiles + tile) * PF_U_TILE_ELEMS;
}

// The walk queued right after the prepare on the same stream is launched as its programmatic
// dependent: every prepare block releases it as it starts, so its blocks are placed on the SMs
// the prepare's last wave frees and wait there for the prepare's completion (and its writes)
// before reading anything; any other launch returns from the wait at once.
__device__ __forceinline__ void release_dependents() {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ void wait_for_prepare() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// Element offset in p.k_chunks / p.q_chunks of chunk `chunk`'s rows of key head `key_head`
// (rows of KP + PF_PAD).
template <int KP>
__device__ __forceinline__ long long key_chunk_offset(const PrefillParams& p, int chunk, int key_head) {
    return ((long long)chunk * p.key_heads + key_head) * PF_CHUNK * (KP + PF_PAD);
}

// The core-matrix layout of a [64][cols] bf16 matrix: 8-column blocks of eight 8 x 8 core
// matrices (128 contiguous bytes each, a row per 16 bytes), each block padded by 16 bytes so
// consecutive blocks start on different banks. wgmma reads it by descriptor as a K-major B
// (k along the columns) and as an MN-major one (k along the rows) alike. The prepare stores
// k's and q's chunk rows ([64][KP]), T diag(beta)'s halves and the scores ([64][64] each) so for
// the register walks.
#define PF_CM_BLOCK (PF_CHUNK * 8 + 8)
// Elements of a [64][64] core-matrix matrix (T diag(beta)'s halves are two of them).
#define PF_T_CM_ELEMS (8 * PF_CM_BLOCK)

// Index of element (r, c) of a [64][cols] bf16 matrix in the core-matrix layout.
__device__ __forceinline__ int cm_index(int r, int c) {
    return (c >> 3) * PF_CM_BLOCK + (r >> 3) * 64 + (r & 7) * 8 + (c & 7);
}

// The thread's index in the block, read afresh: values derived from it are then formed where
// they are used instead of being hoisted out of the state passes' chunk loops into registers
// held across the whole walk.
__device__ __forceinline__ unsigned fresh_thread_index() {
    unsigned tid;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
    return tid;
}

// copy_rows_async for a team of THREADS consecutive threads (thread threadIdx.x % THREADS of
// it): each thread copies the same 16-byte piece of rows r0, r0 + THREADS / PIECES, .., so its
// row and piece are formed once per call and each copy is an address step and a compare. The
// lockstep state kernel with outputs copies its q rows so on its sequential path every chunk
// (the other stage inputs come by bulk copies).
template <int COLS, int THREADS>
__device__ __forceinline__ void copy_rows_async_team(unsigned short* x, int ld,
                                                     const unsigned short* src,
                                                     long long row_stride, int len) {
    constexpr int PIECES = COLS / 8;
    static_assert(THREADS % PIECES == 0 && (PF_CHUNK * PIECES) % THREADS == 0,
                  "the team covers whole rows, and the chunk's rows in whole rounds");
    constexpr int ROW_STEP = THREADS / PIECES;
    constexpr int COPIES = PF_CHUNK * PIECES / THREADS;
    const unsigned thread = fresh_thread_index() % THREADS;
    const int r0 = (int)(thread / PIECES), piece = (int)(thread % PIECES);
    unsigned short* dst = x + r0 * ld + 8 * piece;
    const unsigned short* from = src + r0 * row_stride + 8 * piece;
    const long long step = ROW_STEP * row_stride;
#pragma unroll
    for (int c = 0; c < COPIES; ++c) {
        const bool valid = r0 + c * ROW_STEP < len;
        // A row past the chunk's end reads nothing (and is zero-filled) from a valid address.
        cp_async16(dst + c * ROW_STEP * ld, valid ? from + c * step : src, valid);
    }
}

// D_ij of the chunk (0 outside j <= i within one reset segment) from each difference of the
// cumulative gates: exact for any chunk (FragmentDecays takes the factored form where it holds).
__device__ __forceinline__ float pair_decay_exact(const ChunkGates& s, int i, int j) {
    if (j > i || s.seg[i] < 0) return 0.0f;
    return s.seg[i] == s.seg[j] ? expf(s.g_cum[i] - s.g_cum[j]) : 0.0f;
}

// D_ij at one thread's fragment entries of a 64 x 64 product: rows i = row_tile + lane / 4 +
// 8 h, columns j = col0 + 8 n + 2 (lane % 4) (+ 1). Where the chunk's decays factor (no reset,
// |G| < 40: D_ij = exp(G_i) exp(-G_j)) every row and column pair costs one shared load, all made
// when this is built, before the caller's stores (after a store the compiler must assume the
// gates changed and reload them per entry); otherwise each entry comes from pair_decay_exact.
template <int NT>
struct FragmentDecays {
    const ChunkGates& gates;
    bool factored;
    float up[2];  // 0 for rows past the chunk's end
    float2 down[NT];

    __device__ __forceinline__ FragmentDecays(const ChunkGates& g, int row_tile, int col0, int lane)
        : gates(g), factored(g.factored != 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int i = row_tile + (lane >> 2) + 8 * h;
            up[h] = factored && gates.seg[i] >= 0 ? gates.up[i] : 0.0f;
        }
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            down[n] = factored ? *(const float2*)(gates.down + col0 + 8 * n + 2 * (lane & 3)) : make_float2(0.0f, 0.0f);
        }
    }
    // D_ij for the entry at row h (index i) and column pair n (index j, its even or odd column).
    __device__ __forceinline__ float at(int h, int n, int i, int j) const {
        if (!factored) return pair_decay_exact(gates, i, j);
        return factored_at(h, n, i, j);
    }
    // `at` where the caller has checked `factored` (no branch per entry).
    __device__ __forceinline__ float factored_at(int h, int n, int i, int j) const {
        return j <= i ? up[h] * ((j & 1) ? down[n].y : down[n].x) : 0.0f;
    }
};

// ---------------------------------------------------------------------------------------
// Convert: rows of `dim` floats of any dtype into rows of `pad` bf16 (or f32), zero-padded,
// l2-normalised when asked (row / sqrt(|row|^2 + 1e-6), the contract's rule, in f32 from the
// input values). One warp per row.

struct ConvertParams {
    u64 src, dst;
    long long rows;
    int dim, pad, src_dtype, to_f32, normalize;
};

// The fast path of a bf16 row whose length is the padded length: PER contiguous elements per
// lane, read and written as one vector, normalised in registers. The prepare kernel normalises
// q and k with the same three steps, so its copies equal this kernel's bit for bit.
template <int PER>
__device__ __forceinline__ void load_bf16_words(const unsigned short* row, int lane,
                                                unsigned (&bits)[PER / 2]) {
    constexpr int WORDS = PER / 2;
    const unsigned* from = (const unsigned*)row + lane * WORDS;
    if constexpr (WORDS == 4) {
        uint4 x = *(const uint4*)from;
        bits[0] = x.x, bits[1] = x.y, bits[2] = x.z, bits[3] = x.w;
    } else if constexpr (WORDS == 2) {
        uint2 x = *(const uint2*)from;
        bits[0] = x.x, bits[1] = x.y;
    } else {
        bits[0] = *from;
    }
}

template <int PER>
__device__ __forceinline__ void store_bf16_words(unsigned short* row, int lane,
                                                 const unsigned (&bits)[PER / 2]) {
    constexpr int WORDS = PER / 2;
    unsigned* to = (unsigned*)row + lane * WORDS;
    if constexpr (WORDS == 4) {
        *(uint4*)to = make_uint4(bits[0], bits[1], bits[2], bits[3]);
    } else if constexpr (WORDS == 2) {
        *(uint2*)to = make_uint2(bits[0], bits[1]);
    } else {
        *to = bits[0];
    }
}

// This lane's share of a row's |row|^2 (its PER elements as bf16 pairs), in the order every
// l2 norm of the prefill uses, so their results agree bit for bit.
template <int PER>
__device__ __forceinline__ float bf16_words_sum_sq(const unsigned (&bits)[PER / 2]) {
    float sum_sq = 0.0f;
#pragma unroll
    for (int j = 0; j < PER / 2; ++j) {
        const float lo = bf16_to_f32((unsigned short)(bits[j] & 0xffffu));
        const float hi = bf16_to_f32((unsigned short)(bits[j] >> 16));
        sum_sq += lo * lo + hi * hi;
    }
    return sum_sq;
}

// The words scaled by `factor` (1 / sqrt(|row|^2 + 1e-6)) and rounded to bf16.
template <int PER>
__device__ __forceinline__ void scale_bf16_words(unsigned (&bits)[PER / 2], float factor) {
#pragma unroll
    for (int j = 0; j < PER / 2; ++j) {
        bits[j] = pack_bf16(bf16_to_f32((unsigned short)(bits[j] & 0xffffu)) * factor,
                            bf16_to_f32((unsigned short)(bits[j] >> 16)) * factor);
    }
}

__device__ __forceinline__ float l2_factor(float sum_sq) { return 1.0f / sqrtf(sum_sq + 1e-6f); }

// row / sqrt(|row|^2 + 1e-6) in f32, rounded to bf16; the row spread over the warp's lanes
// (PER elements each), its squares summed across them by warp_sum. Every lane of the warp must
// take part.
template <int PER>
__device__ __forceinline__ void normalize_bf16_words(unsigned (&bits)[PER / 2]) {
    scale_bf16_words<PER>(bits, l2_factor(warp_sum(bf16_words_sum_sq<PER>(bits))));
}

template <int PER>
__device__ __forceinline__ void convert_bf16_row(const unsigned short* src, unsigned short* dst,
                                                 bool normalize, int lane) {
    unsigned bits[PER / 2];
    load_bf16_words<PER>(src, lane, bits);
    if (normalize) normalize_bf16_words<PER>(bits);
    store_bf16_words<PER>(dst, lane, bits);
}

extern "C" __global__ void __launch_bounds__(256) gdn_prefill_convert(ConvertParams p) {
    const int lane = threadIdx.x & 31;
    const long long warps = (long long)gridDim.x * 8;
    const bool fast = p.src_dtype == DT_BF16 && !p.to_f32 && p.dim == p.pad &&
                      (p.pad == 64 || p.pad == 128 || p.pad == 256);
    for (long long r = blockIdx.x * 8LL + (threadIdx.x >> 5); r < p.rows; r += warps) {
        if (fast) {
            const unsigned short* src = (const unsigned short*)p.src + r * p.pad;
            unsigned short* dst = (unsigned short*)p.dst + r * p.pad;
            if (p.pad == 64) convert_bf16_row<2>(src, dst, p.normalize != 0, lane);
            else if (p.pad == 128) convert_bf16_row<4>(src, dst, p.normalize != 0, lane);
            else convert_bf16_row<8>(src, dst, p.normalize != 0, lane);
            continue;
        }
        float factor = 1.0f;
        if (p.normalize) {
            float sum_sq = 0.0f;
            for (int c = lane; c < p.dim; c += 32) {
                const float x = load_float((const void*)p.src, r * p.dim + c, p.src_dtype);
                sum_sq += x * x;
            }
            factor = 1.0f / sqrtf(warp_sum(sum_sq) + 1e-6f);
        }
        for (int c = lane; c < p.pad; c += 32) {
            const float x =
                c < p.dim ? load_float((const void*)p.src, r * p.dim + c, p.src_dtype) * factor : 0.0f;
            if (p.to_f32) {
                ((float*)p.dst)[r * p.pad + c] = x;
            } else {
                ((unsigned short*)p.dst)[r * p.pad + c] = f32_to_bf16(x);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Combine: the entry state of every segment of one sequence, for one head and 16 columns:
// S_0 = the initial state (or 0), S_{s+1} = M_s S_s + D_s, in f32. 256 threads, each with the
// KP / 16 rows r = group + 16 i of one column. M comes through shared memory in tiles of KP rows
// by COMBINE_M_COLS(KP) columns, double-buffered by cp.async: M does not depend on the chain,
// so the next tile (the next step's first, at a step's end) lands while this one is used, and
// only the products and one barrier per tile sit on the sequential chain.

#define COMBINE_COLS 16
#define COMBINE_M_COLS(KP) ((KP) == 256 ? 8 : 32)

template <int KP>
__device__ void combine_impl(const PrefillParams& p) {
    constexpr int ROW_GROUPS = 256 / COMBINE_COLS;
    constexpr int ROWS = KP / ROW_GROUPS;  // rows per thread
    constexpr int MC = COMBINE_M_COLS(KP);
    constexpr int LD = MC + 4;  // 16-byte rows; neighbouring rows on different banks (4 or 12 apart)
    constexpr int TILES = KP / MC;
    constexpr int PIECES = KP * MC / 4 / 256;  // 16-byte copies per thread and tile
    static_assert(PIECES * 256 * 4 == KP * MC, "whole tiles of 16-byte pieces");
    __shared__ float entry[KP][COMBINE_COLS];
    __shared__ __align__(16) float m_tile[2][KP][LD];
    const int seq = blockIdx.x, head = blockIdx.y, col0 = blockIdx.z * COMBINE_COLS;
    const int col = threadIdx.x % COMBINE_COLS, group = threadIdx.x / COMBINE_COLS;
    const int first = ((const int*)p.seq_first_segment)[seq];
    const int count = ((const int*)p.seq_first_segment)[seq + 1] - first;
    const long long state_row =
        p.state_rows ? ((const long long*)p.state_rows)[seq] : (long long)seq;
    float* seg_states = (float*)p.segment_states;
    const int total = (count - 1) * TILES;  // tiles over every step
    // Tile k: columns (k % TILES) MC .. of M_{k / TILES} into buffer k & 1.
    auto issue = [&](int k) {
        const long long seg_head = (long long)(first + k / TILES) * p.value_heads + head;
        const float* m = (const float*)p.transition_m + seg_head * KP * KP + (k % TILES) * MC;
#pragma unroll
        for (int q = 0; q < PIECES; ++q) {
            const int piece = threadIdx.x + 256 * q;
            const int r = piece / (MC / 4), c = 4 * (piece % (MC / 4));
            cp_async16(&m_tile[k & 1][r][c], m + (long long)r * KP + c);
        }
        cp_async_commit();
    };
    if (total > 0) issue(0);

    for (int i = 0; i < ROWS; ++i) {
        const int r = group + ROW_GROUPS * i, c = col0 + col;
        const float x = initial_state_element(p, state_row, head, r, c);
        entry[r][col] = x;
        seg_states[segment_state_index<KP>(p, first, head, r, c)] = x;
    }
    float acc[ROWS], d_values[ROWS];
    for (int k = 0; k < total; ++k) {
        const int step = k / TILES, tile = k % TILES;
        const long long seg_head = (long long)(first + step) * p.value_heads + head;
        if (tile == 0) {
            // D_s's entries of this thread, loaded now and added after the step's last tile.
            const float* d = (const float*)p.transition_d + seg_head * KP * p.value_pad;
#pragma unroll
            for (int i = 0; i < ROWS; ++i) {
                acc[i] = 0.0f;
                d_values[i] = d[(long long)(group + ROW_GROUPS * i) * p.value_pad + col0 + col];
            }
        }
        if (k + 1 < total) {
            issue(k + 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        // Tile k has landed for every thread (and, at k = 0, the entry state is written).
        __syncthreads();
#pragma unroll
        for (int mm = 0; mm < MC; mm += 4) {
            float e[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) e[j] = entry[tile * MC + mm + j][col];
#pragma unroll
            for (int i = 0; i < ROWS; ++i) {
                const float4 m = *(const float4*)&m_tile[k & 1][group + ROW_GROUPS * i][mm];
                acc[i] += m.x * e[0] + m.y * e[1] + m.z * e[2] + m.w * e[3];
            }
        }
        if (tile == TILES - 1) {
            // Every thread is done with S_s before it becomes S_{s+1}.
            __syncthreads();
#pragma unroll
            for (int i = 0; i < ROWS; ++i) {
                const int r = group + ROW_GROUPS * i, c = col0 + col;
                const float x = acc[i] + d_values[i];
                entry[r][col] = x;
                seg_states[((seg_head + p.value_heads) * KP + r) * p.value_pad + c] = x;
            }
        }
        // Buffer k & 1 is free for tile k + 2, and a new entry state is visible.
        __syncthreads();
    }
}

#define PF_COMBINE_ENTRY_POINT(KP)                                                            \
    extern "C" __global__ void __launch_bounds__(256) gdn_prefill_combine_k##KP(PrefillParams p) { \
        combine_impl<KP>(p);                                                                  \
    }

PF_COMBINE_ENTRY_POINT(64)
PF_COMBINE_ENTRY_POINT(128)
PF_COMBINE_ENTRY_POINT(256)

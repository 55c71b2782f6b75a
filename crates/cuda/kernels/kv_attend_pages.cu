// Flash-decoding on tensor cores, pages form (appended to kv_attend.cu and kv_attend_mma.cu in
// one module: the math per 16-token tile is kvm_step's). The tiles form keeps one 16-token
// tile per warp in flight from global memory into registers; here every warp owns a quarter of
// its split's 16-token tiles (a contiguous run, so the warps' shares differ by at most one
// tile) and streams them, one page piece at a time, into its own ring of KVP_STAGES page
// sections in shared memory by bulk copies (`cp.async.bulk`, completion on the warp's
// mbarrier): a whole page's section of its KV head (both code streams and both norm sections:
// one contiguous range of head_words words) in one copy, a part of a page in four (the piece's
// rows of each). Lane 0 issues the copies KVP_STAGES pieces ahead, with each page's
// block-table entry read one copy early, so the table read never sits in front of a copy; no
// block barrier in the loop. The tiles are then read from the ring, and the score B fragments
// stay in registers (d <= 128).
//
// Dynamic shared memory: the rings [KVM_WARPS][KVP_STAGES][head_words] (128-byte aligned),
// then q, qin, bq_s as in the tiles form; the warps' partial outputs reuse the rings at the end.
// Needs page_tokens a multiple of 16 and 16-byte aligned sections (the pool's base).

#define KVP_STAGES 2

__device__ __forceinline__ void kvp_bar_init(unsigned long long* bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// Arrives on `bar`, which then expects `bytes` from bulk copies.
__device__ __forceinline__ void kvp_expect(unsigned long long* bar, unsigned bytes) {
    asm volatile("{ .reg .b64 state; mbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1; }"
                 ::"r"(shared_address(bar)), "r"(bytes) : "memory");
}

// One bulk copy of `bytes` (a multiple of 16, both addresses 16-byte aligned) into shared
// memory, completing its bytes on `bar`.
__device__ __forceinline__ void kvp_bulk_copy(void* dst, const void* src, unsigned bytes,
                                              unsigned long long* bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
        ::"r"(shared_address(dst)), "l"(src), "r"(bytes), "r"(shared_address(bar)) : "memory");
}

// Tiles la .. lb - 1 of a page's section of the KV head (`src`) into the same places of a
// stage: the whole section in one copy when the piece is the whole page, else its four parts
// (key codes, value codes, key norms, value norms: 16-token runs stay 16-byte multiples).
__device__ __forceinline__ void kvp_copy_piece(const KvAttnParams& p, unsigned* stage,
                                               const unsigned* src, int la, int lb,
                                               unsigned long long* bar) {
    // Opaque to the compiler: what it would derive from these ahead of the loop and hold in
    // registers through it (the d = 128 kernels with 8-bit values spilled), it forms here, once
    // per page.
    int P = p.page_tokens, rk = p.row_words_k, rv = p.row_words_v, norm_bytes = p.norm_f16 ? 2 : 4;
    unsigned section_bytes = 4u * p.head_words;
    asm volatile("" : "+r"(P), "+r"(rk), "+r"(rv), "+r"(norm_bytes), "+r"(section_bytes));
    if (la == 0 && lb * KVM_TILE == P) {
        kvp_expect(bar, section_bytes);
        kvp_bulk_copy(stage, src, section_bytes, bar);
        return;
    }
    const int t0 = la * KVM_TILE, tokens = (lb - la) * KVM_TILE;
    const unsigned kbytes = 4u * tokens * rk, vbytes = 4u * tokens * rv;
    const unsigned nbytes = (unsigned)(tokens * norm_bytes);
    kvp_expect(bar, kbytes + vbytes + 2 * nbytes);
    kvp_bulk_copy(stage + t0 * rk, src + t0 * rk, kbytes, bar);
    const int v0 = P * rk + t0 * rv;
    kvp_bulk_copy(stage + v0, src + v0, vbytes, bar);
    const int n0 = P * (rk + rv);
#pragma unroll
    for (int kv = 0; kv < 2; ++kv) {
        const int at = n0 + kv * p.norm_words;
        kvp_bulk_copy((unsigned char*)(stage + at) + t0 * norm_bytes,
                      (const unsigned char*)(src + at) + t0 * norm_bytes, nbytes, bar);
    }
}

// The warp's tiles wt0 .. wt1 - 1 (of the sequence) in page-sized pieces: piece i is page
// pg0 + i, its tiles la .. lb - 1 (within the page) the warp's.
struct KvpRange {
    int wt0, wt1, pg0, pieces, tiles_per_page;
    __device__ __forceinline__ void piece(int i, int& la, int& lb) const {
        const int first = (pg0 + i) * tiles_per_page;
        la = max(wt0 - first, 0);
        lb = min(wt1 - first, tiles_per_page);
    }
};

__device__ __forceinline__ void kvp_bar_wait(unsigned long long* bar, unsigned phase) {
    unsigned done = 0;
    while (!done) {
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
            : "=r"(done) : "r"(shared_address(bar)), "r"(phase) : "memory");
    }
}

// One tile's codes and norms from a staged page section (rows `off` .. off + 15 of the page;
// `first` is the tile's first token in the sequence).
template <int BK, int BV, int DP>
__device__ __forceinline__ void kvp_load(const KvAttnParams& p, const unsigned* sec, int off,
                                         int first, int len, int gid, int tig,
                                         KvmTile<DP / 4 * BK / 32, (DP / 8 * BV + 31) / 32>& x) {
    constexpr int KW = DP / 4 * BK / 32, VBITS = DP / 8 * BV, VW = (VBITS + 31) / 32;
    const unsigned* kcodes = sec + off * p.row_words_k;
    const unsigned* vcodes = sec + p.page_tokens * p.row_words_k + off * p.row_words_v;
    const unsigned* norms = sec + p.page_tokens * (p.row_words_k + p.row_words_v);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int tok = gid + 8 * i;
        kvm_words<KW>(kcodes + tok * p.row_words_k, KW * tig, p.row_words_k, x.k[i]);
        const int at = off + tok;
        float kn, vn;
        if (p.norm_f16) {
            kn = f16_to_f32(((const unsigned short*)norms)[at]);
            vn = f16_to_f32(((const unsigned short*)(norms + p.norm_words))[at]);
        } else {
            kn = __uint_as_float(norms[at]);
            vn = __uint_as_float(norms[p.norm_words + at]);
        }
        x.kn[i] = kn;
        x.vn[i] = first + tok < len ? vn : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const unsigned* row = vcodes + (tig + 4 * i) * p.row_words_v;
        if (VBITS < 32) {
            // Half a word: lanes gid and gid ^ 1 share one.
            unsigned w[1];
            kvm_words<1>(row, VBITS * gid / 32, p.row_words_v, w);
            x.v[i][0] = w[0] >> ((VBITS * gid) & 31);
        } else {
            kvm_words<VW>(row, VW * gid, p.row_words_v, x.v[i]);
        }
    }
}

// Lane 0 issues the warp's piece `it` (if any) into stage `stage` and reads the table entry
// of the piece after it (`next_page` holds piece it's).
__device__ __forceinline__ void kvp_issue(const KvAttnParams& p, const int* table_row,
                                         const KvpRange& range, unsigned* ring,
                                         unsigned long long* bar, int stage, int it,
                                         int& next_page) {
    if (it >= range.pieces) return;
    const long long page = next_page;
    if (it + 1 < range.pieces) next_page = table_row[range.pg0 + it + 1];
    // The head's section offset formed here, not held in a register through the loop.
    const unsigned* head0 = p.pool + (long long)(blockIdx.y / p.row_chunks) * p.head_words;
    int la, lb;
    range.piece(it, la, lb);
    kvp_copy_piece(p, ring + stage * p.head_words, head0 + page * p.page_words, la, lb, bar);
}

// Lane 0 refills stage `stage` (done with by every lane) with the warp's piece `it`, if any.
__device__ __forceinline__ void kvp_refill(const KvAttnParams& p, const int* table_row,
                                          const KvpRange& range, unsigned* ring,
                                          unsigned long long* bar, int stage, int it,
                                          int& next_page) {
    __syncwarp();
    if ((threadIdx.x & 31) == 0 && it < range.pieces) {
        // The lanes' reads of the stage come before the copy's writes.
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        kvp_issue(p, table_row, range, ring, bar, stage, it, next_page);
    }
}

template <int BK, int BV, int DP>
__device__ __forceinline__ void kvp_pass1(const KvAttnParams& p) {
    constexpr int ROWS = 4, KM = DP / 8;
    constexpr int KW = DP / 4 * BK / 32, VW = (DP / 8 * BV + 31) / 32;
    constexpr bool QREG = DP <= 128;  // the score fragments in registers
    // Softmax steps of two tiles where both tiles' codes fit the registers beside the rest.
    constexpr bool STEP2 = DP <= 128 && KW <= 4 && (DP < 128 || VW == 1);
    __shared__ KvmShared st;
    __shared__ __align__(8) unsigned long long full[KVM_WARPS][KVP_STAGES];
    extern __shared__ __align__(128) unsigned char kvp_smem[];
    const int section_words = p.head_words;
    unsigned* rings = (unsigned*)kvp_smem;
    float* q = (float*)(rings + KVM_WARPS * KVP_STAGES * section_words);
    float* qin = q + ROWS * DP;
    uint2* bq_s = (uint2*)(qin + ROWS * DP);  // [KM][32 lanes]
    const int split = blockIdx.x, h = blockIdx.y / p.row_chunks, chunk = blockIdx.y % p.row_chunks;
    const int b = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;

    KvmEarly<BK, BV, DP> early;
    kvm_early_loads<BK, BV, DP>(p, b, h, chunk, early);
    // The split's tiles and this warp's quarter of them (balanced to a tile, whatever the page
    // size), in page pieces; its first copies go out before the prologue.
    const int len = p.seq_lens[b];
    const int reach = kvm_reach(p, len, chunk);
    const int P = p.page_tokens;
    const int tiles = (reach + KVM_TILE - 1) / KVM_TILE;
    const int all_tiles = (len + KVM_TILE - 1) / KVM_TILE;
    const int per_split = (all_tiles + p.splits - 1) / p.splits;
    const int st0 = split * per_split, n_split = max(min(st0 + per_split, tiles) - st0, 0);
    // The range lives in shared memory, read where used: held in registers through the loop,
    // its five values spill the d = 128 kernels with 8-bit values.
    __shared__ KvpRange ranges[KVM_WARPS];
    KvpRange& range = ranges[warp];
    if (lane == 0) {
        range.tiles_per_page = P / KVM_TILE;
        range.wt0 = st0 + n_split * warp / KVM_WARPS;
        range.wt1 = st0 + n_split * (warp + 1) / KVM_WARPS;
        range.pg0 = range.wt0 / range.tiles_per_page;
        range.pieces =
            range.wt1 > range.wt0 ? (range.wt1 - 1) / range.tiles_per_page - range.pg0 + 1 : 0;
    }
    __syncwarp();
    const int* table_row = p.block_table + (long long)b * p.max_pages;
    unsigned* ring = rings + warp * KVP_STAGES * section_words;
    int next_page = 0;  // lane 0: the table entry of the next piece
    if (lane == 0) {
#pragma unroll
        for (int s = 0; s < KVP_STAGES; ++s) kvp_bar_init(&full[warp][s]);
        if (range.pieces > 0) next_page = table_row[range.pg0];
#pragma unroll
        for (int s = 0; s < KVP_STAGES; ++s)
            kvp_issue(p, table_row, range, ring, &full[warp][s], s, s, next_page);
    }
    kvm_prologue<BK, BV, DP>(p, st, early, q, qin, bq_s, b, h, chunk);  // barriers publish the mbarriers
    uint2 bq_r[QREG ? KM : 1];
    if (QREG) {
#pragma unroll
        for (int m = 0; m < KM; ++m) bq_r[m] = bq_s[(QREG ? m : 0) * 32 + lane];
    }
    KvmRun<DP / 16> run;
    kvm_run_init(p, st, len, chunk, run);
    for (int it = 0; it < range.pieces; ++it) {
        const int stage = it % KVP_STAGES;
        kvp_bar_wait(&full[warp][stage], (it / KVP_STAGES) & 1);
        const unsigned* sec = ring + stage * section_words;
        const int page_first = (range.pg0 + it) * P;
        int la, lb;
        range.piece(it, la, lb);
        int off = la * KVM_TILE;
        const int end = lb * KVM_TILE;
        if (STEP2) {
            // Two tiles per softmax step while both are the warp's.
            for (; off + KVM_TILE < end; off += 2 * KVM_TILE) {
                KvmTile<KW, VW> cur[2];
                kvp_load<BK, BV, DP>(p, sec, off, page_first + off, len, gid, tig, cur[0]);
                kvp_load<BK, BV, DP>(p, sec, off + KVM_TILE, page_first + off + KVM_TILE, len, gid,
                                     tig, cur[1]);
                kvm_step<BK, BV, DP, QREG, 2>(st, bq_s, bq_r, cur, page_first + off, run);
            }
        }
        for (; off < end; off += KVM_TILE) {
            KvmTile<KW, VW> cur[1];
            kvp_load<BK, BV, DP>(p, sec, off, page_first + off, len, gid, tig, cur[0]);
            kvm_step<BK, BV, DP, QREG, 1>(st, bq_s, bq_r, cur, page_first + off, run);
        }
        kvp_refill(p, table_row, range, ring, &full[warp][stage], stage, it + KVP_STAGES,
                   next_page);
    }
    // Every copy has been waited for; the rings hold the warps' partial outputs from here.
    __syncthreads();
    kvm_finish<DP>(p, st, run, (float*)rings);
}

#define KVP_KERNEL(BK, BV, DP, MIN_BLOCKS)                                 \
    extern "C" __global__ void __launch_bounds__(KV_THREADS, MIN_BLOCKS)  \
        kv_attend_pages_k##BK##v##BV##_d##DP(KvAttnParams p) {            \
        kvp_pass1<BK, BV, DP>(p);                                          \
    }
#define KVP_KERNELS(BK, BV)    \
    KVP_KERNEL(BK, BV, 64, 3)  \
    KVP_KERNEL(BK, BV, 128, 3) \
    KVP_KERNEL(BK, BV, 256, 1)
#define KVP_KERNELS_OF(BK, BV) KVP_KERNELS(BK, BV)
KVP_KERNELS_OF(KVM_BK, KVM_BV)

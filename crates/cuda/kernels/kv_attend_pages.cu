// Flash-decoding on tensor cores, pages form (appended to kv_attend.cu, kv_attend_mma.cu and
// kv_attend_block.cu in one module: the math per 16-token tile is kvm_step's). The tiles form keeps one 16-token
// tile per warp in flight from global memory into registers; here every warp owns whole pages
// of its split (pages pg0 + warp, + 4, ...) and streams each page's section of its KV head
// (both code streams and both norm sections: one contiguous range of head_words words) into
// its own ring of KVP_STAGES sections in shared memory with one bulk copy (`cp.async.bulk`,
// completion on the warp's mbarrier). Lane 0 issues the copies KVP_STAGES pages ahead, with
// each page's block-table entry read one copy early, so the table read never sits in front of
// a copy; no block barrier in the loop. The tiles are then read from the ring, and the score B
// fragments stay in registers (d <= 128).
//
// Dynamic shared memory: the rings [KVM_WARPS][KVP_STAGES][head_words] (128-byte aligned),
// then q, qin, bq_s as in the tiles form; the warps' partial outputs reuse the rings at the end.
// Needs page_tokens a multiple of 16 and 16-byte aligned sections (the pool's base).

#define KVP_STAGES 2

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

// Lane 0 refills stage `stage` (done with by every lane) with the warp's copy `it`, if any,
// and reads the table entry of the copy after it.
__device__ __forceinline__ void kvp_refill(const KvAttnParams& p, const int* table_row,
                                          unsigned* ring,
                                          unsigned long long* bar, int stage, int it, int n_mine,
                                          int first_mine, int& next_page) {
    __syncwarp();
    if ((threadIdx.x & 31) == 0 && it < n_mine) {
        // The lanes' reads of the stage come before the copy's writes.
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        const long long page = next_page;
        if (it + 1 < n_mine) next_page = table_row[first_mine + KVM_WARPS * (it + 1)];
        // The head's section offset formed here, not held in a register through the loop.
        const unsigned* head0 = p.pool + (long long)(blockIdx.y / p.row_chunks) * p.head_words;
        bulk_expect(bar, 4u * p.head_words);
        bulk_load(ring + stage * p.head_words, head0 + page * p.page_words, 4u * p.head_words, bar);
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
    // The split's pages and this warp's share; its first copies go out before the prologue.
    const int len = p.seq_lens[b];
    const int reach = kvm_reach(p, len, chunk);
    const int P = p.page_tokens;
    const int pages = (reach + P - 1) / P;
    const int all_pages = (len + P - 1) / P;
    const int per_split = (all_pages + p.splits - 1) / p.splits;
    const int pg0 = split * per_split, pg1 = min(pg0 + per_split, pages);
    const int first_mine = pg0 + warp;
    const int n_mine = first_mine < pg1 ? (pg1 - first_mine + KVM_WARPS - 1) / KVM_WARPS : 0;
    const int* table_row = p.block_table + (long long)b * p.max_pages;
    const unsigned* head0 = p.pool + (long long)h * p.head_words;
    unsigned* ring = rings + warp * KVP_STAGES * section_words;
    const unsigned section_bytes = 4u * section_words;
    int next_page = 0;  // lane 0: the table entry of the next copy
    if (lane == 0) {
#pragma unroll
        for (int s = 0; s < KVP_STAGES; ++s) bulk_barrier_init(&full[warp][s]);
        if (n_mine > 0) next_page = table_row[first_mine];
        for (int s = 0; s < KVP_STAGES && s < n_mine; ++s) {
            const long long page = next_page;
            if (s + 1 < n_mine) next_page = table_row[first_mine + KVM_WARPS * (s + 1)];
            bulk_expect(&full[warp][s], section_bytes);
            bulk_load(ring + s * section_words, head0 + page * p.page_words, section_bytes, &full[warp][s]);
        }
    }
    kvm_prologue<BK, BV, DP>(p, st, early, q, qin, bq_s, b, h, chunk);  // barriers publish the mbarriers
    uint2 bq_r[QREG ? KM : 1];
    if (QREG) {
#pragma unroll
        for (int m = 0; m < KM; ++m) bq_r[m] = bq_s[(QREG ? m : 0) * 32 + lane];
    }
    KvmRun<DP / 16> run;
    kvm_run_init(p, st, len, chunk, run);
    for (int it = 0; it < n_mine; ++it) {
        const int stage = it % KVP_STAGES;
        bulk_wait(&full[warp][stage], (it / KVP_STAGES) & 1);
        const unsigned* sec = ring + stage * section_words;
        const int page_first = (first_mine + KVM_WARPS * it) * P;
        int off = 0;
        if (STEP2) {
            // Two tiles per softmax step while both lie in the page and the rows' reach.
            for (; off + KVM_TILE < P && page_first + off + KVM_TILE < reach; off += 2 * KVM_TILE) {
                KvmTile<KW, VW> cur[2];
                kvp_load<BK, BV, DP>(p, sec, off, page_first + off, len, gid, tig, cur[0]);
                kvp_load<BK, BV, DP>(p, sec, off + KVM_TILE, page_first + off + KVM_TILE, len, gid,
                                     tig, cur[1]);
                kvm_step<BK, BV, DP, QREG, 2>(st, bq_s, bq_r, cur, page_first + off, run);
            }
        }
        for (; off < P && page_first + off < reach; off += KVM_TILE) {
            KvmTile<KW, VW> cur[1];
            kvp_load<BK, BV, DP>(p, sec, off, page_first + off, len, gid, tig, cur[0]);
            kvm_step<BK, BV, DP, QREG, 1>(st, bq_s, bq_r, cur, page_first + off, run);
        }
        kvp_refill(p, table_row, ring, &full[warp][stage], stage, it + KVP_STAGES, n_mine,
                   first_mine, next_page);
    }
    // Every copy has been waited for; the rings hold the warps' partial outputs from here.
    __syncthreads();
    kvm_finish<DP>(p, st, run, (float*)rings);
}

// The pages form's kernels (KVM_FORM_KERNELS_OF: kv_attend_block.cu).
KVM_FORM_KERNELS_OF(pages, kvp_pass1, KVM_BK, KVM_BV, 3, 3, 1)

// Lab candidate v3 of the tensor-core attention pass 1 (included by kv_lab.cu after
// kv_attend.cu and kv_attend_mma.cu, whose helpers it uses).
//
// The v2 math per 16-token tile, fed differently: every warp owns whole pages of its split
// (pages pg0 + warp, + 4, ...) and streams each page's section of its KV head (codes of both
// streams and both norm sections: one contiguous range, 6272 bytes at d 128, 4/2 bits, f32
// norms) into its own shared-memory ring of STAGES pages with one bulk copy (`cp.async.bulk`,
// completion on the warp's mbarrier). Lane 0 issues the copies, STAGES pages ahead, with the
// next page's block-table entry loaded one issue early; no block barrier in the loop. Codes are
// then read from the ring (two 16-byte loads per lane for keys). With QREG the score B
// fragments (q hi/lo) stay in registers for the whole block instead of being loaded per tile.
//
// v2 kept one 16-token tile per warp in flight (~27 KB per SM); v3 keeps up to STAGES pages of
// 64 tokens per warp (~100 KB per SM at 12 warps), and the table read is off the load's path.

__device__ __forceinline__ void kv3_bar_init(unsigned long long* bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void kv3_bulk_load(void* dst, const void* src, unsigned bytes,
                                              unsigned long long* bar) {
    asm volatile("{ .reg .b64 state; mbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1; }"
                 ::"r"(shared_address(bar)), "r"(bytes) : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
        ::"r"(shared_address(dst)), "l"(src), "r"(bytes), "r"(shared_address(bar)) : "memory");
}
// Spins on the mbarrier's phase; a copy that never lands traps (the lab reports a launch
// failure) rather than hanging the run.
__device__ __forceinline__ void kv3_bar_wait(unsigned long long* bar, unsigned phase) {
    unsigned done = 0;
    for (long long tries = 0; !done; ++tries) {
        if (tries > (1ll << 22)) __trap();
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
            : "=r"(done) : "r"(shared_address(bar)), "r"(phase) : "memory");
    }
}

// One tile's codes and norms from a staged page section (rows `off` .. off + 15 of the page;
// `first` is the tile's first token in the sequence).
template <int BK, int BV, int DP>
__device__ __forceinline__ void kv3_load(const KvAttnParams& p, const unsigned* sec, int off,
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
        const int tok = tig + 4 * i;
        const unsigned* row = vcodes + tok * p.row_words_v;
        if (VBITS < 32) {
            unsigned w[1];
            kvm_words<1>(row, VBITS * gid / 32, p.row_words_v, w);
            x.v[i][0] = w[0] >> ((VBITS * gid) & 31);
        } else {
            kvm_words<VW>(row, VW * gid, p.row_words_v, x.v[i]);
        }
    }
}

// MOVE_ONLY: the same page movement with no math (each lane reads one word per tile): the
// data-movement floor of this structure; its outputs are not attention (no check).
// LOOKUP_ONLY: the movement, each tile's codes and norms in registers, and every level-table
// read the products need (a 4-byte hi | lo word per key code, an 8-byte pair per two 2-bit
// value codes), folded by XOR into one word and no other math: the floor of any pass 1 that
// reads a level per code from shared memory; its outputs are not attention (no check).
template <int BK, int BV, int DP, int STAGES, bool QREG, bool MOVE_ONLY = false,
          bool LOOKUP_ONLY = false>
__device__ __forceinline__ void kv3_pass1(const KvAttnParams& p) {
    constexpr int ROWS = 4;
    constexpr int KM = DP / 8;
    constexpr int VM = DP / 16;
    constexpr int KW = DP / 4 * BK / 32, VW = (DP / 8 * BV + 31) / 32;
    __shared__ unsigned table_k[256];
    __shared__ unsigned table_v[256];
    __shared__ uint2 table_v2[16];
    __shared__ float w_s[KVM_WARPS][KVM_TILE][ROWS];
    __shared__ float ml_s[KVM_WARPS][ROWS][2];
    __shared__ float row_scale_s[ROWS];
    __shared__ __align__(8) unsigned long long full[KVM_WARPS][STAGES];
    extern __shared__ __align__(128) unsigned char kv3_smem[];
    const int section_words = p.head_words;
    unsigned* ring = (unsigned*)kv3_smem;  // [warps][STAGES][head_words]
    float* base = (float*)(kv3_smem + 4 * KVM_WARPS * STAGES * section_words);
    KvSmem sm;
    sm.q = base;
    sm.qin = base + ROWS * DP;
    float* red = base + 2 * ROWS * DP;
    uint2* bq_s = (uint2*)(red + KVM_WARPS * ROWS * DP);
    const int split = blockIdx.x, h = blockIdx.y / p.row_chunks, chunk = blockIdx.y % p.row_chunks;
    const int b = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;

    // The split's pages and this warp's share; the first copies go out before the prologue.
    const int len = p.seq_lens[b];
    int reach = 0;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const int row = chunk * ROWS + r;
        reach = max(reach, row < p.rows ? len - p.tq + row / p.group + 1 : 0);
    }
    const int P = p.page_tokens;
    const int pages = (reach + P - 1) / P;
    const int all_pages = (len + P - 1) / P;
    const int per_split = (all_pages + p.splits - 1) / p.splits;
    const int pg0 = split * per_split, pg1 = min(pg0 + per_split, pages);
    const int first_mine = pg0 + warp;
    const int n_mine = first_mine < pg1 ? (pg1 - first_mine + KVM_WARPS - 1) / KVM_WARPS : 0;
    const int* table_row = p.block_table + (long long)b * p.max_pages;
    const unsigned* head0 = p.pool + (long long)h * p.head_words;
    unsigned* my_ring = ring + warp * STAGES * section_words;
    const unsigned section_bytes = 4u * section_words;
    long long next_page = 0;
    if (lane == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) kv3_bar_init(&full[warp][s]);
        if (n_mine > 0) next_page = table_row[first_mine];
        for (int s = 0; s < STAGES && s < n_mine; ++s) {
            const long long page = next_page;
            if (s + 1 < n_mine) next_page = table_row[first_mine + KVM_WARPS * (s + 1)];
            kv3_bulk_load(my_ring + s * section_words, head0 + page * p.page_words, section_bytes,
                          &full[warp][s]);
        }
    }

    for (int i = threadIdx.x; i < (1 << BK); i += KV_THREADS)
        table_k[i] = kvm_split(p.consts[i] * p.level_scale_k);
    for (int i = threadIdx.x; i < (1 << BV); i += KV_THREADS)
        table_v[i] = kvm_split(p.consts[512 + i] * p.level_scale_v);
    if (BV == 2 && threadIdx.x < 16)
        table_v2[threadIdx.x] = make_uint2(kvm_split(p.consts[512 + (threadIdx.x & 3)] * p.level_scale_v),
                                           kvm_split(p.consts[512 + (threadIdx.x >> 2)] * p.level_scale_v));
    kv_rotate_queries<ROWS>(p, sm, b, h, chunk);
    {
        float mx = 0.0f;
        for (int c = lane; c < DP; c += 32) mx = fmaxf(mx, fabsf(sm.q[warp * DP + c]));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(KV_FULLMASK, mx, o));
        if (lane == 0) row_scale_s[warp] = mx > 0.0f ? ldexpf(1.0f, min(-ilogbf(mx), 126)) : 1.0f;
    }
    __syncthreads();
    const bool lo_col = gid >= 4;
    const int my_row = gid & 3;
    if (warp == 0) {
        const float rs = row_scale_s[my_row];
        const float* qr = sm.q + my_row * DP + DP / 4 * tig;
        for (int m = 0; m < KM; ++m)
            bq_s[m * 32 + lane] = make_uint2(kvm_bword(qr[2 * m] * rs, lo_col),
                                             kvm_bword(qr[2 * m + 1] * rs, lo_col));
    }
    __syncthreads();
    uint2 bq_r[QREG ? KM : 1];
    if (QREG) {
#pragma unroll
        for (int m = 0; m < KM; ++m) bq_r[m] = bq_s[m * 32 + lane];
    }
    const int ra = 2 * (tig & 1);
    int lim[2];
    float sfac[2];
#pragma unroll
    for (int y = 0; y < 2; ++y) {
        const int row = chunk * ROWS + ra + y;
        lim[y] = row < p.rows ? len - p.tq + row / p.group + 1 : 0;
        sfac[y] = KVM_LOG2E / (row_scale_s[ra + y] * p.level_scale_k);
    }

    float m_run[2] = {KV_NEG_INF, KV_NEG_INF}, l_run[2] = {0.0f, 0.0f};
    int e_run = -200;
    float acc[VM][4];
#pragma unroll
    for (int c = 0; c < VM; ++c) {
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[c][i] = 0.0f;
    }
    for (int it = 0; it < n_mine; ++it) {
        const int stage = it % STAGES;
        kv3_bar_wait(&full[warp][stage], (it / STAGES) & 1);
        const unsigned* sec = my_ring + stage * section_words;
        const int page_first = (first_mine + KVM_WARPS * it) * P;
        for (int off = 0; off < P && page_first + off < reach; off += KVM_TILE) {
            const int first = page_first + off;
            if (MOVE_ONLY) {
                acc[0][0] += __uint_as_float(sec[off * p.row_words_k + lane] & 0x3fffffffu);
                continue;
            }
            KvmTile<KW, VW> cur;
            kv3_load<BK, BV, DP>(p, sec, off, first, len, gid, tig, cur);
            if (LOOKUP_ONLY) {
                unsigned folded = __float_as_uint(cur.kn[0]) ^ __float_as_uint(cur.vn[1]);
#pragma unroll
                for (int m = 0; m < KM; ++m)
                    folded ^= kvm_table(table_k, kvm_off<BK>(cur.k[0], 2 * m)) ^
                              kvm_table(table_k, kvm_off<BK>(cur.k[1], 2 * m)) ^
                              kvm_table(table_k, kvm_off<BK>(cur.k[0], 2 * m + 1)) ^
                              kvm_table(table_k, kvm_off<BK>(cur.k[1], 2 * m + 1));
#pragma unroll
                for (int c = 0; c < VM; ++c) {
#pragma unroll
                    for (int st = 0; st < 2; ++st) {
                        const uint2 x = kvm_pair(table_v2, cur.v[2 * st][c / 8], c % 8);
                        const uint2 y = kvm_pair(table_v2, cur.v[2 * st + 1][c / 8], c % 8);
                        folded ^= x.x ^ x.y ^ y.x ^ y.y;
                    }
                }
                acc[0][0] += __uint_as_float(folded & 0x3fffffffu);
                continue;
            }
            float sc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
            for (int m = 0; m < KM; ++m) {
                const unsigned a0 = kvm_table(table_k, kvm_off<BK>(cur.k[0], 2 * m));
                const unsigned a1 = kvm_table(table_k, kvm_off<BK>(cur.k[1], 2 * m));
                const unsigned a2 = kvm_table(table_k, kvm_off<BK>(cur.k[0], 2 * m + 1));
                const unsigned a3 = kvm_table(table_k, kvm_off<BK>(cur.k[1], 2 * m + 1));
                const uint2 bq = QREG ? bq_r[QREG ? m : 0] : bq_s[m * 32 + lane];
                kvm_mma(sc[m & 1], a0, a1, a2, a3, bq.x, bq.y);
            }
            float s[2][2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
#pragma unroll
                for (int y = 0; y < 2; ++y) {
                    const float part = sc[0][2 * i + y] + sc[1][2 * i + y];
                    const float fullv = part + __shfl_xor_sync(KV_FULLMASK, part, 2);
                    const int token = first + gid + 8 * i;
                    s[i][y] = token < lim[y] ? fullv * cur.kn[i] * sfac[y] : KV_NEG_INF;
                }
            }
            float alpha[2], pw[2][2];
#pragma unroll
            for (int y = 0; y < 2; ++y) {
                float mt = fmaxf(s[0][y], s[1][y]);
#pragma unroll
                for (int o = 4; o < 32; o <<= 1) mt = fmaxf(mt, __shfl_xor_sync(KV_FULLMASK, mt, o));
                const float m_new = fmaxf(m_run[y], mt);
                alpha[y] = m_run[y] == KV_NEG_INF ? 0.0f : exp2f(m_run[y] - m_new);
                float sum = 0.0f;
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    pw[i][y] = s[i][y] == KV_NEG_INF ? 0.0f : exp2f(s[i][y] - m_new);
                    sum += pw[i][y];
                }
                l_run[y] = l_run[y] * alpha[y] + sum;
                m_run[y] = m_new;
            }
            float nmax = fmaxf(cur.vn[0], cur.vn[1]);
#pragma unroll
            for (int o = 4; o < 32; o <<= 1) nmax = fmaxf(nmax, __shfl_xor_sync(KV_FULLMASK, nmax, o));
            const int e_tile = nmax > 0.0f ? ilogbf(nmax) + 1 : -200;
            const int e_new = max(e_run, e_tile);
            const float gamma = ldexpf(1.0f, e_run - e_new);
            e_run = e_new;
            if (tig < 2) {
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    const float nv = ldexpf(cur.vn[i], -e_new);
#pragma unroll
                    for (int y = 0; y < 2; ++y) w_s[warp][gid + 8 * i][ra + y] = pw[i][y] * nv;
                }
            }
            __syncwarp();
            unsigned bw[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) bw[j] = kvm_bword(w_s[warp][tig + 4 * j][my_row], lo_col);
            __syncwarp();
            const float fa = alpha[0] * gamma, fb = alpha[1] * gamma;
#pragma unroll
            for (int c = 0; c < VM; ++c) {
                float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int st = 0; st < 2; ++st) {
                    if (BV == 2) {
                        const uint2 x = kvm_pair(table_v2, cur.v[2 * st][c / 8], c % 8);
                        const uint2 y = kvm_pair(table_v2, cur.v[2 * st + 1][c / 8], c % 8);
                        kvm_mma(d, x.x, x.y, y.x, y.y, bw[2 * st], bw[2 * st + 1]);
                    } else {
                        const unsigned a0 = kvm_table(table_v, kvm_off<BV>(cur.v[2 * st], 2 * c));
                        const unsigned a1 = kvm_table(table_v, kvm_off<BV>(cur.v[2 * st], 2 * c + 1));
                        const unsigned a2 = kvm_table(table_v, kvm_off<BV>(cur.v[2 * st + 1], 2 * c));
                        const unsigned a3 = kvm_table(table_v, kvm_off<BV>(cur.v[2 * st + 1], 2 * c + 1));
                        kvm_mma(d, a0, a1, a2, a3, bw[2 * st], bw[2 * st + 1]);
                    }
                }
                acc[c][0] = fmaf(acc[c][0], fa, d[0]);
                acc[c][1] = fmaf(acc[c][1], fb, d[1]);
                acc[c][2] = fmaf(acc[c][2], fa, d[2]);
                acc[c][3] = fmaf(acc[c][3], fb, d[3]);
            }
        }
        // Every lane is done with this stage: refill it with the page STAGES ahead.
        __syncwarp();
        if (lane == 0 && it + STAGES < n_mine) {
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            const long long page = next_page;
            if (it + STAGES + 1 < n_mine) next_page = table_row[first_mine + KVM_WARPS * (it + STAGES + 1)];
            kv3_bulk_load(my_ring + stage * section_words, head0 + page * p.page_words, section_bytes,
                          &full[warp][stage]);
        }
    }
#pragma unroll
    for (int y = 0; y < 2; ++y) {
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) l_run[y] += __shfl_xor_sync(KV_FULLMASK, l_run[y], o);
    }
    if (gid == 0 && tig < 2) {
#pragma unroll
        for (int y = 0; y < 2; ++y) {
            ml_s[warp][ra + y][0] = m_run[y];
            ml_s[warp][ra + y][1] = l_run[y];
        }
    }
    const float unscale = ldexpf(1.0f, e_run) / p.level_scale_v;
#pragma unroll
    for (int c = 0; c < VM; ++c) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float v = acc[c][i] + __shfl_xor_sync(KV_FULLMASK, acc[c][i], 2);
            if (tig < 2)
                red[(warp * ROWS + ra + (i & 1)) * DP + DP / 8 * gid + 2 * c + (i >> 1)] = v * unscale;
        }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < ROWS * DP; idx += KV_THREADS) {
        const int r = idx / DP, c = idx % DP, row = chunk * ROWS + r;
        if (row >= p.rows) continue;
        float m = KV_NEG_INF;
#pragma unroll
        for (int w = 0; w < KVM_WARPS; ++w) m = fmaxf(m, ml_s[w][r][0]);
        float sum = 0.0f, l = 0.0f;
        if (m != KV_NEG_INF) {
#pragma unroll
            for (int w = 0; w < KVM_WARPS; ++w) {
                const float mw = ml_s[w][r][0];
                if (mw == KV_NEG_INF) continue;
                const float f = exp2f(mw - m);
                sum = fmaf(red[(w * ROWS + r) * DP + c], f, sum);
                l = fmaf(ml_s[w][r][1], f, l);
            }
        }
        const int i = row / p.group, g = row % p.group;
        const long long out_row = ((long long)b * p.tq + i) * p.hq + h * p.group + g;
        const long long part = out_row * p.splits + split;
        p.part_acc[part * DP + c] = sum;
        if (c == 0) {
            p.part_ml[2 * part] = m;
            p.part_ml[2 * part + 1] = l;
        }
    }
}

// Dynamic shared memory of v3: the rings, then q, its rotation scratch, the warps' partial
// outputs and the q fragments (128 bytes per padded dimension, as v2).
static inline size_t kv3_smem_bytes(int stages, int head_words, int dim_pad) {
    return (size_t)4 * KVM_WARPS * stages * head_words + 128 * (size_t)dim_pad;
}

extern "C" __global__ void __launch_bounds__(KV_THREADS, 3) kv3_k4v2_d128_s2(KvAttnParams p) {
    kv3_pass1<4, 2, 128, 2, false>(p);
}
extern "C" __global__ void __launch_bounds__(KV_THREADS, 2) kv3_k4v2_d128_s3_qreg(KvAttnParams p) {
    kv3_pass1<4, 2, 128, 3, true>(p);
}
extern "C" __global__ void __launch_bounds__(KV_THREADS, 3) kv3_k4v2_d128_s2_move(KvAttnParams p) {
    kv3_pass1<4, 2, 128, 2, true, true>(p);
}
extern "C" __global__ void __launch_bounds__(KV_THREADS, 3) kv3_k4v2_d128_s2_lookups(KvAttnParams p) {
    kv3_pass1<4, 2, 128, 2, true, false, true>(p);
}


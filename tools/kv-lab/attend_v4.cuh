// Lab candidates v4 of the pages form (included by kv_lab.cu after the library's
// kv_attend_pages.cu, whose page ring, prologue, run and finish it uses as they are). What
// changes is how a 16-token tile's levels reach the tensor-core A fragments: from register
// tables through `prmt` (ALU) instead of one shared-memory table load per code (MIO).
//
// KP (4-bit keys): the 16 level words hi | lo << 16 as four byte planes, each plane's entries
// 0-7 and 8-15 in two register pairs (16 registers). Four codes (one nibble group of a code
// word) give, per plane, prmt(entries 0-7, codes) and prmt(entries 8-15, codes ^ 0x8888) joined
// by a mask of the codes >= 8 (one prmt in sign mode spreads each code's bit 3 over its byte),
// then two interleaving prmts per f16 half: 18 ALU instructions for 4 codes, no shared load
// (the library: 4 table loads and 8 offset instructions). The A words change shape: a0 = (hi of
// dimension x, hi of y), a2 = (lo of x, lo of y) for the step's dimensions x = 2m, y = 2m + 1,
// so the score B words become b0 = (q_hi x, q_hi y) | (q_lo x, q_lo y) and b1 = (q_hi x, q_hi y)
// | 0 for columns n < 4 | n >= 4: the same sums <Lk_hi + Lk_lo, q_hi> + <Lk_hi, q_lo>.
//
// VP (2-bit values): the four level words as four byte planes (4 registers). For the step's
// dimension e and the two tokens j, j' of one mma half, the selector (c_j, 4 + c_j, c_j',
// 4 + c_j') comes from the two code words interleaved by bytes (one prmt per 8 dimensions) and
// one mask and one imad per two dimensions; one prmt per f16 half then gives (hi c_j, hi c_j')
// and (lo c_j, lo c_j'): A = (hi j, hi j') | (lo j, lo j') with B = (W_hi j, W_hi j') | (W_lo j,
// W_lo j') and (W_hi j, W_hi j') | 0, in place of the library's two 8-byte pair-table loads per
// mma. KP and VP are masks (per group of 4 key dimensions, per value step), so that part of the
// decoding can stay on the shared-memory tables and the ALU and MIO pipes share the work.
//
// STEP32: two tiles per online-softmax step (see kv4_update32).
//
// Kernels that ptxas would spill at the 3-blocks-per-SM bound (168 registers) are left out:
// step32 without KP, with all keys or a quarter of them on KP.

__device__ __forceinline__ unsigned kv4_prmt(unsigned a, unsigned b, unsigned sel) {
    unsigned r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}

// Byte plane `plane` of the table words [first, first + 4) packed into one word.
__device__ __forceinline__ unsigned kv4_plane(const unsigned* table, int first, int plane) {
    unsigned w = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) w |= ((table[first + e] >> (8 * plane)) & 0xffu) << (8 * e);
    return w;
}

struct Kv4KeyTable {
    unsigned lo[4][2];  // plane p of entries 0-3, 4-7
    unsigned hi[4][2];  // plane p of entries 8-11, 12-15
};
struct Kv4ValTable {
    unsigned plane[4];  // plane p of entries 0-3
};

// Codes 4h .. 4h + 3 of a 4-bit code word w as A words: hi01 = (hi c0, hi c1), hi23, lo01, lo23.
__device__ __forceinline__ void kv4_keys4(const Kv4KeyTable& t, unsigned w, int h, unsigned& hi01,
                                          unsigned& hi23, unsigned& lo01, unsigned& lo23) {
    const unsigned sel = h ? w >> 16 : w;
    // Byte j 0xff where code j >= 8: its bit 3 is the sign bit of a byte of w or of w << 4.
    const unsigned big = kv4_prmt(w, w << 4, h ? 0xBFAEu : 0x9D8Cu);
    const unsigned sel_hi = sel ^ 0x8888u;
    unsigned pl[4];
#pragma unroll
    for (int p = 0; p < 4; ++p) {
        const unsigned a = kv4_prmt(t.lo[p][0], t.lo[p][1], sel);
        const unsigned b = kv4_prmt(t.hi[p][0], t.hi[p][1], sel_hi);
        pl[p] = (a & ~big) | (b & big);
    }
    hi01 = kv4_prmt(pl[0], pl[1], 0x5140u);
    hi23 = kv4_prmt(pl[0], pl[1], 0x7362u);
    lo01 = kv4_prmt(pl[2], pl[3], 0x5140u);
    lo23 = kv4_prmt(pl[2], pl[3], 0x7362u);
}

// The value A words (hi j, hi j') and (lo j, lo j') of dimension e (< 16) of the lane's code
// words wj, wk (tokens j, j'). The bytes of both tokens interleaved (one prmt per 8 dimensions),
// then one mask and one imad make the selectors of two dimensions (e and e + 4, in the two
// halves); written per dimension, the unrolled callers share these by common subexpressions.
__device__ __forceinline__ void kv4_vals(const Kv4ValTable& t, unsigned wj, unsigned wk, int e,
                                         unsigned& hi, unsigned& lo) {
    const unsigned both = kv4_prmt(wj, wk, e < 8 ? 0x5140u : 0x7362u);
    const int q = e % 4;
    const unsigned sel2 = ((both >> (2 * q)) & 0x03030303u) * 0x11u + 0x40404040u;
    const unsigned sel = (e % 8) < 4 ? sel2 : sel2 >> 16;
    hi = kv4_prmt(t.plane[0], t.plane[1], sel);
    lo = kv4_prmt(t.plane[2], t.plane[3], sel);
}

// Score B words, per step m (lane's dimensions x = DP/4 tig + 2m, y = x + 1): the KP shape for
// the steps of the groups in KP (bit m / 2), the library's (bq_s) for the others.
template <int DP, unsigned KP>
__device__ __forceinline__ void kv4_score_b(const float* q, const KvmShared& st, const uint2* bq_s,
                                            uint2 (&bk)[DP / 8]) {
    const int lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
    const bool lo_col = gid >= 4;
    const float rs = st.row_scale[gid & 3];
    const float* qr = q + (gid & 3) * DP + DP / 4 * tig;
#pragma unroll
    for (int m = 0; m < DP / 8; ++m) {
        const unsigned sx = kvm_split(qr[2 * m] * rs), sy = kvm_split(qr[2 * m + 1] * rs);
        const unsigned his = (sx & 0xffffu) | (sy << 16), los = (sx >> 16) | (sy & 0xffff0000u);
        bk[m] = (KP >> (m / 2)) & 1u ? (lo_col ? make_uint2(los, 0u) : make_uint2(his, his))
                                     : bq_s[m * 32 + lane];
    }
}

// KP: bit g set: the group of dimensions 4g .. 4g + 3 (steps 2g, 2g + 1) decoded by kv4_keys4,
// else by the library's table loads.
template <int BK, int DP, int KW, int VW, unsigned KP>
__device__ __forceinline__ void kv4_scores(const KvmShared& st, const uint2* bq, const Kv4KeyTable& kt,
                                           const KvmTile<KW, VW>& cur, float (&sc)[2][4]) {
    constexpr int KM = DP / 8;
    static_assert(KP == 0 || BK == 4, "register key tables: 4-bit keys");
#pragma unroll
    for (int i = 0; i < 4; ++i) sc[0][i] = sc[1][i] = 0.0f;
#pragma unroll
    for (int g = 0; g < KM / 2; ++g) {
        if ((KP >> g) & 1u) {
            unsigned h01[2], h23[2], l01[2], l23[2];
#pragma unroll
            for (int i = 0; i < 2; ++i)
                kv4_keys4(kt, cur.k[i][g / 2], g % 2, h01[i], h23[i], l01[i], l23[i]);
            kvm_mma(sc[0], h01[0], h01[1], l01[0], l01[1], bq[2 * g].x, bq[2 * g].y);
            kvm_mma(sc[1], h23[0], h23[1], l23[0], l23[1], bq[2 * g + 1].x, bq[2 * g + 1].y);
        } else {
#pragma unroll
            for (int m = 2 * g; m < 2 * g + 2; ++m) {
                const unsigned a0 = kvm_table(st.table_k, kvm_off<BK>(cur.k[0], 2 * m));
                const unsigned a1 = kvm_table(st.table_k, kvm_off<BK>(cur.k[1], 2 * m));
                const unsigned a2 = kvm_table(st.table_k, kvm_off<BK>(cur.k[0], 2 * m + 1));
                const unsigned a3 = kvm_table(st.table_k, kvm_off<BK>(cur.k[1], 2 * m + 1));
                kvm_mma(sc[m & 1], a0, a1, a2, a3, bq[m].x, bq[m].y);
            }
        }
    }
}

// kvm_update with the value A words from register tables (VP) and B words to match.
// VP: bit c set: value step c (dimensions 2c, 2c + 1) from the register table, else from the
// library's pair table (each with its own B words).
template <int BV, int DP, int KW, int VW, unsigned VP>
__device__ __forceinline__ void kv4_update(KvmShared& st, const Kv4ValTable& vt, const KvmTile<KW, VW>& cur,
                                           const float (&sc)[2][4], int first, KvmRun<DP / 16>& run) {
    constexpr int VM = DP / 16;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    const bool lo_col = gid >= 4;
    const int ra = 2 * (tig & 1);
    float s[2][2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int y = 0; y < 2; ++y) {
            const float part = sc[0][2 * i + y] + sc[1][2 * i + y];
            const float full = part + __shfl_xor_sync(KV_FULLMASK, part, 2);
            const int token = first + gid + 8 * i;
            s[i][y] = token < run.lim[y] ? full * cur.kn[i] * run.sfac[y] : KV_NEG_INF;
        }
    }
    float alpha[2], pw[2][2];
#pragma unroll
    for (int y = 0; y < 2; ++y) {
        float mt = fmaxf(s[0][y], s[1][y]);
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) mt = fmaxf(mt, __shfl_xor_sync(KV_FULLMASK, mt, o));
        const float m_new = fmaxf(run.m[y], mt);
        alpha[y] = run.m[y] == KV_NEG_INF ? 0.0f : exp2f(run.m[y] - m_new);
        float sum = 0.0f;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            pw[i][y] = s[i][y] == KV_NEG_INF ? 0.0f : exp2f(s[i][y] - m_new);
            sum += pw[i][y];
        }
        run.l[y] = run.l[y] * alpha[y] + sum;
        run.m[y] = m_new;
    }
    float nmax = fmaxf(cur.vn[0], cur.vn[1]);
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) nmax = fmaxf(nmax, __shfl_xor_sync(KV_FULLMASK, nmax, o));
    const int e_tile = nmax > 0.0f ? ilogbf(nmax) + 1 : -200;
    const int e_new = max(run.e, e_tile);
    const float gamma = ldexpf(1.0f, run.e - e_new);
    run.e = e_new;
    if (tig < 2) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const float nv = ldexpf(cur.vn[i], -e_new);
#pragma unroll
            for (int y = 0; y < 2; ++y) st.w[warp][gid + 8 * i][ra + y] = pw[i][y] * nv;
        }
    }
    __syncwarp();
    // The library's B words (tokens tig + 4 j) and the VP shape's (half sp: tokens j = tig + 8 sp,
    // j' = j + 4), from the same splits.
    unsigned bw[4], bp[4];
    {
        unsigned sw[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) sw[j] = kvm_split(st.w[warp][tig + 4 * j][gid & 3]);
#pragma unroll
        for (int j = 0; j < 4; ++j) bw[j] = lo_col ? (sw[j] >> 16) : ((sw[j] & 0xffffu) | (sw[j] << 16));
#pragma unroll
        for (int sp = 0; sp < 2; ++sp) {
            const unsigned sj = sw[2 * sp], sk = sw[2 * sp + 1];
            const unsigned his = (sj & 0xffffu) | (sk << 16), los = (sj >> 16) | (sk & 0xffff0000u);
            bp[2 * sp] = lo_col ? los : his;
            bp[2 * sp + 1] = lo_col ? 0u : his;
        }
    }
    __syncwarp();
    const float fa = alpha[0] * gamma, fb = alpha[1] * gamma;
#pragma unroll
    for (int c = 0; c < VM; ++c) {
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int sp = 0; sp < 2; ++sp) {
            static_assert(VP == 0 || BV == 2, "register value tables: 2-bit values");
            if ((VP >> c) & 1u) {
                // Dimensions 2c, 2c + 1: dimensions 2 (c % 8), + 1 of word c / 8.
                unsigned h0, l0, h1, l1;
                kv4_vals(vt, cur.v[2 * sp][c / 8], cur.v[2 * sp + 1][c / 8], 2 * (c % 8), h0, l0);
                kv4_vals(vt, cur.v[2 * sp][c / 8], cur.v[2 * sp + 1][c / 8], 2 * (c % 8) + 1, h1, l1);
                kvm_mma(d, h0, h1, l0, l1, bp[2 * sp], bp[2 * sp + 1]);
            } else {
                const uint2 x = kvm_pair(st.table_v2, cur.v[2 * sp][c / 8], c % 8);
                const uint2 y = kvm_pair(st.table_v2, cur.v[2 * sp + 1][c / 8], c % 8);
                kvm_mma(d, x.x, x.y, y.x, y.y, bw[2 * sp], bw[2 * sp + 1]);
            }
        }
        run.acc[c][0] = fmaf(run.acc[c][0], fa, d[0]);
        run.acc[c][1] = fmaf(run.acc[c][1], fb, d[1]);
        run.acc[c][2] = fmaf(run.acc[c][2], fa, d[2]);
        run.acc[c][3] = fmaf(run.acc[c][3], fb, d[3]);
    }
}

// STEP32: two 16-token tiles (tokens first .. first + 31) per softmax step: one max and one
// value-norm reduction (3 shuffles each) per 32 tokens instead of per 16, one rescale of the
// accumulators per 32 tokens (each value step's mma sums run over four mma), one exchange.
// w32: the warp's [32 tokens][4 rows] weights. sc, kn, vn, v: tile t's (kvm_update's shapes).
template <int BV, int DP, int VW, unsigned VP>
__device__ __forceinline__ void kv4_update32(KvmShared& st, float (*w32)[4], const Kv4ValTable& vt,
                                             const unsigned (&v)[2][4][VW], const float (&kn)[2][2],
                                             const float (&vn)[2][2], const float (&sc)[2][2][4],
                                             int first, KvmRun<DP / 16>& run) {
    constexpr int VM = DP / 16;
    const int lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
    const bool lo_col = gid >= 4;
    const int ra = 2 * (tig & 1);
    float s[2][2][2];  // tile t, token gid + 8 i, row ra + y
#pragma unroll
    for (int t = 0; t < 2; ++t) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
#pragma unroll
            for (int y = 0; y < 2; ++y) {
                const float part = sc[t][0][2 * i + y] + sc[t][1][2 * i + y];
                const float full = part + __shfl_xor_sync(KV_FULLMASK, part, 2);
                const int token = first + 16 * t + gid + 8 * i;
                s[t][i][y] = token < run.lim[y] ? full * kn[t][i] * run.sfac[y] : KV_NEG_INF;
            }
        }
    }
    float alpha[2], pw[2][2][2];
#pragma unroll
    for (int y = 0; y < 2; ++y) {
        float mt = fmaxf(fmaxf(s[0][0][y], s[0][1][y]), fmaxf(s[1][0][y], s[1][1][y]));
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) mt = fmaxf(mt, __shfl_xor_sync(KV_FULLMASK, mt, o));
        const float m_new = fmaxf(run.m[y], mt);
        alpha[y] = run.m[y] == KV_NEG_INF ? 0.0f : exp2f(run.m[y] - m_new);
        float sum = 0.0f;
#pragma unroll
        for (int t = 0; t < 2; ++t) {
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                pw[t][i][y] = s[t][i][y] == KV_NEG_INF ? 0.0f : exp2f(s[t][i][y] - m_new);
                sum += pw[t][i][y];
            }
        }
        run.l[y] = run.l[y] * alpha[y] + sum;
        run.m[y] = m_new;
    }
    float nmax = fmaxf(fmaxf(vn[0][0], vn[0][1]), fmaxf(vn[1][0], vn[1][1]));
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) nmax = fmaxf(nmax, __shfl_xor_sync(KV_FULLMASK, nmax, o));
    const int e_tile = nmax > 0.0f ? ilogbf(nmax) + 1 : -200;
    const int e_new = max(run.e, e_tile);
    const float gamma = ldexpf(1.0f, run.e - e_new);
    run.e = e_new;
    if (tig < 2) {
#pragma unroll
        for (int t = 0; t < 2; ++t) {
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const float nv = ldexpf(vn[t][i], -e_new);
                *(float2*)&w32[16 * t + gid + 8 * i][ra] = make_float2(pw[t][i][0] * nv, pw[t][i][1] * nv);
            }
        }
    }
    __syncwarp();
    unsigned bw[2][4], bp[2][4];
#pragma unroll
    for (int t = 0; t < 2; ++t) {
        unsigned sw[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) sw[j] = kvm_split(w32[16 * t + tig + 4 * j][gid & 3]);
#pragma unroll
        for (int j = 0; j < 4; ++j) bw[t][j] = lo_col ? (sw[j] >> 16) : ((sw[j] & 0xffffu) | (sw[j] << 16));
#pragma unroll
        for (int sp = 0; sp < 2; ++sp) {
            const unsigned sj = sw[2 * sp], sk = sw[2 * sp + 1];
            const unsigned his = (sj & 0xffffu) | (sk << 16), los = (sj >> 16) | (sk & 0xffff0000u);
            bp[t][2 * sp] = lo_col ? los : his;
            bp[t][2 * sp + 1] = lo_col ? 0u : his;
        }
    }
    __syncwarp();
    const float fa = alpha[0] * gamma, fb = alpha[1] * gamma;
#pragma unroll
    for (int c = 0; c < VM; ++c) {
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int t = 0; t < 2; ++t) {
#pragma unroll
            for (int sp = 0; sp < 2; ++sp) {
                static_assert(VP == 0 || BV == 2, "register value tables: 2-bit values");
                if ((VP >> c) & 1u) {
                    unsigned h0, l0, h1, l1;
                    kv4_vals(vt, v[t][2 * sp][c / 8], v[t][2 * sp + 1][c / 8], 2 * (c % 8), h0, l0);
                    kv4_vals(vt, v[t][2 * sp][c / 8], v[t][2 * sp + 1][c / 8], 2 * (c % 8) + 1, h1, l1);
                    kvm_mma(d, h0, h1, l0, l1, bp[t][2 * sp], bp[t][2 * sp + 1]);
                } else {
                    const uint2 x = kvm_pair(st.table_v2, v[t][2 * sp][c / 8], c % 8);
                    const uint2 y = kvm_pair(st.table_v2, v[t][2 * sp + 1][c / 8], c % 8);
                    kvm_mma(d, x.x, x.y, y.x, y.y, bw[t][2 * sp], bw[t][2 * sp + 1]);
                }
            }
        }
        run.acc[c][0] = fmaf(run.acc[c][0], fa, d[0]);
        run.acc[c][1] = fmaf(run.acc[c][1], fb, d[1]);
        run.acc[c][2] = fmaf(run.acc[c][2], fa, d[2]);
        run.acc[c][3] = fmaf(run.acc[c][3], fb, d[3]);
    }
}

// The library's pages pass 1 (kvp_pass1) with kv4's tile math; d <= 128 (B words in registers).
// STEP32 needs page_tokens a multiple of 32.
template <int BK, int BV, int DP, unsigned KP, unsigned VP, bool STEP32 = false>
__device__ __forceinline__ void kv4_pass1(const KvAttnParams& p) {
    constexpr int ROWS = 4, KM = DP / 8;
    constexpr int KW = DP / 4 * BK / 32, VW = (DP / 8 * BV + 31) / 32;
    static_assert(DP <= 128, "score B words in registers");
    __shared__ KvmShared st;
    __shared__ __align__(8) unsigned long long full[KVM_WARPS][KVP_STAGES];
    __shared__ __align__(16) float w32[STEP32 ? KVM_WARPS : 1][32][4];
    extern __shared__ __align__(128) unsigned char kv4_smem[];
    const int section_words = p.head_words;
    unsigned* rings = (unsigned*)kv4_smem;
    float* q = (float*)(rings + KVM_WARPS * KVP_STAGES * section_words);
    float* qin = q + ROWS * DP;
    uint2* bq_s = (uint2*)(qin + ROWS * DP);
    const int split = blockIdx.x, h = blockIdx.y / p.row_chunks, chunk = blockIdx.y % p.row_chunks;
    const int b = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
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
    long long next_page = 0;
    if (lane == 0) {
#pragma unroll
        for (int s = 0; s < KVP_STAGES; ++s) kvp_bar_init(&full[warp][s]);
        if (n_mine > 0) next_page = table_row[first_mine];
        for (int s = 0; s < KVP_STAGES && s < n_mine; ++s) {
            const long long page = next_page;
            if (s + 1 < n_mine) next_page = table_row[first_mine + KVM_WARPS * (s + 1)];
            kvp_bulk_load(ring + s * section_words, head0 + page * p.page_words, section_bytes,
                          &full[warp][s]);
        }
    }
    kvm_prologue<BK, BV, DP>(p, st, q, qin, bq_s, b, h, chunk);
    uint2 bq_r[KM];
    kv4_score_b<DP, KP>(q, st, bq_s, bq_r);
    Kv4KeyTable kt;
    Kv4ValTable vt;
    if (KP != 0) {
#pragma unroll
        for (int pl = 0; pl < 4; ++pl) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                kt.lo[pl][r] = kv4_plane(st.table_k, 4 * r, pl);
                kt.hi[pl][r] = kv4_plane(st.table_k, 8 + 4 * r, pl);
            }
        }
    }
    if (VP != 0) {
#pragma unroll
        for (int pl = 0; pl < 4; ++pl) vt.plane[pl] = kv4_plane(st.table_v, 0, pl);
    }
    KvmRun<DP / 16> run;
    kvm_run_init(p, st, len, chunk, run);
    for (int it = 0; it < n_mine; ++it) {
        const int stage = it % KVP_STAGES;
        kvp_bar_wait(&full[warp][stage], (it / KVP_STAGES) & 1);
        const unsigned* sec = ring + stage * section_words;
        const int page_first = (first_mine + KVM_WARPS * it) * P;
        for (int off = 0; off < P && page_first + off < reach; off += STEP32 ? 2 * KVM_TILE : KVM_TILE) {
            if (STEP32) {
                float sc[2][2][4], kn[2][2], vn[2][2];
                unsigned v[2][4][VW];
#pragma unroll
                for (int t = 0; t < 2; ++t) {
                    KvmTile<KW, VW> cur;
                    kvp_load<BK, BV, DP>(p, sec, off + KVM_TILE * t, page_first + off + KVM_TILE * t,
                                         len, gid, tig, cur);
                    kv4_scores<BK, DP, KW, VW, KP>(st, bq_r, kt, cur, sc[t]);
#pragma unroll
                    for (int i = 0; i < 2; ++i) {
                        kn[t][i] = cur.kn[i];
                        vn[t][i] = cur.vn[i];
                    }
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
#pragma unroll
                        for (int j = 0; j < VW; ++j) v[t][i][j] = cur.v[i][j];
                    }
                }
                kv4_update32<BV, DP, VW, VP>(st, w32[STEP32 ? warp : 0], vt, v, kn, vn, sc,
                                             page_first + off, run);
            } else {
                KvmTile<KW, VW> cur;
                kvp_load<BK, BV, DP>(p, sec, off, page_first + off, len, gid, tig, cur);
                float sc[2][4];
                kv4_scores<BK, DP, KW, VW, KP>(st, bq_r, kt, cur, sc);
                kv4_update<BV, DP, KW, VW, VP>(st, vt, cur, sc, page_first + off, run);
            }
        }
        kvp_refill(p, table_row, head0, ring, &full[warp][stage], stage, it + KVP_STAGES, n_mine,
                   first_mine, next_page);
    }
    __syncthreads();
    kvm_finish<DP>(p, st, run, (float*)rings, b, h, chunk, split);
}

// Masks: KP over the DP/16 key groups, VP over the DP/16 value steps (all: 0xff at d 128).
#define KV4_KERNEL(NAME, DP, KP, VP, ...)                                              \
    extern "C" __global__ void __launch_bounds__(KV_THREADS, 3) NAME(KvAttnParams p) { \
        kv4_pass1<4, 2, DP, KP, VP, ##__VA_ARGS__>(p);                                 \
    }
KV4_KERNEL(kv4_d128_kp, 128, 0xffu, 0u)
KV4_KERNEL(kv4_d128_vp, 128, 0u, 0xffu)
KV4_KERNEL(kv4_d128_kpvp, 128, 0xffu, 0xffu)
KV4_KERNEL(kv4_d128_kphalf_vp, 128, 0x55u, 0xffu)
KV4_KERNEL(kv4_d128_kphalf_vphalf, 128, 0x55u, 0x55u)
KV4_KERNEL(kv4_d128_kpquarter_vp, 128, 0x11u, 0xffu)
KV4_KERNEL(kv4_d128_step32_kphalf_vp, 128, 0x55u, 0xffu, true)
KV4_KERNEL(kv4_d64_kpvp, 64, 0xfu, 0xfu)
KV4_KERNEL(kv4_d64_step32_kphalf_vp, 64, 0x5u, 0xfu, true)
KV4_KERNEL(kv4_d64_kphalf_vp, 64, 0x5u, 0xfu)

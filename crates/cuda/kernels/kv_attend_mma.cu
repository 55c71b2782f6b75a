// Flash-decoding over the paged compressed KV cache on tensor cores: the math of 16-token tiles
// (appended to kv_attend.cu in one module: it shares KvAttnParams, kv_rotate_queries and the
// merge pass; kv_attend_block.cu and kv_attend_pages.cu follow). Codes of 2, 4 or 8 bits; a
// block of 4 warps per (split, KV head x chunk of 4 rows, sequence).
//
// Every warp owns whole tiles of 16 tokens, keeps its own online softmax and merges with the
// other warps once, at the end (kv_attend_block.cu). Per tile, with f16 hi/lo pairs so that
// the products keep f32 accuracy:
//
//   scores  S[t][n] = sum over 8-dimension steps of mma.m16n8k16 with
//           A[t][2i] = Lk_hi(code(t, d_i)), A[t][2i+1] = Lk_lo(...)   (one table word per code)
//           B[2i][n] = B[2i+1][n] = q_hi(row n, d_i) for n < 4,
//           B[2i][n] = q_lo(row n - 4, d_i), B[2i+1][n] = 0 for n >= 4
//           so S[t][r] + S[t][r + 4] = <Lk_hi + Lk_lo, q_hi> + <Lk_hi, q_lo> = <Lk, q> to ~2^-22
//   softmax per row (base 2: scores carry log2 e), p = 2^(s - m), W = p norm_v 2^-E
//   values  O^T[d][n] += mma with A[d][2j] = Lv_hi(code(token j, d)), A[d][2j+1] = Lv_lo,
//           B[2j][n] = B[2j+1][n] = W_hi(token j, row n) (n < 4), B[2j][n] = W_lo (n >= 4)
//
// E is a running power of two (the largest value norm so far) keeping W in [0, 1); q and the
// level tables are scaled by powers of two into f16's best range (exact, undone in f32).
// Each tile's mma sums start from zero and join the f32 accumulators by one fma with the
// rescale, so long contexts never chain thousands of tensor-core accumulations.
//
// Lane (gid = lane / 4, tig = lane % 4). Keys: lane tig owns dimensions DP/4 * tig ..+ DP/4
// (score step m uses its dimensions 2m and 2m + 1), for tokens gid and gid + 8. Values: lane
// gid owns dimensions DP/8 * gid ..+ DP/8 (value step c: dimensions 2c, 2c + 1), for tokens
// tig, tig + 4, tig + 8, tig + 12. Dimensions past d read zero words or codes of rows whose q
// is zero or whose outputs are never stored.

#define KVM_WARPS 4
#define KVM_TILE 16
#define KVM_LOG2E 1.4426950408889634f

__device__ __forceinline__ unsigned short kvm_f16(float x) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(h) : "f"(x));
    return h;
}
__device__ __forceinline__ float kvm_f32(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(h));
    return f;
}
// x as f16 hi (low half of the word) and f16 lo = x - hi (high half).
__device__ __forceinline__ unsigned kvm_split(float x) {
    const unsigned short hi = kvm_f16(x);
    const unsigned short lo = kvm_f16(x - kvm_f32(hi));
    return (unsigned)hi | ((unsigned)lo << 16);
}
// The B words of a value x for column n: (hi, hi) for the first four columns, (lo, 0) after.
__device__ __forceinline__ unsigned kvm_bword(float x, bool lo_column) {
    const unsigned s = kvm_split(x);
    return lo_column ? (s >> 16) : ((s & 0xffffu) | (s << 16));
}

__device__ __forceinline__ void kvm_mma(float (&d)[4], unsigned a0, unsigned a1, unsigned a2,
                                        unsigned a3, unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Byte offset (code * 4) of code j (compile-time after unrolling) of B bits in words w.
// For 2- and 4-bit codes, one shift and mask per word and phase puts every code of that phase,
// already times 4, in its own byte (the compiler shares these across the unrolled codes), and
// one byte permute takes code j out: ~1.25 instructions per code instead of a shift and a mask.
template <int B, int N>
__device__ __forceinline__ unsigned kvm_off(const unsigned (&w)[N], int j) {
    const int bit = j * B, s = bit & 31;
    const unsigned word = w[bit >> 5];
    if (B == 2 || B == 4) {
        const int phase = s & 7;  // the code's first bit within its byte
        const unsigned lanes = (((1u << B) - 1u) << 2) * 0x01010101u;
        const unsigned scaled = (phase <= 2 ? word << (2 - phase) : word >> (phase - 2)) & lanes;
        return __byte_perm(scaled, 0u, 0x4440u | (unsigned)(s >> 3));
    }
    const unsigned mask = ((1u << B) - 1u) << 2;
    return (s >= 2 ? word >> (s - 2) : word << (2 - s)) & mask;
}

__device__ __forceinline__ unsigned kvm_table(const unsigned* table, unsigned off) {
    return *(const unsigned*)((const char*)table + off);
}

// The pair-table entry of nibble c (compile-time after unrolling) of word w: the even or odd
// nibbles times 8, one per byte (shared across the unrolled nibbles), then one byte permute.
__device__ __forceinline__ uint2 kvm_pair(const uint2* table, unsigned w, int c) {
    const unsigned scaled = ((c & 1) ? w >> 1 : w << 3) & 0x78787878u;
    const unsigned off = __byte_perm(scaled, 0u, 0x4440u | (unsigned)(c >> 1));
    return *(const uint2*)((const char*)table + off);
}

// N words of a row starting at word `first` (a multiple of min(N, 4)), zero at or past
// `avail` (a multiple of 4: rows are whole 16-byte chunks).
template <int N>
__device__ __forceinline__ void kvm_words(const unsigned* row, int first, int avail,
                                          unsigned (&w)[N]) {
    if (N >= 4) {
#pragma unroll
        for (int i = 0; i < N / 4; ++i) {
            uint4 x = make_uint4(0u, 0u, 0u, 0u);
            if (first + 4 * i < avail) x = *(const uint4*)(row + first + 4 * i);
            w[4 * i] = x.x;
            w[4 * i + 1] = x.y;
            w[4 * i + 2] = x.z;
            w[4 * i + 3] = x.w;
        }
    } else if (N == 2) {
        uint2 x = make_uint2(0u, 0u);
        if (first < avail) x = *(const uint2*)(row + first);
        w[0] = x.x;
        w[1] = x.y;
    } else {
        w[0] = first < avail ? row[first] : 0u;
    }
}

// One tile's codes and norms in registers.
template <int KW, int VW>
struct KvmTile {
    unsigned k[2][KW];  // tokens gid, gid + 8
    unsigned v[4][VW];  // tokens tig, tig + 4, tig + 8, tig + 12
    float kn[2], vn[2];  // norms of tokens gid, gid + 8 (value norm 0 past the sequence)
};

template <int BK, int BV, int DP>
__device__ __forceinline__ void kvm_load(const KvAttnParams& p, int head_off,
                                         const int* table_row, int tile, int len, int gid,
                                         int tig, KvmTile<DP / 4 * BK / 32, (DP / 8 * BV + 31) / 32>& x) {
    constexpr int KW = DP / 4 * BK / 32, VBITS = DP / 8 * BV, VW = (VBITS + 31) / 32;
    const int first = tile * KVM_TILE;
    const long long page = table_row[first / p.page_tokens];
    const int off = first % p.page_tokens;
    const unsigned* head = p.pool + page * p.page_words + head_off;
    const unsigned* kcodes = head + (long long)off * p.row_words_k;
    const unsigned* vcodes = head + p.page_tokens * p.row_words_k + (long long)off * p.row_words_v;
    const unsigned* norms = head + p.page_tokens * (p.row_words_k + p.row_words_v);
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
            // Half a word: lanes gid and gid ^ 1 share one.
            unsigned w[1];
            kvm_words<1>(row, VBITS * gid / 32, p.row_words_v, w);
            x.v[i][0] = w[0] >> ((VBITS * gid) & 31);
        } else {
            kvm_words<VW>(row, VW * gid, p.row_words_v, x.v[i]);
        }
    }
}

// 2^e for -126 <= e <= 127, exactly, from the exponent field.
__device__ __forceinline__ float kvm_pow2(int e) { return __int_as_float((e + 127) << 23); }

// 2^x by the SFU alone: flushing results below 2^-126 to zero (exp2f's extra steps keep them
// as subnormals) changes nothing a softmax weight next to the tile's largest one (1.0) holds.
__device__ __forceinline__ float kvm_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// The block's shared state beside the dynamic area: level tables, the warps' weight exchange,
// their (m, l) for the final merge, and q's power of two per row.
struct KvmShared {
    unsigned table_k[256];
    unsigned table_v[256];
    uint2 table_v2[16];  // 2-bit values: both words of a code pair (one nibble)
    float w[KVM_WARPS][2 * KVM_TILE][4];  // up to two tiles' weights per softmax step
    float ml[KVM_WARPS][4][2];
    float warp_factor[4][KVM_WARPS];  // kvm_finish: 2^(m_w - m) per row and warp
    float row_scale[4];
};

// One warp's running softmax and output for its rows ra, ra + 1 (see kvm_step).
template <int VM>
struct KvmRun {
    float m[2], l[2];
    int e;  // acc holds sum W V 2^-e
    float acc[VM][4];
    int lim[2];     // causal limits of the rows
    float sfac[2];  // score scale: log2 e / (q's and the key table's powers of two)
};

// A 16-token tile's scores (the mma sums of kvm_update's s, before the hi/lo join). The score
// B fragments come from bq_r (QREG) or bq_s.
template <int BK, int DP, int KW, int VW, bool QREG>
__device__ __forceinline__ void kvm_scores(const KvmShared& st, const uint2* bq_s, const uint2* bq_r,
                                           const KvmTile<KW, VW>& cur, float (&sc)[2][4]) {
    constexpr int KM = DP / 8;
    const int lane = threadIdx.x & 31;
    // Two accumulator chains (even and odd steps).
#pragma unroll
    for (int i = 0; i < 4; ++i) sc[0][i] = sc[1][i] = 0.0f;
#pragma unroll
    for (int m = 0; m < KM; ++m) {
        const unsigned a0 = kvm_table(st.table_k, kvm_off<BK>(cur.k[0], 2 * m));
        const unsigned a1 = kvm_table(st.table_k, kvm_off<BK>(cur.k[1], 2 * m));
        const unsigned a2 = kvm_table(st.table_k, kvm_off<BK>(cur.k[0], 2 * m + 1));
        const unsigned a3 = kvm_table(st.table_k, kvm_off<BK>(cur.k[1], 2 * m + 1));
        const uint2 bq = QREG ? bq_r[m] : bq_s[m * 32 + lane];
        kvm_mma(sc[m & 1], a0, a1, a2, a3, bq.x, bq.y);
    }
}

// NT tiles (tokens first ..+ 16 NT - 1) into the warp's run, from their scores: one online
// softmax step over all NT tiles (one maximum, one rescale of the accumulators), then values.
template <int BV, int DP, int KW, int VW, int NT>
__device__ __forceinline__ void kvm_update(KvmShared& st, const KvmTile<KW, VW> (&cur)[NT],
                                           const float (&sc)[NT][2][4], int first,
                                           KvmRun<DP / 16>& run) {
    constexpr int VM = DP / 16;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    const bool lo_col = gid >= 4;
    const int ra = 2 * (tig & 1);
    // s[t][i][y]: tile t, token gid + 8 i, row ra + y; columns c and c + 4 are lanes tig and tig ^ 2.
    float s[NT][2][2];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
#pragma unroll
            for (int y = 0; y < 2; ++y) {
                const float part = sc[t][0][2 * i + y] + sc[t][1][2 * i + y];
                const float full = part + __shfl_xor_sync(KV_FULLMASK, part, 2);
                const int token = first + KVM_TILE * t + gid + 8 * i;
                s[t][i][y] = token < run.lim[y] ? full * cur[t].kn[i] * run.sfac[y] : KV_NEG_INF;
            }
        }
    }
    // Online softmax (base 2) for rows ra, ra + 1 over the step's 16 NT tokens.
    float alpha[2], pw[NT][2][2];
#pragma unroll
    for (int y = 0; y < 2; ++y) {
        float mt = fmaxf(s[0][0][y], s[0][1][y]);
#pragma unroll
        for (int t = 1; t < NT; ++t) mt = fmaxf(mt, fmaxf(s[t][0][y], s[t][1][y]));
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) mt = fmaxf(mt, __shfl_xor_sync(KV_FULLMASK, mt, o));
        const float m_new = fmaxf(run.m[y], mt);
        // exp2(-inf - finite) is 0, so a masked score or an empty running maximum needs no test
        // of its own; only a row with nothing unmasked yet (m_new = -inf) subtracts 0 instead.
        const float m_sub = m_new == KV_NEG_INF ? 0.0f : m_new;
        alpha[y] = kvm_exp2(run.m[y] - m_sub);
        float sum = 0.0f;
#pragma unroll
        for (int t = 0; t < NT; ++t) {
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                pw[t][i][y] = kvm_exp2(s[t][i][y] - m_sub);
                sum += pw[t][i][y];
            }
        }
        run.l[y] = run.l[y] * alpha[y] + sum;
        run.m[y] = m_new;
    }
    // The value scale: e at least the exponent of the step's largest value norm.
    float nmax = fmaxf(cur[0].vn[0], cur[0].vn[1]);
#pragma unroll
    for (int t = 1; t < NT; ++t) nmax = fmaxf(nmax, fmaxf(cur[t].vn[0], cur[t].vn[1]));
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) nmax = fmaxf(nmax, __shfl_xor_sync(KV_FULLMASK, nmax, o));
    // From the exponent field: nmax < 2^e_tile (a subnormal nmax counts as exponent -126).
    const int e_tile = nmax > 0.0f ? max((int)(__float_as_uint(nmax) >> 23), 1) - 126 : -200;
    const int e_new = max(run.e, e_tile);
    // Older tiles' sums fall by 2^(e - e_new); below 2^-126 of the new scale they are under f32's
    // resolution of the sum, so they become 0 instead of a subnormal factor.
    const int drop = run.e - e_new;
    const float gamma = drop < -126 ? 0.0f : kvm_pow2(drop);
    // The norms' scale 2^-e_new in two exact halves (e_new lies in [-200, 129]).
    const int half_e = -e_new / 2;
    const float scale_a = kvm_pow2(half_e), scale_b = kvm_pow2(-e_new - half_e);
    run.e = e_new;
    // W of tokens gid, gid + 8 and rows ra, ra + 1 to the warp's table, then read back in
    // B order: tokens tig + 4 j, row gid & 3.
    if (tig < 2) {
#pragma unroll
        for (int t = 0; t < NT; ++t) {
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const float nv = cur[t].vn[i] * scale_a * scale_b;
#pragma unroll
                for (int y = 0; y < 2; ++y)
                    st.w[warp][KVM_TILE * t + gid + 8 * i][ra + y] = pw[t][i][y] * nv;
            }
        }
    }
    __syncwarp();
    unsigned bw[NT][4];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
#pragma unroll
        for (int j = 0; j < 4; ++j)
            bw[t][j] = kvm_bword(st.w[warp][KVM_TILE * t + tig + 4 * j][gid & 3], lo_col);
    }
    __syncwarp();
    const float fa = alpha[0] * gamma, fb = alpha[1] * gamma;
#pragma unroll
    for (int c = 0; c < VM; ++c) {
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int t = 0; t < NT; ++t) {
#pragma unroll
            for (int sp = 0; sp < 2; ++sp) {
                if (BV == 2) {
                    // Dimensions 2c and 2c + 1 are nibble c % 8 of word c / 8 (d = 256 gives a
                    // lane 32 dimensions, two words): one 8-byte load.
                    const uint2 x = kvm_pair(st.table_v2, cur[t].v[2 * sp][c / 8], c % 8);
                    const uint2 y = kvm_pair(st.table_v2, cur[t].v[2 * sp + 1][c / 8], c % 8);
                    kvm_mma(d, x.x, x.y, y.x, y.y, bw[t][2 * sp], bw[t][2 * sp + 1]);
                } else {
                    const unsigned a0 = kvm_table(st.table_v, kvm_off<BV>(cur[t].v[2 * sp], 2 * c));
                    const unsigned a1 = kvm_table(st.table_v, kvm_off<BV>(cur[t].v[2 * sp], 2 * c + 1));
                    const unsigned a2 = kvm_table(st.table_v, kvm_off<BV>(cur[t].v[2 * sp + 1], 2 * c));
                    const unsigned a3 =
                        kvm_table(st.table_v, kvm_off<BV>(cur[t].v[2 * sp + 1], 2 * c + 1));
                    kvm_mma(d, a0, a1, a2, a3, bw[t][2 * sp], bw[t][2 * sp + 1]);
                }
            }
        }
        run.acc[c][0] = fmaf(run.acc[c][0], fa, d[0]);
        run.acc[c][1] = fmaf(run.acc[c][1], fb, d[1]);
        run.acc[c][2] = fmaf(run.acc[c][2], fa, d[2]);
        run.acc[c][3] = fmaf(run.acc[c][3], fb, d[3]);
    }
}

// NT consecutive tiles: their scores, then one kvm_update.
template <int BK, int BV, int DP, bool QREG, int NT>
__device__ __forceinline__ void kvm_step(KvmShared& st, const uint2* bq_s, const uint2* bq_r,
                                         const KvmTile<DP / 4 * BK / 32, (DP / 8 * BV + 31) / 32> (&cur)[NT],
                                         int first, KvmRun<DP / 16>& run) {
    float sc[NT][2][4];
#pragma unroll
    for (int t = 0; t < NT; ++t)
        kvm_scores<BK, DP, DP / 4 * BK / 32, (DP / 8 * BV + 31) / 32, QREG>(st, bq_s, bq_r, cur[t],
                                                                           sc[t]);
    kvm_update<BV, DP, DP / 4 * BK / 32, (DP / 8 * BV + 31) / 32, NT>(st, cur, sc, first, run);
}

// The tensor-core attention block's start and end, and the tiles form of pass 1 (appended to
// kv_attend.cu and kv_attend_mma.cu in one module, before kv_attend_pages.cu): the prologue's
// reads, the query rotation and the score B fragments; the warps' merge into the split's
// partial outputs; and the tiles form, where every warp owns whole tiles of 16 tokens (tiles
// t = tile0 + warp, + 4, ...) loaded from global memory straight into registers (the next
// tile's loads issued before this tile's math).

// The prologue's global reads, issued first in the block so that they do not queue behind its
// bulk copies: the level-table entries this thread fills (tables of up to 4 bits) and, when
// the rotation is a Hadamard of size DP (then warp r rotates row r in registers,
// kvm_rotate_row), row `warp`'s q with the rotation's signs, DP/32 consecutive elements per
// lane. Other rotations read q in kv_rotate_queries.
template <int BK, int BV, int DP>
struct KvmEarly {
    static constexpr int E = DP / 32;
    // 8-bit tables (two entries per thread) are read in kvm_prologue: held here, their
    // registers spill the d = 128 pages kernels.
    static constexpr bool TABLES = BK < 8 && BV < 8;
    unsigned q_bits[E];
    float sign[E];
    float lk, lv;  // entry threadIdx.x of each table (TABLES)
    bool in_registers;  // q read here (a Hadamard of size DP)
};

template <int BK, int BV, int DP>
__device__ __forceinline__ void kvm_early_loads(const KvAttnParams& p, int b, int h, int chunk,
                                                KvmEarly<BK, BV, DP>& x) {
    constexpr int E = DP / 32;
    const int lane = threadIdx.x & 31, row = chunk * 4 + (threadIdx.x >> 5);
    if (x.TABLES) {
        x.lk = threadIdx.x < (1 << BK) ? p.consts[threadIdx.x] : 0.0f;
        x.lv = threadIdx.x < (1 << BV) ? p.consts[512 + threadIdx.x] : 0.0f;
    }
    x.in_registers = p.hadamard && p.dim == DP;
    const bool live = x.in_registers && row < p.rows;
    long long at = 0;
    if (live) {
        const int i = row / p.group, g = row % p.group;
        at = (((long long)b * p.tq + i) * p.hq + h * p.group + g) * DP + lane * E;
    }
#pragma unroll
    for (int k = 0; k < E; ++k) {
        x.q_bits[k] = live ? load_bits(p.q, at + k, p.q_dtype) : 0u;
        x.sign[k] = live ? p.consts[1024 + lane * E + k] : 0.0f;
    }
}

// Row `warp` of q' = Pi (scale q) for a Hadamard of size DP, from kvm_early_loads' registers,
// into q[warp][..]: butterflies of spans below DP/32 within a lane, wider ones across lanes by
// shuffles, in the CPU's order of spans (the same sums as kv_rotate_queries). Returns the row's
// largest |q'| (every lane).
template <int BK, int BV, int DP>
__device__ __forceinline__ float kvm_rotate_row(const KvAttnParams& p,
                                                const KvmEarly<BK, BV, DP>& early, float* q) {
    constexpr int E = DP / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float x[E];
#pragma unroll
    for (int k = 0; k < E; ++k) {
        x[k] = bits_to_float(early.q_bits[k], p.q_dtype) * p.scale;
        x[k] *= early.sign[k];
    }
#pragma unroll
    for (int span = 1; span < E; span <<= 1) {
#pragma unroll
        for (int k = 0; k < E; ++k) {
            if (!(k & span)) {
                const float a = x[k], c = x[k + span];
                x[k] = a + c;
                x[k + span] = a - c;
            }
        }
    }
#pragma unroll
    for (int span = E; span < DP; span <<= 1) {
        const int lanes = span / E;
        const bool upper = lane & lanes;
#pragma unroll
        for (int k = 0; k < E; ++k) {
            const float other = __shfl_xor_sync(KV_FULLMASK, x[k], lanes);
            x[k] = upper ? other - x[k] : x[k] + other;
        }
    }
    float mx = 0.0f;
#pragma unroll
    for (int k = 0; k < E; ++k) {
        const float v = x[k] * p.hadamard_norm;
        q[warp * DP + lane * E + k] = v;
        mx = fmaxf(mx, fabsf(v));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(KV_FULLMASK, mx, o));
    return mx;
}

// Tables, q' (rotated, scaled into f16's range) and the score B fragments in bq_s
// ([DP/8 steps][32 lanes]); ends with a barrier. q and qin: [4][DP] each.
template <int BK, int BV, int DP>
__device__ __forceinline__ void kvm_prologue(const KvAttnParams& p, KvmShared& st,
                                             const KvmEarly<BK, BV, DP>& early, float* q,
                                             float* qin, uint2* bq_s, int b, int h, int chunk) {
    constexpr int ROWS = 4, KM = DP / 8;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    if (early.TABLES) {
        if (threadIdx.x < (1 << BK)) st.table_k[threadIdx.x] = kvm_split(early.lk * p.level_scale_k);
        if (threadIdx.x < (1 << BV)) st.table_v[threadIdx.x] = kvm_split(early.lv * p.level_scale_v);
    } else {
        for (int i = threadIdx.x; i < (1 << BK); i += KV_THREADS)
            st.table_k[i] = kvm_split(p.consts[i] * p.level_scale_k);
        for (int i = threadIdx.x; i < (1 << BV); i += KV_THREADS)
            st.table_v[i] = kvm_split(p.consts[512 + i] * p.level_scale_v);
    }
    // Row r's q scaled by 2^-e (e = the exponent of its largest |q|): f16 hi/lo keep it whole.
    float mx = 0.0f;
    if (early.in_registers) {
        mx = kvm_rotate_row<BK, BV, DP>(p, early, q);
    } else {
        KvSmem sm;
        sm.q = q;
        sm.qin = qin;
        kv_rotate_queries<ROWS>(p, sm, b, h, chunk);
        for (int c = lane; c < DP; c += 32) mx = fmaxf(mx, fabsf(q[warp * DP + c]));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(KV_FULLMASK, mx, o));
    }
    if (lane == 0) st.row_scale[warp] = mx > 0.0f ? ldexpf(1.0f, min(-ilogbf(mx), 126)) : 1.0f;
    __syncthreads();
    // 2-bit values: both words of a code pair (one nibble) from the filled table.
    if (BV == 2 && threadIdx.x < 16)
        st.table_v2[threadIdx.x] = make_uint2(st.table_v[threadIdx.x & 3], st.table_v[threadIdx.x >> 2]);
    // Score B words, per lane (the same for every warp): step m, dimensions DP/4 tig + 2m (x)
    // and + 1 (y), row gid & 3.
    if (warp == 0) {
        const bool lo_col = gid >= 4;
        const float rs = st.row_scale[gid & 3];
        const float* qr = q + (gid & 3) * DP + DP / 4 * tig;
        for (int m = 0; m < KM; ++m)
            bq_s[m * 32 + lane] = make_uint2(kvm_bword(qr[2 * m] * rs, lo_col),
                                             kvm_bword(qr[2 * m + 1] * rs, lo_col));
    }
    __syncthreads();
}

template <int VM>
__device__ __forceinline__ void kvm_run_init(const KvAttnParams& p, const KvmShared& st, int len,
                                             int chunk, KvmRun<VM>& run) {
    const int ra = 2 * (threadIdx.x & 1);
#pragma unroll
    for (int y = 0; y < 2; ++y) {
        const int row = chunk * 4 + ra + y;
        run.lim[y] = row < p.rows ? len - p.tq + row / p.group + 1 : 0;
        run.sfac[y] = KVM_LOG2E / (st.row_scale[ra + y] * p.level_scale_k);
        run.m[y] = KV_NEG_INF;
        run.l[y] = 0.0f;
    }
    run.e = -200;
#pragma unroll
    for (int c = 0; c < VM; ++c) {
#pragma unroll
        for (int i = 0; i < 4; ++i) run.acc[c][i] = 0.0f;
    }
}

// The furthest token any of the block's rows sees.
__device__ __forceinline__ int kvm_reach(const KvAttnParams& p, int len, int chunk) {
    int reach = 0;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const int row = chunk * 4 + r;
        reach = max(reach, row < p.rows ? len - p.tq + row / p.group + 1 : 0);
    }
    return reach;
}

// blockIdx through a volatile read: the compiler neither hoists it nor what is formed from it.
__device__ __forceinline__ uint3 kvm_volatile_ctaid() {
    uint3 c;
    asm volatile("mov.u32 %0, %%ctaid.x;\n\tmov.u32 %1, %%ctaid.y;\n\tmov.u32 %2, %%ctaid.z;"
                 : "=r"(c.x), "=r"(c.y), "=r"(c.z));
    return c;
}

// The warps' runs merged (m, l and sum W V per row) into the split's partial outputs. red:
// [KVM_WARPS][4][DP] floats of shared memory no warp uses any more.
template <int DP>
__device__ __forceinline__ void kvm_finish(const KvAttnParams& p, KvmShared& st,
                                           KvmRun<DP / 16>& run, float* red) {
    constexpr int ROWS = 4, VM = DP / 16;
    // Pass 2 (launched as this grid's programmatic dependent) may start once every block is
    // here: its blocks take SMs as these finish and wait for this grid's results.
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    // The block's coordinates read again here by volatile reads, which the compiler cannot
    // hoist above the loop: values formed from them would otherwise be held in registers
    // through it, where the d = 128 pages kernels have none to spare (168 at 3 blocks/SM).
    const int tid = threadIdx.x;
    const uint3 block = kvm_volatile_ctaid();
    const int split = block.x, h = block.y / p.row_chunks, chunk = block.y % p.row_chunks;
    const int b = block.z;
    const int lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
    const int ra = 2 * (tig & 1);
#pragma unroll
    for (int y = 0; y < 2; ++y) {
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) run.l[y] += __shfl_xor_sync(KV_FULLMASK, run.l[y], o);
    }
    if (gid == 0 && tig < 2) {
#pragma unroll
        for (int y = 0; y < 2; ++y) {
            st.ml[warp][ra + y][0] = run.m[y];
            st.ml[warp][ra + y][1] = run.l[y];
        }
    }
    const float unscale = ldexpf(1.0f, run.e) / p.level_scale_v;
#pragma unroll
    for (int c = 0; c < VM; ++c) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float v = run.acc[c][i] + __shfl_xor_sync(KV_FULLMASK, run.acc[c][i], 2);
            // acc[c][i]: dimension DP/8 gid + 2c + (i >> 1), row ra + (i & 1).
            if (tig < 2)
                red[(warp * ROWS + ra + (i & 1)) * DP + DP / 8 * gid + 2 * c + (i >> 1)] = v * unscale;
        }
    }
    __syncthreads();
    // Each warp's factor 2^(m_w - m) per row (0 for a warp that saw none of the row's tokens),
    // then every thread sums four dimensions of a row over the warps in warp order.
    if (tid < ROWS * KVM_WARPS) {
        const int r = tid / KVM_WARPS, w = tid % KVM_WARPS;
        float m = KV_NEG_INF;
#pragma unroll
        for (int v = 0; v < KVM_WARPS; ++v) m = fmaxf(m, st.ml[v][r][0]);
        const float mw = st.ml[w][r][0];
        st.warp_factor[r][w] = mw == KV_NEG_INF ? 0.0f : exp2f(mw - m);
    }
    __syncthreads();
    constexpr int QUADS = DP / 4;
    for (int idx = tid; idx < ROWS * QUADS; idx += KV_THREADS) {
        const int r = idx / QUADS, c = 4 * (idx % QUADS), row = chunk * ROWS + r;
        if (row >= p.rows) continue;
        // fmaf(x, 0, sum) leaves sum as it is: a warp with factor 0 adds nothing.
        float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int w = 0; w < KVM_WARPS; ++w) {
            const float f = st.warp_factor[r][w];
            const float4 x = *(const float4*)(red + (w * ROWS + r) * DP + c);
            sum.x = fmaf(x.x, f, sum.x);
            sum.y = fmaf(x.y, f, sum.y);
            sum.z = fmaf(x.z, f, sum.z);
            sum.w = fmaf(x.w, f, sum.w);
        }
        const int i = row / p.group, g = row % p.group;
        const long long out_row = ((long long)b * p.tq + i) * p.hq + h * p.group + g;
        const long long part = out_row * p.splits + split;
        *(float4*)(p.part_acc + part * DP + c) = sum;
        if (c == 0) {
            float m = KV_NEG_INF, l = 0.0f;
#pragma unroll
            for (int w = 0; w < KVM_WARPS; ++w) {
                m = fmaxf(m, st.ml[w][r][0]);
                l = fmaf(st.ml[w][r][1], st.warp_factor[r][w], l);
            }
            p.part_ml[2 * part] = m;
            p.part_ml[2 * part + 1] = l;
        }
    }
}

// Tiles form: every warp owns tiles tile0 + warp, + 4, ... of its split, loaded from global
// memory into registers one tile ahead. Dynamic shared memory: q, qin, red, bq_s.
template <int BK, int BV, int DP>
__device__ __forceinline__ void kvm_pass1(const KvAttnParams& p) {
    constexpr int ROWS = 4;
    constexpr int KW = DP / 4 * BK / 32, VW = (DP / 8 * BV + 31) / 32;
    __shared__ KvmShared st;
    extern __shared__ __align__(16) float kv_smem[];
    float* q = kv_smem;                     // [ROWS][DP]
    float* qin = kv_smem + ROWS * DP;       // [ROWS][DP]
    float* red = kv_smem + 2 * ROWS * DP;   // [KVM_WARPS][ROWS][DP]
    uint2* bq_s = (uint2*)(red + KVM_WARPS * ROWS * DP);  // [KM][32 lanes]
    const int split = blockIdx.x, h = blockIdx.y / p.row_chunks, chunk = blockIdx.y % p.row_chunks;
    const int b = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    KvmEarly<BK, BV, DP> early;
    kvm_early_loads<BK, BV, DP>(p, b, h, chunk, early);
    kvm_prologue<BK, BV, DP>(p, st, early, q, qin, bq_s, b, h, chunk);
    const int len = p.seq_lens[b];
    KvmRun<DP / 16> run;
    kvm_run_init(p, st, len, chunk, run);
    const int tiles = (kvm_reach(p, len, chunk) + KVM_TILE - 1) / KVM_TILE;
    const int all_tiles = (len + KVM_TILE - 1) / KVM_TILE;
    const int per_split = (all_tiles + p.splits - 1) / p.splits;
    const int tile0 = split * per_split, tile1 = min(tile0 + per_split, tiles);
    const int* table_row = p.block_table + (long long)b * p.max_pages;
    const int head_off = h * p.head_words;  // KV head h's section within a page (words)
    // The next tile's loads go out before this tile's math where the registers allow (the
    // d <= 128 kernels keep 4 blocks per SM: 128 registers).
    constexpr bool PREFETCH = 2 * KW + 4 * VW <= (DP == 128 ? 12 : 32);
    KvmTile<KW, VW> cur[1], nxt;
    int t = tile0 + warp;
    if (PREFETCH && t < tile1) kvm_load<BK, BV, DP>(p, head_off, table_row, t, len, gid, tig, cur[0]);
    for (; t < tile1; t += KVM_WARPS) {
        if (!PREFETCH) kvm_load<BK, BV, DP>(p, head_off, table_row, t, len, gid, tig, cur[0]);
        if (PREFETCH && t + KVM_WARPS < tile1)
            kvm_load<BK, BV, DP>(p, head_off, table_row, t + KVM_WARPS, len, gid, tig, nxt);
        kvm_step<BK, BV, DP, false, 1>(st, bq_s, nullptr, cur, t * KVM_TILE, run);
        if (PREFETCH) cur[0] = nxt;
    }
    kvm_finish<DP>(p, st, run, red);
}

// One module per bit-width pair (KVM_BK, KVM_BV defined ahead of kv_attend.cu), so a process
// compiles only the kernels it launches. A pass-1 form's kernels at d_pad 64, 128 and 256, each
// with its resident blocks per SM: kv_attend_<FORM>_k<BK>v<BV>_d<DP> running PASS1<BK, BV, DP>
// (the _OF form expands KVM_BK and KVM_BV before the names are pasted).
#define KVM_FORM_KERNEL(FORM, PASS1, BK, BV, DP, MIN_BLOCKS)                               \
    extern "C" __global__ void __launch_bounds__(KV_THREADS, MIN_BLOCKS)                  \
        kv_attend_##FORM##_k##BK##v##BV##_d##DP(KvAttnParams p) {                         \
        PASS1<BK, BV, DP>(p);                                                              \
    }
#define KVM_FORM_KERNELS(FORM, PASS1, BK, BV, MIN64, MIN128, MIN256) \
    KVM_FORM_KERNEL(FORM, PASS1, BK, BV, 64, MIN64)                  \
    KVM_FORM_KERNEL(FORM, PASS1, BK, BV, 128, MIN128)                \
    KVM_FORM_KERNEL(FORM, PASS1, BK, BV, 256, MIN256)
#define KVM_FORM_KERNELS_OF(FORM, PASS1, BK, BV, MIN64, MIN128, MIN256) \
    KVM_FORM_KERNELS(FORM, PASS1, BK, BV, MIN64, MIN128, MIN256)
KVM_FORM_KERNELS_OF(mma, kvm_pass1, KVM_BK, KVM_BV, 4, 4, 2)

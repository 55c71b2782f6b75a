// GDN decode, one token (T = 1) at K = V = 128 (Qwen3-Next and most hybrid models): the two
// kernels the host picks by grid size. Same math, parameters and skip rule as gdn_decode.cu
// (this file is compiled after it and shares its DecodeParams and copy helpers):
//
//     v' = beta (v - exp(g) S^T k),   S <- exp(g) S + k v'^T,   o = scale (exp(g) S^T q + (k.q) v')
//
// with q and k l2-normalised when asked. Both read the state once and write it once; they differ
// in how they keep it in between.
//
// * Bands (large grids): one block of 8 warps per (row, head); warp w owns the contiguous band
//   of rows 16w..16w+15 (8 KB in f32), which it moves in and out with its own bulk copies and
//   mbarrier. A warp reduces its band as soon as it lands and writes it back as soon as it is
//   updated, so the block's only barriers publish q/k/gates and the cross-warp column sums:
//   the state spends little time in shared memory beyond its transfers, which is what keeps
//   three slabs per SM moving at the copy engine's rate.
// * Registers (small grids): one block of 128 threads per (row, head, 16-column tile); thread
//   (row group r = tid / 8, column group c = tid % 8) loads rows r, r + 16, ... of columns
//   2c, 2c + 1 straight into registers, together with every input at entry (the slot first),
//   so a block's critical path is one dependent load (slot, then state) and two barriers.

// Stores `bytes` of shared memory to global memory and waits until the shared side has been
// read (the block may then exit). Writers must have run `fence.proxy.async.shared::cta` and
// a barrier first.
__device__ __forceinline__ void bulk_store(void* dst, const void* src, unsigned bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                 ::"l"(dst), "r"(shared_address(src)), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}

#define BAND_WARPS 8
#define BAND_THREADS (BAND_WARPS * 32)
#define BAND_ROWS (128 / BAND_WARPS)

// The key head that value head `head` reads, by multiplication (a division by a run-time
// value is a long dependent chain on these kernels' critical path). Exact for head < 2^16.
__device__ __forceinline__ int key_head_of(const DecodeParams& p, int head) {
    return (int)(((u64)head * p.key_head_magic) >> 32);
}

// The raw inputs of one (token, head)'s gates: g and beta, or a, b, A_log and dt_bias (fused).
struct GateBits {
    unsigned first, second, a_log, dt_bias;
};

__device__ __forceinline__ GateBits load_gate_bits(const DecodeParams& p, i64 gate, int head) {
    GateBits bits = {0u, 0u, 0u, 0u};
    if (p.fused_gating) {
        bits.first = load_bits((const void*)p.a, gate, p.a_dtype);
        bits.second = load_bits((const void*)p.b, gate, p.b_dtype);
        bits.a_log = load_bits((const void*)p.a_log, head, p.a_log_dtype);
        bits.dt_bias = load_bits((const void*)p.dt_bias, head, p.dt_bias_dtype);
    } else {
        bits.first = load_bits((const void*)p.g, gate, p.g_dtype);
        bits.second = load_bits((const void*)p.beta, gate, p.beta_dtype);
    }
    return bits;
}

// exp(g) and beta from the gate inputs (softplus and sigmoid for fused gating).
__device__ __forceinline__ void decode_gates(const DecodeParams& p, const GateBits& bits,
                                             float& decay, float& beta) {
    float g;
    if (p.fused_gating) {
        const float a = bits_to_float(bits.first, p.a_dtype);
        const float b = bits_to_float(bits.second, p.b_dtype);
        const float rate = -expf(bits_to_float(bits.a_log, p.a_log_dtype));
        const float x = a + bits_to_float(bits.dt_bias, p.dt_bias_dtype);
        g = rate * (x > 20.f ? x : log1pf(expf(x)));
        beta = 1.f / (1.f + expf(-b));
    } else {
        g = bits_to_float(bits.first, p.g_dtype);
        beta = bits_to_float(bits.second, p.beta_dtype);
    }
    decay = expf(g);
}

// The l2-norm scales of q and k (1 without l2 norm) and their normalised dot product, from
// q_s and k_s (128 each); every warp computes them itself.
__device__ __forceinline__ void decode_norms(const DecodeParams& p, const float* q_s,
                                             const float* k_s, float& q_scale, float& k_scale,
                                             float& kq) {
    const int lane = threadIdx.x % 32;
    float qq = 0.f, kk = 0.f, x = 0.f;
#pragma unroll
    for (int r = lane; r < 128; r += 32) {
        const float qv = q_s[r], kv = k_s[r];
        qq = fmaf(qv, qv, qq);
        kk = fmaf(kv, kv, kk);
        x = fmaf(kv, qv, x);
    }
    q_scale = k_scale = 1.f;
    if (p.l2norm) {
        q_scale = rsqrtf(warp_sum(qq) + 1e-6f);
        k_scale = rsqrtf(warp_sum(kk) + 1e-6f);
    }
    kq = warp_sum(x) * q_scale * k_scale;
}

template <bool BF16_POOL>
__device__ void decode_bands_body(const DecodeParams& p) {
    typedef typename Select<BF16_POOL>::Elem Elem;
    constexpr int BAND = BAND_ROWS * 128;  // elements of one warp's band
    // 128-byte aligned: bulk copies to and from a slab aligned to 16 bytes only run 12% slower
    // at B = 256 (measured; see docs/cuda-kernel-log.md).
    extern __shared__ __align__(128) unsigned char slab_bytes[];
    __shared__ float q_s[128], k_s[128];
    __shared__ __align__(16) float partial[BAND_WARPS][2][128];
    __shared__ float gate_s[2];
    __shared__ __align__(8) unsigned long long band_bar[BAND_WARPS];
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, col0 = lane * 4;
    const int head = blockIdx.y, row_b = blockIdx.z;
    const int H = p.value_heads, key_head = key_head_of(p, head);
    // The slot first: the bulk loads wait for it. (A plain load here measured 0.1-0.9% faster
    // than the predicated one the registers kernel uses; the inputs after it are needed only
    // once the band has landed.)
    const i64 slot = load_index((const void*)p.slots, row_b, p.slot_dtype);
    unsigned q_bits = 0u, k_bits = 0u, v_bits[4];
    if (tid < 128) {
        const i64 qk = ((i64)row_b * p.key_heads + key_head) * 128 + tid;
        q_bits = load_bits((const void*)p.q, qk, p.act_dtype);
        k_bits = load_bits((const void*)p.k, qk, p.act_dtype);
    }
    const i64 v_row = ((i64)row_b * H + head) * 128;
#pragma unroll
    for (int j = 0; j < 4; ++j) v_bits[j] = load_bits((const void*)p.v, v_row + col0 + j, p.act_dtype);
    GateBits gate_bits;
    if (tid == 0) gate_bits = load_gate_bits(p, (i64)row_b * H + head, head);
    float* inter = p.intermediate ? (float*)p.intermediate + v_row * 128 + warp * BAND : nullptr;

    if (slot < 0 || slot >= p.pool_slots) {  // skipped row: no slot read or written
        const float fill = skip_fill(slot);
        if (warp == 0)
#pragma unroll
            for (int j = 0; j < 4; ++j) store_float((void*)p.o, v_row + col0 + j, p.out_dtype, fill);
        if (inter)
            for (int i = 0; i < BAND_ROWS; ++i)
                *(float4*)(inter + i * 128 + col0) = make_float4(fill, fill, fill, fill);
        return;
    }

    Elem* band = (Elem*)slab_bytes + warp * BAND;
    Elem* pool = (Elem*)p.pool + ((i64)slot * H + head) * 128 * 128 + warp * BAND;
    if (lane == 0) {
        bulk_barrier_init(&band_bar[warp]);
        bulk_expect(&band_bar[warp], BAND * sizeof(Elem));
        bulk_load(band, pool, BAND * sizeof(Elem), &band_bar[warp]);
    }
    if (tid < 128) {
        q_s[tid] = bits_to_float(q_bits, p.act_dtype);
        k_s[tid] = bits_to_float(k_bits, p.act_dtype);
    }
    if (tid == 0) decode_gates(p, gate_bits, gate_s[0], gate_s[1]);
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = bits_to_float(v_bits[j], p.act_dtype);
    __syncthreads();  // q_s, k_s, gate_s published (and every band's mbarrier initialised)
    float q_scale, k_scale, kq;
    decode_norms(p, q_s, k_s, q_scale, k_scale, kq);
    const float decay = gate_s[0], beta = gate_s[1];

    bulk_wait(&band_bar[warp], 0);
    float sum_k[4] = {0.f, 0.f, 0.f, 0.f}, sum_q[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 8
    for (int i = 0; i < BAND_ROWS; ++i) {
        const int r = warp * BAND_ROWS + i;
        float s[4];
        widen<BF16_POOL, 4>(band + i * 128 + col0, s);
        const float kr = k_s[r], qr = q_s[r];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            sum_k[j] = fmaf(s[j], kr, sum_k[j]);
            sum_q[j] = fmaf(s[j], qr, sum_q[j]);
        }
    }
    *(float4*)&partial[warp][0][col0] = make_float4(sum_k[0], sum_k[1], sum_k[2], sum_k[3]);
    *(float4*)&partial[warp][1][col0] = make_float4(sum_q[0], sum_q[1], sum_q[2], sum_q[3]);
    __syncthreads();  // column sums of every band published
    float sk[4] = {0.f, 0.f, 0.f, 0.f}, sq[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int w = 0; w < BAND_WARPS; ++w) {
        const float4 a = *(const float4*)&partial[w][0][col0];
        const float4 b = *(const float4*)&partial[w][1][col0];
        sk[0] += a.x; sk[1] += a.y; sk[2] += a.z; sk[3] += a.w;
        sq[0] += b.x; sq[1] += b.y; sq[2] += b.z; sq[3] += b.w;
    }
    float new_v[4];
    const float k_decay = decay * k_scale, q_decay = decay * q_scale;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        new_v[j] = beta * (v[j] - k_decay * sk[j]);
        if (warp == 0)
            store_float((void*)p.o, v_row + col0 + j, p.out_dtype,
                        p.scale * (q_decay * sq[j] + kq * new_v[j]));
    }
#pragma unroll 8
    for (int i = 0; i < BAND_ROWS; ++i) {
        const int r = warp * BAND_ROWS + i;
        float s[4];
        widen<BF16_POOL, 4>(band + i * 128 + col0, s);
        const float kr = k_s[r] * k_scale;
#pragma unroll
        for (int j = 0; j < 4; ++j) s[j] = fmaf(kr, new_v[j], decay * s[j]);
        if (inter) narrow<false, 4>(inter + i * 128 + col0, s);
        narrow<BF16_POOL, 4>(band + i * 128 + col0, s);
    }
    // The band's writes become visible to the copy engine, then one lane stores the band.
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncwarp();
    if (lane == 0) bulk_store(pool, band, BAND * sizeof(Elem));
}

template <bool BF16_POOL>
__device__ void decode_registers_body(const DecodeParams& p) {
    constexpr int TILE = 16;
    __shared__ float q_s[128], k_s[128];
    __shared__ float partial[THREADS / 32][2][TILE];
    __shared__ float gate_s[2];
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int col_group = tid % 8, row_group = tid / 8;
    const int tile = blockIdx.x, head = blockIdx.y, row_b = blockIdx.z;
    const int H = p.value_heads, key_head = key_head_of(p, head);
    const int col = tile * TILE + col_group * 2;
    // Every input load is issued before any is waited for, the slot first: the state's address
    // waits for it.
    const i64 slot = load_index_async((const void*)p.slots, row_b, p.slot_dtype);
    const i64 qk = ((i64)row_b * p.key_heads + key_head) * 128 + tid;
    const unsigned q_bits = load_bits((const void*)p.q, qk, p.act_dtype);
    const unsigned k_bits = load_bits((const void*)p.k, qk, p.act_dtype);
    const i64 v_row = ((i64)row_b * H + head) * 128;
    const unsigned v0_bits = load_bits((const void*)p.v, v_row + col, p.act_dtype);
    const unsigned v1_bits = load_bits((const void*)p.v, v_row + col + 1, p.act_dtype);
    GateBits gate_bits;
    if (tid == 0) gate_bits = load_gate_bits(p, (i64)row_b * H + head, head);
    float* inter = p.intermediate ? (float*)p.intermediate + v_row * 128 + col : nullptr;

    if (slot < 0 || slot >= p.pool_slots) {  // skipped row: no slot read or written
        const float fill = skip_fill(slot);
        if (row_group == 0) {
            store_float((void*)p.o, v_row + col, p.out_dtype, fill);
            store_float((void*)p.o, v_row + col + 1, p.out_dtype, fill);
        }
        if (inter)
#pragma unroll
            for (int i = 0; i < 8; ++i)
                *(float2*)(inter + (row_group + 16 * i) * 128) = make_float2(fill, fill);
        return;
    }

    typedef typename Select<BF16_POOL>::Elem Elem;
    Elem* pool = (Elem*)p.pool + ((i64)slot * H + head) * 128 * 128 + col;
    float s[8][2];
#pragma unroll
    for (int i = 0; i < 8; ++i) widen<BF16_POOL, 2>(pool + (row_group + 16 * i) * 128, s[i]);
    q_s[tid] = bits_to_float(q_bits, p.act_dtype);
    k_s[tid] = bits_to_float(k_bits, p.act_dtype);
    if (tid == 0) decode_gates(p, gate_bits, gate_s[0], gate_s[1]);
    const float v0 = bits_to_float(v0_bits, p.act_dtype), v1 = bits_to_float(v1_bits, p.act_dtype);
    __syncthreads();  // q_s, k_s, gate_s published
    float q_scale, k_scale, kq;
    decode_norms(p, q_s, k_s, q_scale, k_scale, kq);
    const float decay = gate_s[0], beta = gate_s[1];
    float sk0 = 0.f, sk1 = 0.f, sq0 = 0.f, sq1 = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int r = row_group + 16 * i;
        const float kr = k_s[r], qr = q_s[r];
        sk0 = fmaf(s[i][0], kr, sk0);
        sk1 = fmaf(s[i][1], kr, sk1);
        sq0 = fmaf(s[i][0], qr, sq0);
        sq1 = fmaf(s[i][1], qr, sq1);
    }
    // Lanes 8 apart share a column group: fold the warp's four row groups, then the warps.
#pragma unroll
    for (int offset = 8; offset < 32; offset <<= 1) {
        sk0 += __shfl_xor_sync(0xffffffffu, sk0, offset);
        sk1 += __shfl_xor_sync(0xffffffffu, sk1, offset);
        sq0 += __shfl_xor_sync(0xffffffffu, sq0, offset);
        sq1 += __shfl_xor_sync(0xffffffffu, sq1, offset);
    }
    if (lane < 8) {
        partial[warp][0][2 * lane] = sk0;
        partial[warp][0][2 * lane + 1] = sk1;
        partial[warp][1][2 * lane] = sq0;
        partial[warp][1][2 * lane + 1] = sq1;
    }
    __syncthreads();  // partial sums published
    const int c = col_group * 2;
    float tk[2], tq[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        tk[j] = partial[0][0][c + j] + partial[1][0][c + j] + partial[2][0][c + j] + partial[3][0][c + j];
        tq[j] = partial[0][1][c + j] + partial[1][1][c + j] + partial[2][1][c + j] + partial[3][1][c + j];
    }
    const float k_decay = decay * k_scale, q_decay = decay * q_scale;
    const float nv0 = beta * (v0 - k_decay * tk[0]), nv1 = beta * (v1 - k_decay * tk[1]);
    if (row_group == 0) {
        store_float((void*)p.o, v_row + col, p.out_dtype, p.scale * (q_decay * tq[0] + kq * nv0));
        store_float((void*)p.o, v_row + col + 1, p.out_dtype, p.scale * (q_decay * tq[1] + kq * nv1));
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int r = row_group + 16 * i;
        const float kr = k_s[r] * k_scale;
        float x[2] = {fmaf(kr, nv0, decay * s[i][0]), fmaf(kr, nv1, decay * s[i][1])};
        if (inter) narrow<false, 2>(inter + r * 128, x);
        narrow<BF16_POOL, 2>(pool + r * 128, x);
    }
}

extern "C" __global__ void __launch_bounds__(BAND_THREADS, 3)
    gdn_decode_k128_v128_t1_bands_f32(const DecodeParams p) {
    decode_bands_body<false>(p);
}
extern "C" __global__ void __launch_bounds__(BAND_THREADS, 3)
    gdn_decode_k128_v128_t1_bands_bf16(const DecodeParams p) {
    decode_bands_body<true>(p);
}
extern "C" __global__ void __launch_bounds__(THREADS, 8)
    gdn_decode_k128_v128_t1_registers_f32(const DecodeParams p) {
    decode_registers_body<false>(p);
}
extern "C" __global__ void __launch_bounds__(THREADS, 8)
    gdn_decode_k128_v128_t1_registers_bf16(const DecodeParams p) {
    decode_registers_body<true>(p);
}

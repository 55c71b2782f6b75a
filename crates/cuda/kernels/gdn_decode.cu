// GDN decode over a state pool, in place: T = 1..=16 new tokens per batch row.
//
// For row b with slot s = slot_indices[b] >= 0, value head h (key head h / (H / Hg)) and each
// token t in order, with S = pool[s, h] (K x V, f32 arithmetic):
//
//     (optional) q_t <- q_t / sqrt(|q_t|^2 + 1e-6), k_t likewise
//     S   <- exp(g_t) * S
//     v'  <- beta_t * (v_t - S^T k_t)
//     S   <- S + k_t v'^T
//     o_t <- scale * S^T q_t
//
// One block of 128 threads owns one (row, value head, tile of columns): the tile's K x W slab
// lives in registers for all T tokens, so the pool is read once and written once per call.
// Thread (row group r = tid / 8, column group c = tid % 8) holds rows r, r + 16, r + 32, ...
// (ROWS of them) and VEC consecutive columns; W = 8 * VEC. Both S^T k and S^T q come from one
// reduction over the decayed state: o_t = scale * (S_dec^T q_t + (k_t . q_t) v'), which equals
// the definition because S_new^T q = S_dec^T q + q . k v'.
//
// A negative slot writes zeros to o (and to the intermediate states) and touches no slot.

#define THREADS 128
#define COL_GROUPS 8
#define ROW_GROUPS 16
#define WARPS (THREADS / 32)
#define MAX_K 256

struct DecodeParams {
    u64 q, k, v;                 // [B, T, Hg, K], [B, T, Hg, K], [B, T, H, V]
    u64 g, beta;                 // [B, T, H] (direct gating)
    u64 a, b, a_log, dt_bias;    // [B, T, H], [B, T, H], [H], [H] (fused gating)
    u64 slots;                   // [B] i32 or i64
    u64 pool;                    // [S, H, K, V] f32 or bf16
    u64 o;                       // [B, T, H, V]
    u64 intermediate;            // [B, T, H, K, V] f32, or 0
    int batch, tokens, key_heads, value_heads, key_dim, value_dim;
    int act_dtype, out_dtype, g_dtype, beta_dtype, a_dtype, b_dtype, a_log_dtype, dt_bias_dtype;
    int slot_dtype, fused_gating, l2norm;
    float scale;
};

// Sums `x` over the block; every thread gets the total. `scratch` holds WARPS floats.
__device__ __forceinline__ float block_sum(float x, float* scratch) {
    x = warp_sum(x);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) scratch[warp] = x;
    __syncthreads();
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) total += scratch[w];
    __syncthreads();
    return total;
}

template <bool BF16_POOL, int VEC>
__device__ __forceinline__ void load_cols(const void* pool, i64 index, float* dst) {
    if (BF16_POOL) {
        const unsigned short* p = (const unsigned short*)pool + index;
        if (VEC == 4) {
            uint2 bits = *(const uint2*)p;
            dst[0] = __uint_as_float(bits.x << 16);
            dst[1] = __uint_as_float(bits.x & 0xffff0000u);
            dst[2] = __uint_as_float(bits.y << 16);
            dst[3] = __uint_as_float(bits.y & 0xffff0000u);
        } else {
#pragma unroll
            for (int j = 0; j < VEC; ++j) dst[j] = bf16_to_f32(p[j]);
        }
    } else {
        const float* p = (const float*)pool + index;
        if (VEC == 4) {
            float4 x = *(const float4*)p;
            dst[0] = x.x; dst[1] = x.y; dst[2] = x.z; dst[3] = x.w;
        } else {
#pragma unroll
            for (int j = 0; j < VEC; ++j) dst[j] = p[j];
        }
    }
}

template <bool BF16_POOL, int VEC>
__device__ __forceinline__ void store_cols(void* pool, i64 index, const float* src) {
    if (BF16_POOL) {
        unsigned short* p = (unsigned short*)pool + index;
        if (VEC == 4) {
            uint2 bits;
            bits.x = (unsigned)f32_to_bf16(src[0]) | ((unsigned)f32_to_bf16(src[1]) << 16);
            bits.y = (unsigned)f32_to_bf16(src[2]) | ((unsigned)f32_to_bf16(src[3]) << 16);
            *(uint2*)p = bits;
        } else {
#pragma unroll
            for (int j = 0; j < VEC; ++j) p[j] = f32_to_bf16(src[j]);
        }
    } else {
        float* p = (float*)pool + index;
        if (VEC == 4) {
            *(float4*)p = make_float4(src[0], src[1], src[2], src[3]);
        } else {
#pragma unroll
            for (int j = 0; j < VEC; ++j) p[j] = src[j];
        }
    }
}

template <int ROWS, int VEC, bool BF16_POOL>
__device__ void gdn_decode_body(const DecodeParams& p) {
    const int tile = blockIdx.x, head = blockIdx.y, row_b = blockIdx.z;
    const int tid = threadIdx.x;
    const int col_group = tid % COL_GROUPS, row_group = tid / COL_GROUPS;
    const int K = p.key_dim, V = p.value_dim, H = p.value_heads, T = p.tokens;
    const int key_head = head / (H / p.key_heads);
    const int col0 = tile * (COL_GROUPS * VEC) + col_group * VEC;
    // VEC == 4 is only chosen when V % 4 == 0, so a vector is either wholly in or wholly out.
    const bool col_in = col0 < V;

    __shared__ float q_s[MAX_K], k_s[MAX_K];
    __shared__ float scratch[WARPS];
    __shared__ float partial[WARPS][2][COL_GROUPS * VEC];
    __shared__ float gate_s[2];

    const i64 slot = load_index((const void*)p.slots, row_b, p.slot_dtype);
    float* inter = (float*)p.intermediate;

    if (slot < 0) {
        // Skipped row: zeros out, no slot read or written.
        for (int t = 0; t < T; ++t) {
            const i64 o_row = ((i64)(row_b * T + t) * H + head) * V;
            if (row_group == 0 && col_in) {
#pragma unroll
                for (int j = 0; j < VEC; ++j)
                    if (col0 + j < V) store_float((void*)p.o, o_row + col0 + j, p.out_dtype, 0.f);
            }
            if (inter) {
                const i64 base = ((i64)(row_b * T + t) * H + head) * K * V;
#pragma unroll
                for (int i = 0; i < ROWS; ++i) {
                    const int r = row_group + ROW_GROUPS * i;
                    if (r < K && col_in)
#pragma unroll
                        for (int j = 0; j < VEC; ++j)
                            if (col0 + j < V) inter[base + (i64)r * V + col0 + j] = 0.f;
                }
            }
        }
        return;
    }

    const i64 slab = ((i64)slot * H + head) * K * V;
    float s[ROWS][VEC];
#pragma unroll
    for (int i = 0; i < ROWS; ++i) {
        const int r = row_group + ROW_GROUPS * i;
        if (r < K && col_in) {
            load_cols<BF16_POOL, VEC>((const void*)p.pool, slab + (i64)r * V + col0, s[i]);
        } else {
#pragma unroll
            for (int j = 0; j < VEC; ++j) s[i][j] = 0.f;
        }
    }

    for (int t = 0; t < T; ++t) {
        const i64 token = (i64)row_b * T + t;
        const i64 qk_row = (token * p.key_heads + key_head) * K;
        float qq = 0.f, kk = 0.f, kq = 0.f;
        for (int r = tid; r < K; r += THREADS) {
            const float qv = load_float((const void*)p.q, qk_row + r, p.act_dtype);
            const float kv = load_float((const void*)p.k, qk_row + r, p.act_dtype);
            q_s[r] = qv;
            k_s[r] = kv;
            qq += qv * qv;
            kk += kv * kv;
            kq += kv * qv;
        }
        if (tid == 0) {
            const i64 gate = token * H + head;
            float g, beta;
            if (p.fused_gating) {
                const float a = load_float((const void*)p.a, gate, p.a_dtype);
                const float b = load_float((const void*)p.b, gate, p.b_dtype);
                const float a_log = load_float((const void*)p.a_log, head, p.a_log_dtype);
                const float bias = load_float((const void*)p.dt_bias, head, p.dt_bias_dtype);
                const float x = a + bias;
                const float softplus = x > 20.f ? x : log1pf(expf(x));
                g = -expf(a_log) * softplus;
                beta = 1.f / (1.f + expf(-b));
            } else {
                g = load_float((const void*)p.g, gate, p.g_dtype);
                beta = load_float((const void*)p.beta, gate, p.beta_dtype);
            }
            gate_s[0] = expf(g);
            gate_s[1] = beta;
        }
        float q_scale = 1.f, k_scale = 1.f;
        if (p.l2norm) {
            q_scale = rsqrtf(block_sum(qq, scratch) + 1e-6f);
            k_scale = rsqrtf(block_sum(kk, scratch) + 1e-6f);
        }
        kq = block_sum(kq, scratch) * q_scale * k_scale;  // also publishes q_s, k_s, gate_s
        const float decay = gate_s[0], beta = gate_s[1];

        float sum_k[VEC], sum_q[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) sum_k[j] = sum_q[j] = 0.f;
#pragma unroll
        for (int i = 0; i < ROWS; ++i) {
            const int r = row_group + ROW_GROUPS * i;
            const float kr = r < K ? k_s[r] * k_scale : 0.f;
            const float qr = r < K ? q_s[r] * q_scale : 0.f;
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
                s[i][j] *= decay;
                sum_k[j] = fmaf(s[i][j], kr, sum_k[j]);
                sum_q[j] = fmaf(s[i][j], qr, sum_q[j]);
            }
        }
        // Lanes 8 apart share a column group: fold the warp's 4 row groups, then the warps.
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
#pragma unroll
            for (int offset = 8; offset < 32; offset <<= 1) {
                sum_k[j] += __shfl_xor_sync(0xffffffffu, sum_k[j], offset);
                sum_q[j] += __shfl_xor_sync(0xffffffffu, sum_q[j], offset);
            }
        }
        const int warp = tid / 32, lane = tid % 32;
        if (lane < COL_GROUPS) {
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
                partial[warp][0][lane * VEC + j] = sum_k[j];
                partial[warp][1][lane * VEC + j] = sum_q[j];
            }
        }
        __syncthreads();
        float new_v[VEC], out[VEC];
        const i64 v_row = (token * H + head) * V;
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
            float sk = 0.f, sq = 0.f;
#pragma unroll
            for (int w = 0; w < WARPS; ++w) {
                sk += partial[w][0][col_group * VEC + j];
                sq += partial[w][1][col_group * VEC + j];
            }
            const bool in = col0 + j < V;
            const float vv = in ? load_float((const void*)p.v, v_row + col0 + j, p.act_dtype) : 0.f;
            new_v[j] = beta * (vv - sk);
            out[j] = p.scale * (sq + kq * new_v[j]);
        }
#pragma unroll
        for (int i = 0; i < ROWS; ++i) {
            const int r = row_group + ROW_GROUPS * i;
            const float kr = r < K ? k_s[r] * k_scale : 0.f;
#pragma unroll
            for (int j = 0; j < VEC; ++j) s[i][j] = fmaf(kr, new_v[j], s[i][j]);
        }
        if (row_group == 0 && col_in) {
#pragma unroll
            for (int j = 0; j < VEC; ++j)
                if (col0 + j < V) store_float((void*)p.o, v_row + col0 + j, p.out_dtype, out[j]);
        }
        if (inter && col_in) {
            const i64 base = (token * H + head) * K * V;
#pragma unroll
            for (int i = 0; i < ROWS; ++i) {
                const int r = row_group + ROW_GROUPS * i;
                if (r < K) store_cols<false, VEC>((void*)inter, base + (i64)r * V + col0, s[i]);
            }
        }
        __syncthreads();  // q_s, k_s, partial and gate_s are rewritten by the next token
    }

#pragma unroll
    for (int i = 0; i < ROWS; ++i) {
        const int r = row_group + ROW_GROUPS * i;
        if (r < K && col_in) store_cols<BF16_POOL, VEC>((void*)p.pool, slab + (i64)r * V + col0, s[i]);
    }
}

// One entry point per (rows per thread, columns per thread, pool dtype); the host picks ROWS =
// ceil(K / 16) rounded up to 4, 8 or 16, and VEC = 4 when V % 4 == 0.
#define DECODE_ENTRY(ROWS, VEC, BF16, NAME)                                          \
    extern "C" __global__ void __launch_bounds__(THREADS) NAME(const DecodeParams p) { \
        gdn_decode_body<ROWS, VEC, BF16>(p);                                          \
    }

DECODE_ENTRY(4, 4, false, gdn_decode_r4_v4_f32)
DECODE_ENTRY(8, 4, false, gdn_decode_r8_v4_f32)
DECODE_ENTRY(16, 4, false, gdn_decode_r16_v4_f32)
DECODE_ENTRY(4, 1, false, gdn_decode_r4_v1_f32)
DECODE_ENTRY(8, 1, false, gdn_decode_r8_v1_f32)
DECODE_ENTRY(16, 1, false, gdn_decode_r16_v1_f32)
DECODE_ENTRY(4, 4, true, gdn_decode_r4_v4_bf16)
DECODE_ENTRY(8, 4, true, gdn_decode_r8_v4_bf16)
DECODE_ENTRY(16, 4, true, gdn_decode_r16_v4_bf16)
DECODE_ENTRY(4, 1, true, gdn_decode_r4_v1_bf16)
DECODE_ENTRY(8, 1, true, gdn_decode_r8_v1_bf16)
DECODE_ENTRY(16, 1, true, gdn_decode_r16_v1_bf16)

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
// is read from the pool once, kept for all T tokens, and written back once. Thread (row group
// r = tid / 8, column group c = tid % 8) owns rows r, r + 16, r + 32, ... (ROWS of them) and
// VEC consecutive columns; W = 8 * VEC.
//
// The slab lands in shared memory through cp.async, each thread copying exactly the elements
// it owns (so no barrier guards them). Holding it there rather than in registers lets many
// more blocks, and so many more bytes, be in flight per multiprocessor: the kernel is bound by
// memory bandwidth, and register-resident slabs capped it at 4 to 6 blocks per SM.
//
// Per token, two sweeps over the owned elements: the first forms S^T k and S^T q (the decay is
// a scalar, applied to the sums), the second writes exp(g) S + k v'^T. One reduction serves
// both sums: o_t = scale * (S_dec^T q_t + (k_t . q_t) v'), equal to the definition because
// S_new^T q = S_dec^T q + q . k v'. A token costs two block barriers; q, k, v and the gates of
// the next token are loaded while the current one is computed.
//
// A negative slot writes zeros to o (and to the intermediate states) and touches no slot. A slot
// at or past the pool's slot count (possible only when a prepared launch is replayed after its
// indices were rewritten on the device: every call checks them on the host) touches no slot
// either and writes NaN, so the row's fault shows in its output instead of in another slot.

#define MAX_K 256
#define THREADS 128
#define WARPS (THREADS / 32)

// What a skipped row's outputs hold: zeros for a negative slot, NaN for one past the pool.
__device__ __forceinline__ float skip_fill(long long slot) {
    return slot < 0 ? 0.f : __int_as_float(0x7fc00000);
}

// The pool's element type: f32, or bf16 carried as its bits.
template <bool BF16> struct Select { typedef float Elem; };
template <> struct Select<true> { typedef unsigned short Elem; };

struct DecodeParams {
    u64 q, k, v;                 // [B, T, Hg, K], [B, T, Hg, K], [B, T, H, V]
    u64 g, beta;                 // [B, T, H] (direct gating)
    u64 a, b, a_log, dt_bias;    // [B, T, H], [B, T, H], [H], [H] (fused gating)
    u64 slots;                   // [B] i32 or i64
    u64 pool;                    // [S, H, K, V] f32 or bf16
    u64 o;                       // [B, T, H, V]
    u64 intermediate;            // [B, T, H, K, V] f32, or 0
    u64 key_head_magic;          // ceil(2^32 / (H / Hg)): head * magic >> 32 is head's key head
    int batch, tokens, key_heads, value_heads, key_dim, value_dim;
    int act_dtype, out_dtype, g_dtype, beta_dtype, a_dtype, b_dtype, a_log_dtype, dt_bias_dtype;
    int slot_dtype, fused_gating, l2norm;
    float scale;
    long long pool_slots;        // S: a slot index at or past it is refused in the kernel too
};

// Asynchronous copy of BYTES (4, 8 or 16; 2 is copied synchronously) from global to shared
// memory.
template <int BYTES>
__device__ __forceinline__ void copy_async(void* dst, const void* src) {
    if (BYTES == 2) {
        *(unsigned short*)dst = *(const unsigned short*)src;
    } else if (BYTES == 16) {
        // The 256-byte L2 prefetch hint: neighbouring row segments are read by the same warp or
        // by the blocks of the neighbouring tiles, which run at the same time.
        asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;" ::"r"(shared_address(dst)),
                     "l"(src));
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(shared_address(dst)), "l"(src),
                     "n"(BYTES));
    }
}

__device__ __forceinline__ void copy_async_wait_all() {
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
}

// VEC pool elements (f32 or bf16) widened to f32.
template <bool BF16_POOL, int VEC>
__device__ __forceinline__ void widen(const void* src, float* dst) {
    if (BF16_POOL) {
        const unsigned short* p = (const unsigned short*)src;
        if (VEC == 8) {
            const uint4 bits = *(const uint4*)p;
            const unsigned words[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                dst[2 * w] = __uint_as_float(words[w] << 16);
                dst[2 * w + 1] = __uint_as_float(words[w] & 0xffff0000u);
            }
        } else if (VEC == 4) {
            const uint2 bits = *(const uint2*)p;
            dst[0] = __uint_as_float(bits.x << 16);
            dst[1] = __uint_as_float(bits.x & 0xffff0000u);
            dst[2] = __uint_as_float(bits.y << 16);
            dst[3] = __uint_as_float(bits.y & 0xffff0000u);
        } else if (VEC == 2) {
            const unsigned bits = *(const unsigned*)p;
            dst[0] = __uint_as_float(bits << 16);
            dst[1] = __uint_as_float(bits & 0xffff0000u);
        } else {
#pragma unroll
            for (int j = 0; j < VEC; ++j) dst[j] = bf16_to_f32(p[j]);
        }
    } else {
        if (VEC == 2) {
            const float2 x = *(const float2*)src;
            dst[0] = x.x; dst[1] = x.y;
        } else if (VEC % 4 == 0) {
#pragma unroll
            for (int h = 0; h < VEC / 4; ++h) {
                const float4 x = ((const float4*)src)[h];
                dst[4 * h] = x.x; dst[4 * h + 1] = x.y; dst[4 * h + 2] = x.z; dst[4 * h + 3] = x.w;
            }
        } else {
#pragma unroll
            for (int j = 0; j < VEC; ++j) dst[j] = ((const float*)src)[j];
        }
    }
}

// VEC f32 values stored as pool elements (f32, or bf16 rounded to nearest even).
template <bool BF16_POOL, int VEC>
__device__ __forceinline__ void narrow(void* dst, const float* src) {
    if (BF16_POOL) {
        unsigned short* p = (unsigned short*)dst;
        if (VEC == 8) {
            unsigned words[4];
#pragma unroll
            for (int w = 0; w < 4; ++w)
                words[w] = (unsigned)f32_to_bf16(src[2 * w]) | ((unsigned)f32_to_bf16(src[2 * w + 1]) << 16);
            *(uint4*)p = make_uint4(words[0], words[1], words[2], words[3]);
        } else if (VEC == 4) {
            uint2 bits;
            bits.x = (unsigned)f32_to_bf16(src[0]) | ((unsigned)f32_to_bf16(src[1]) << 16);
            bits.y = (unsigned)f32_to_bf16(src[2]) | ((unsigned)f32_to_bf16(src[3]) << 16);
            *(uint2*)p = bits;
        } else if (VEC == 2) {
            *(unsigned*)p = (unsigned)f32_to_bf16(src[0]) | ((unsigned)f32_to_bf16(src[1]) << 16);
        } else {
#pragma unroll
            for (int j = 0; j < VEC; ++j) p[j] = f32_to_bf16(src[j]);
        }
    } else {
        if (VEC == 2) {
            *(float2*)dst = make_float2(src[0], src[1]);
        } else if (VEC % 4 == 0) {
#pragma unroll
            for (int h = 0; h < VEC / 4; ++h)
                ((float4*)dst)[h] = make_float4(src[4 * h], src[4 * h + 1], src[4 * h + 2], src[4 * h + 3]);
        } else {
#pragma unroll
            for (int j = 0; j < VEC; ++j) ((float*)dst)[j] = src[j];
        }
    }
}

// What one token needs besides the state, loaded into registers one token ahead so that the
// global-memory latency of q, k, v and the gates overlaps the state loads and the arithmetic.
template <int VEC>
struct TokenInputs {
    float q[MAX_K / THREADS], k[MAX_K / THREADS];  // elements tid and tid + THREADS
    float v[VEC];                                  // this thread's columns
    float gate_a, gate_b;                          // g, beta (or a, b for fused gating); tid 0
};

template <int VEC>
__device__ __forceinline__ void load_token(const DecodeParams& p, int K, int V, i64 token,
                                           int head, int key_head, int col0,
                                           TokenInputs<VEC>& in) {
    const int H = p.value_heads;
    const int tid = threadIdx.x;
    const i64 qk_row = (token * p.key_heads + key_head) * K;
#pragma unroll
    for (int i = 0; i < MAX_K / THREADS; ++i) {
        const int r = tid + THREADS * i;
        in.q[i] = r < K ? load_float((const void*)p.q, qk_row + r, p.act_dtype) : 0.f;
        in.k[i] = r < K ? load_float((const void*)p.k, qk_row + r, p.act_dtype) : 0.f;
    }
    const i64 v_row = (token * H + head) * V;
#pragma unroll
    for (int j = 0; j < VEC; ++j)
        in.v[j] = col0 + j < V ? load_float((const void*)p.v, v_row + col0 + j, p.act_dtype) : 0.f;
    if (tid == 0) {
        const i64 gate = token * H + head;
        if (p.fused_gating) {
            in.gate_a = load_float((const void*)p.a, gate, p.a_dtype);
            in.gate_b = load_float((const void*)p.b, gate, p.b_dtype);
        } else {
            in.gate_a = load_float((const void*)p.g, gate, p.g_dtype);
            in.gate_b = load_float((const void*)p.beta, gate, p.beta_dtype);
        }
    }
}

// ROWS rows and VEC columns per thread; FIXED_DIM > 0 compiles for K = V = FIXED_DIM (row
// offsets become immediates).
template <int ROWS, int VEC, bool BF16_POOL, int FIXED_DIM>
__device__ void gdn_decode_body(const DecodeParams& p) {
    constexpr int COL_GROUPS = 8;
    constexpr int ROW_GROUPS = THREADS / COL_GROUPS;
    typedef typename Select<BF16_POOL>::Elem Elem;
    constexpr int TILE = COL_GROUPS * VEC;
    const int tile = blockIdx.x, head = blockIdx.y, row_b = blockIdx.z;
    const int tid = threadIdx.x;
    const int col_group = tid % COL_GROUPS, row_group = tid / COL_GROUPS;
    const int warp = tid / 32, lane = tid % 32;
    const int K = FIXED_DIM ? FIXED_DIM : p.key_dim;
    const int V = FIXED_DIM ? FIXED_DIM : p.value_dim;
    const int H = p.value_heads, T = p.tokens;
    const int key_head = head / (H / p.key_heads);
    const int col0 = tile * TILE + col_group * VEC;
    // VEC > 1 is only chosen when V % VEC == 0, so a vector is either wholly in or wholly out.
    const bool col_in = col0 < V;

    // The slab lands in the pool's dtype; between tokens it is kept in f32 (for an f32 pool in
    // place, for a bf16 pool in a second area the host sizes only when T > 1), so a bf16 pool
    // is rounded once per call whatever T is.
    // 128-byte aligned, as gdn_decode_t1.cu declares it (one declaration per program).
    extern __shared__ __align__(128) unsigned char slab_bytes[];
    Elem* landing = (Elem*)slab_bytes;
    float* work = (float*)(slab_bytes + (BF16_POOL ? ROWS * ROW_GROUPS * TILE * sizeof(Elem) : 0));
    const int own = col_group * VEC;  // this thread's first column within the tile
    __shared__ float q_s[MAX_K], k_s[MAX_K];
    __shared__ float partial[WARPS][2][TILE];
    __shared__ float gate_s[2];

    // The first token's q, k, v and gates do not depend on the slot: their loads are issued
    // first, so their latency overlaps the slot index's.
    TokenInputs<VEC> next;
    load_token<VEC>(p, K, V, (i64)row_b * T, head, key_head, col0, next);
    const i64 slot = load_index((const void*)p.slots, row_b, p.slot_dtype);
    float* inter = (float*)p.intermediate;

    if (slot < 0 || slot >= p.pool_slots) {
        // Skipped row: zeros out (NaN for an index past the pool), no slot read or written.
        const float fill = skip_fill(slot);
        for (int t = 0; t < T; ++t) {
            const i64 o_row = ((i64)(row_b * T + t) * H + head) * V;
            if (row_group == 0 && col_in) {
#pragma unroll
                for (int j = 0; j < VEC; ++j)
                    if (col0 + j < V) store_float((void*)p.o, o_row + col0 + j, p.out_dtype, fill);
            }
            if (inter) {
                const i64 base = ((i64)(row_b * T + t) * H + head) * K * V;
#pragma unroll
                for (int i = 0; i < ROWS; ++i) {
                    const int r = row_group + ROW_GROUPS * i;
                    if (r < K && col_in)
#pragma unroll
                        for (int j = 0; j < VEC; ++j)
                            if (col0 + j < V) inter[base + (i64)r * V + col0 + j] = fill;
                }
            }
        }
        return;
    }

    // The owned slab elements are copied asynchronously into shared memory.
    const i64 slab = ((i64)slot * H + head) * K * V;
    const Elem* pool = (const Elem*)p.pool;
#pragma unroll
    for (int i = 0; i < ROWS; ++i) {
        const int r = row_group + ROW_GROUPS * i;
        Elem* dst = landing + r * TILE + own;
        if (r < K && col_in) {
            copy_async<VEC * sizeof(Elem)>(dst, pool + slab + (i64)r * V + col0);
        } else {
#pragma unroll
            for (int j = 0; j < VEC; ++j) dst[j] = Elem(0);
        }
    }
    float rate = 0.f, bias = 0.f;
    if (tid == 0 && p.fused_gating) {
        rate = -expf(load_float((const void*)p.a_log, head, p.a_log_dtype));
        bias = load_float((const void*)p.dt_bias, head, p.dt_bias_dtype);
    }

    for (int t = 0; t < T; ++t) {
        const i64 token = (i64)row_b * T + t;
        const TokenInputs<VEC> in = next;
#pragma unroll
        for (int i = 0; i < MAX_K / THREADS; ++i) {
            const int r = tid + THREADS * i;
            if (r < K) {
                q_s[r] = in.q[i];
                k_s[r] = in.k[i];
            }
        }
        if (tid == 0) {
            float g = in.gate_a, beta = in.gate_b;
            if (p.fused_gating) {
                const float x = in.gate_a + bias;
                g = rate * (x > 20.f ? x : log1pf(expf(x)));
                beta = 1.f / (1.f + expf(-in.gate_b));
            }
            gate_s[0] = expf(g);
            gate_s[1] = beta;
        }
        __syncthreads();  // q_s, k_s, gate_s published
        if (t + 1 < T) load_token<VEC>(p, K, V, token + 1, head, key_head, col0, next);

        // Every warp forms |q|^2, |k|^2 and k.q itself: no block-wide reduction needed.
        float qq = 0.f, kk = 0.f, kq = 0.f;
        for (int r = lane; r < K; r += 32) {
            const float qv = q_s[r], kv = k_s[r];
            qq = fmaf(qv, qv, qq);
            kk = fmaf(kv, kv, kk);
            kq = fmaf(kv, qv, kq);
        }
        float q_scale = 1.f, k_scale = 1.f;
        if (p.l2norm) {
            q_scale = rsqrtf(warp_sum(qq) + 1e-6f);
            k_scale = rsqrtf(warp_sum(kk) + 1e-6f);
        }
        kq = warp_sum(kq) * q_scale * k_scale;
        const float decay = gate_s[0], beta = gate_s[1];

        if (t == 0) copy_async_wait_all();  // this thread's slab elements have landed
        float sum_k[VEC], sum_q[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) sum_k[j] = sum_q[j] = 0.f;
#pragma unroll
        for (int i = 0; i < ROWS; ++i) {
            const int r = row_group + ROW_GROUPS * i;
            float s[VEC];
            if (t == 0) widen<BF16_POOL, VEC>(landing + r * TILE + own, s);
            else widen<false, VEC>(work + r * TILE + own, s);
            const float kr = r < K ? k_s[r] : 0.f;
            const float qr = r < K ? q_s[r] : 0.f;
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
                sum_k[j] = fmaf(s[j], kr, sum_k[j]);
                sum_q[j] = fmaf(s[j], qr, sum_q[j]);
            }
        }
        // Lanes COL_GROUPS apart share a column group: fold the warp's row groups, then the
        // warps.
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
#pragma unroll
            for (int offset = COL_GROUPS; offset < 32; offset <<= 1) {
                sum_k[j] += __shfl_xor_sync(0xffffffffu, sum_k[j], offset);
                sum_q[j] += __shfl_xor_sync(0xffffffffu, sum_q[j], offset);
            }
        }
        if (lane < COL_GROUPS) {
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
                partial[warp][0][lane * VEC + j] = sum_k[j];
                partial[warp][1][lane * VEC + j] = sum_q[j];
            }
        }
        __syncthreads();  // partial sums published
        float new_v[VEC], out[VEC];
        const float k_decay = decay * k_scale, q_decay = decay * q_scale;
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
            float sk = 0.f, sq = 0.f;
#pragma unroll
            for (int w = 0; w < WARPS; ++w) {
                sk += partial[w][0][col_group * VEC + j];
                sq += partial[w][1][col_group * VEC + j];
            }
            new_v[j] = beta * (in.v[j] - k_decay * sk);
            out[j] = p.scale * (q_decay * sq + kq * new_v[j]);
        }
        if (row_group == 0 && col_in) {
            const i64 v_row = (token * H + head) * V;
#pragma unroll
            for (int j = 0; j < VEC; ++j)
                if (col0 + j < V) store_float((void*)p.o, v_row + col0 + j, p.out_dtype, out[j]);
        }
        // Second sweep: S <- exp(g) S + k v'^T, to the pool after the last token.
        const bool last = t + 1 == T;
        const i64 inter_base = (token * H + head) * K * V;
#pragma unroll
        for (int i = 0; i < ROWS; ++i) {
            const int r = row_group + ROW_GROUPS * i;
            if (r >= K || !col_in) continue;
            float s[VEC];
            if (t == 0) widen<BF16_POOL, VEC>(landing + r * TILE + own, s);
            else widen<false, VEC>(work + r * TILE + own, s);
            const float kr = k_s[r] * k_scale;
#pragma unroll
            for (int j = 0; j < VEC; ++j) s[j] = fmaf(kr, new_v[j], decay * s[j]);
            if (inter) narrow<false, VEC>(inter + inter_base + (i64)r * V + col0, s);
            if (last) {
                narrow<BF16_POOL, VEC>((Elem*)p.pool + slab + (i64)r * V + col0, s);
            } else {
                narrow<false, VEC>(work + r * TILE + own, s);
            }
        }
        if (!last) __syncthreads();  // q_s, k_s, partial and gate_s are rewritten next
    }
}

// One entry point per (rows per thread, columns per thread, pool dtype); the host picks ROWS =
// ceil(K / 16) rounded up to 4, 8 or 16, and VEC = 4 when V % 4 == 0. The K = V = 128 entry
// points (Qwen3-Next and most hybrid models; T = 1 runs gdn_decode_t1.cu's kernels) have their
// row offsets compiled in, and the bf16 one takes 8 columns per thread, so each copy is 16
// bytes and a block moves 16 KB, as in f32.
#define DECODE_ENTRY(ROWS, VEC, BF16, FIXED, NAME)                                          \
    extern "C" __global__ void __launch_bounds__(THREADS) NAME(const DecodeParams p) {     \
        gdn_decode_body<ROWS, VEC, BF16, FIXED>(p);                                         \
    }

DECODE_ENTRY(4, 4, false, 0, gdn_decode_r4_v4_f32)
DECODE_ENTRY(8, 4, false, 0, gdn_decode_r8_v4_f32)
DECODE_ENTRY(8, 4, false, 128, gdn_decode_k128_v128_f32)
DECODE_ENTRY(16, 4, false, 0, gdn_decode_r16_v4_f32)
DECODE_ENTRY(4, 1, false, 0, gdn_decode_r4_v1_f32)
DECODE_ENTRY(8, 1, false, 0, gdn_decode_r8_v1_f32)
DECODE_ENTRY(16, 1, false, 0, gdn_decode_r16_v1_f32)
DECODE_ENTRY(4, 4, true, 0, gdn_decode_r4_v4_bf16)
DECODE_ENTRY(8, 4, true, 0, gdn_decode_r8_v4_bf16)
DECODE_ENTRY(8, 8, true, 128, gdn_decode_k128_v128_bf16)
DECODE_ENTRY(16, 4, true, 0, gdn_decode_r16_v4_bf16)
DECODE_ENTRY(4, 1, true, 0, gdn_decode_r4_v1_bf16)
DECODE_ENTRY(8, 1, true, 0, gdn_decode_r8_v1_bf16)
DECODE_ENTRY(16, 1, true, 0, gdn_decode_r16_v1_bf16)

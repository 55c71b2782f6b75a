// Decode kernel lab: times every T = 1, K = V = 128 GDN decode kernel of deltakv (the .cu files
// are included as they are) beside copy ceilings, on one GPU in one process, and checks each
// kernel's o and pool against the general kernel (which the Rust suite tests against the f64
// oracle). It answers which kernel to pick at which batch size, and how far each is from
// moving the pool's bytes with no arithmetic. Experimental variants are added here first.
//
// Shape: Qwen3-Next (Hg 16, H 32, K = V = 128), T = 1, bf16 q/k/v/a/b, f32 A_log/dt_bias,
// fused gating, l2 norm, f32 or bf16 pool of B slots in a shuffled order, updated in place.
//
// Build: nvcc -O3 -std=c++17 -arch=sm_90a -o decode_lab tools/decode-lab/decode_lab.cu
// Run:   decode_lab f32|bf16 B [B ...]             time everything at each batch size
//        decode_lab --profile f32|bf16 NAME B      launch NAME ten times outside a graph (ncu)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "../../crates/cuda/kernels/common.cuh"
#include "../../crates/cuda/kernels/gdn_decode.cu"
#include "../../crates/cuda/kernels/gdn_decode_t1.cu"

#define CHECK(x)                                                                              \
    do {                                                                                      \
        cudaError_t e_ = (x);                                                                 \
        if (e_ != cudaSuccess) {                                                              \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

constexpr int LAB_H = 32, LAB_HG = 16, LAB_D = 128;
constexpr int SLAB = LAB_D * LAB_D;  // f32 elements of one head's state

// ---------------------------------------------------------------------------------------------
// Ceilings: what moving the pool's bytes costs with no arithmetic.

__global__ void ceiling_rmw(float4* x, long long n4) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4;
         i += (long long)gridDim.x * blockDim.x) {
        float4 v = x[i];
        v.x *= 0.999f; v.y *= 0.999f; v.z *= 0.999f; v.w *= 0.999f;
        x[i] = v;
    }
}

// One block per head's slab: bulk load into shared memory, scale, bulk store (the production
// rows kernel's data movement, with the slot read first when `slots` is given).
__global__ void __launch_bounds__(128, 3) ceiling_slab(float* pool, const int* slots) {
    extern __shared__ __align__(128) unsigned char raw[];
    float* slab = (float*)raw;
    __shared__ __align__(8) unsigned long long bar;
    const int item = blockIdx.x, head = item % LAB_H, row = item / LAB_H;
    const long long slot = slots ? slots[row] : row;
    float* src = pool + ((long long)slot * LAB_H + head) * SLAB;
    if (threadIdx.x == 0) {
        bulk_barrier_init(&bar);
        bulk_expect(&bar, SLAB * 4);
        bulk_load(slab, src, SLAB * 4, &bar);
    }
    __syncthreads();
    bulk_wait(&bar, 0);
    for (int i = threadIdx.x; i < SLAB; i += 128) slab[i] *= 0.999f;
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    if (threadIdx.x == 0) bulk_store(src, slab, SLAB * 4);
}

// ---------------------------------------------------------------------------------------------
// A registers kernel written for this shape alone (bf16 inputs loaded as bf16, no dtype
// switches): the latency floor the production registers kernel is compared with.

struct Gates { float decay, beta; };

__device__ __forceinline__ Gates lab_gates(const DecodeParams& p, int row, int head) {
    const float a = bf16_to_f32(((const unsigned short*)p.a)[row * LAB_H + head]);
    const float b = bf16_to_f32(((const unsigned short*)p.b)[row * LAB_H + head]);
    const float rate = -expf(((const float*)p.a_log)[head]);
    const float x = a + ((const float*)p.dt_bias)[head];
    const float g = rate * (x > 20.f ? x : log1pf(expf(x)));
    return {expf(g), 1.f / (1.f + expf(-b))};
}

__device__ __forceinline__ void lab_norms(const float* q_s, const float* k_s, float& q_scale,
                                          float& k_scale, float& kq) {
    const int lane = threadIdx.x % 32;
    float qq = 0.f, kk = 0.f, x = 0.f;
#pragma unroll
    for (int r = lane; r < LAB_D; r += 32) {
        const float qv = q_s[r], kv = k_s[r];
        qq = fmaf(qv, qv, qq);
        kk = fmaf(kv, kv, kk);
        x = fmaf(kv, qv, x);
    }
    q_scale = rsqrtf(warp_sum(qq) + 1e-6f);
    k_scale = rsqrtf(warp_sum(kk) + 1e-6f);
    kq = warp_sum(x) * q_scale * k_scale;
}


// Production features added to it one at a time (bits of F; the lab_narrow_* variants) price
// each: 1 the key head by a run-time division, 2 the generic gates (read as bits, computed
// after the state loads are issued), 4 q/k/v through `load_bits`, 8 the skipped-row branch and
// intermediate-state pointer, 16 the slot through `load_index_async`.
template <int F>
__device__ void lab_narrow_body(const DecodeParams& p) {
    constexpr int TILE = 16;
    __shared__ float q_s[LAB_D], k_s[LAB_D], partial[4][2][TILE];
    __shared__ float gate_s[2];
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int col_group = tid % 8, row_group = tid / 8;
    const int tile = blockIdx.x, head = blockIdx.y, row = blockIdx.z;
    const long long slot = (F & 16) ? load_index_async((const void*)p.slots, row, p.slot_dtype) : ((const int*)p.slots)[row];
    const int key_head = (F & 1) ? head / (p.value_heads / p.key_heads) : head / 2;
    const long long qk = ((long long)row * LAB_HG + key_head) * LAB_D + tid;
    const long long v_at = ((long long)row * LAB_H + head) * LAB_D + tile * TILE + col_group * 2;
    unsigned qb, kb, v0b, v1b;
    if (F & 4) {
        qb = load_bits((const void*)p.q, qk, p.act_dtype);
        kb = load_bits((const void*)p.k, qk, p.act_dtype);
        v0b = load_bits((const void*)p.v, v_at, p.act_dtype);
        v1b = load_bits((const void*)p.v, v_at + 1, p.act_dtype);
    } else {
        qb = ((const unsigned short*)p.q)[qk];
        kb = ((const unsigned short*)p.k)[qk];
        const unsigned vbits = *(const unsigned*)((const unsigned short*)p.v + v_at);
        v0b = vbits & 0xffffu;
        v1b = vbits >> 16;
    }
    Gates gates = {0.f, 0.f};
    GateBits gate_bits;
    if (tid == 0) {
        if (F & 2) gate_bits = load_gate_bits(p, (i64)row * LAB_H + head, head);
        else gates = lab_gates(p, row, head);
    }
    float* inter = p.intermediate ? (float*)p.intermediate + v_at * 128 : nullptr;
    if ((F & 8) && slot < 0) {
        if (row_group == 0) store_float((void*)p.o, v_at, p.out_dtype, 0.f);
        if (inter) inter[0] = 0.f;
        return;
    }
    float* pool = (float*)p.pool + (slot * LAB_H + head) * SLAB + tile * TILE + col_group * 2;
    float2 s[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) s[i] = *(const float2*)(pool + (row_group + 16 * i) * LAB_D);
    q_s[tid] = bf16_to_f32(qb);
    k_s[tid] = bf16_to_f32(kb);
    if (tid == 0) {
        if (F & 2) decode_gates(p, gate_bits, gate_s[0], gate_s[1]);
        else { gate_s[0] = gates.decay; gate_s[1] = gates.beta; }
    }
    __syncthreads();
    float q_scale, k_scale, kq;
    lab_norms(q_s, k_s, q_scale, k_scale, kq);
    const float decay = gate_s[0], beta = gate_s[1];
    float sk0 = 0.f, sk1 = 0.f, sq0 = 0.f, sq1 = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int r = row_group + 16 * i;
        const float kr = k_s[r], qr = q_s[r];
        sk0 = fmaf(s[i].x, kr, sk0); sk1 = fmaf(s[i].y, kr, sk1);
        sq0 = fmaf(s[i].x, qr, sq0); sq1 = fmaf(s[i].y, qr, sq1);
    }
#pragma unroll
    for (int offset = 8; offset < 32; offset <<= 1) {
        sk0 += __shfl_xor_sync(0xffffffffu, sk0, offset);
        sk1 += __shfl_xor_sync(0xffffffffu, sk1, offset);
        sq0 += __shfl_xor_sync(0xffffffffu, sq0, offset);
        sq1 += __shfl_xor_sync(0xffffffffu, sq1, offset);
    }
    if (lane < 8) {
        partial[warp][0][lane * 2] = sk0; partial[warp][0][lane * 2 + 1] = sk1;
        partial[warp][1][lane * 2] = sq0; partial[warp][1][lane * 2 + 1] = sq1;
    }
    __syncthreads();
    const int c = col_group * 2;
    const float tk0 = partial[0][0][c] + partial[1][0][c] + partial[2][0][c] + partial[3][0][c];
    const float tk1 = partial[0][0][c + 1] + partial[1][0][c + 1] + partial[2][0][c + 1] + partial[3][0][c + 1];
    const float tq0 = partial[0][1][c] + partial[1][1][c] + partial[2][1][c] + partial[3][1][c];
    const float tq1 = partial[0][1][c + 1] + partial[1][1][c + 1] + partial[2][1][c + 1] + partial[3][1][c + 1];
    const float v0 = bf16_to_f32(v0b), v1 = bf16_to_f32(v1b);
    const float nv0 = beta * (v0 - decay * k_scale * tk0), nv1 = beta * (v1 - decay * k_scale * tk1);
    if (row_group == 0) {
        const float o0 = p.scale * (decay * q_scale * tq0 + kq * nv0);
        const float o1 = p.scale * (decay * q_scale * tq1 + kq * nv1);
        *(unsigned*)((unsigned short*)p.o + v_at) =
            (unsigned)f32_to_bf16(o0) | ((unsigned)f32_to_bf16(o1) << 16);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int r = row_group + 16 * i;
        const float kr = k_s[r] * k_scale;
        *(float2*)(pool + r * LAB_D) = make_float2(fmaf(kr, nv0, decay * s[i].x), fmaf(kr, nv1, decay * s[i].y));
    }
}

__global__ void __launch_bounds__(128, 8) lab_narrow_regs(const DecodeParams p) { lab_narrow_body<0>(p); }
__global__ void __launch_bounds__(128, 8) lab_narrow_div(const DecodeParams p) { lab_narrow_body<1>(p); }
__global__ void __launch_bounds__(128, 8) lab_narrow_gates(const DecodeParams p) { lab_narrow_body<2>(p); }
__global__ void __launch_bounds__(128, 8) lab_narrow_bits(const DecodeParams p) { lab_narrow_body<4>(p); }
__global__ void __launch_bounds__(128, 8) lab_narrow_skip(const DecodeParams p) { lab_narrow_body<8>(p); }
__global__ void __launch_bounds__(128, 8) lab_narrow_index(const DecodeParams p) { lab_narrow_body<16>(p); }
__global__ void __launch_bounds__(128, 8) lab_narrow_all(const DecodeParams p) { lab_narrow_body<31>(p); }


// ---------------------------------------------------------------------------------------------
// Host side.

__global__ void fill_f32(float* x, long long n, unsigned seed, float scale, float offset) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed * 2246822519u;
        h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
        unsigned h2 = h * 747796405u + 2891336453u;
        h2 ^= h2 >> 16;
        // Sum of two uniforms, centred: a cheap bell-shaped value in (-1, 1).
        const float u = (h & 0xffffff) / 16777216.f + (h2 & 0xffffff) / 16777216.f - 1.f;
        x[i] = offset + scale * u;
    }
}

__global__ void to_bf16(const float* x, unsigned short* y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        y[i] = f32_to_bf16(x[i]);
}

struct Problem {
    int batch;
    bool bf16_pool;
    DecodeParams params{};
    void* pool = nullptr;  // [B, H, K, V], slots shuffled
    void* pool_init = nullptr;
    void* scratch = nullptr;  // destination of the copy ceiling
    unsigned short* o = nullptr;
    size_t pool_bytes;
};

static unsigned short* random_bf16(long long n, unsigned seed, float scale, float offset) {
    float* tmp;
    unsigned short* out;
    CHECK(cudaMalloc(&tmp, n * 4));
    CHECK(cudaMalloc(&out, n * 2));
    fill_f32<<<256, 256>>>(tmp, n, seed, scale, offset);
    to_bf16<<<256, 256>>>(tmp, out, n);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaFree(tmp));
    return out;
}

static Problem make_problem(int batch, bool bf16_pool) {
    Problem pr;
    pr.batch = batch;
    pr.bf16_pool = bf16_pool;
    const long long qk_elems = (long long)batch * LAB_HG * LAB_D, v_elems = (long long)batch * LAB_H * LAB_D;
    DecodeParams& p = pr.params;
    p.q = (u64)random_bf16(qk_elems, 1, 1.7f, 0.f);
    p.k = (u64)random_bf16(qk_elems, 2, 1.7f, 0.f);
    p.v = (u64)random_bf16(v_elems, 3, 1.7f, 0.f);
    p.a = (u64)random_bf16((long long)batch * LAB_H, 4, 1.7f, 0.f);
    p.b = (u64)random_bf16((long long)batch * LAB_H, 5, 1.7f, 0.f);
    float *a_log, *dt_bias;
    CHECK(cudaMalloc(&a_log, LAB_H * 4));
    CHECK(cudaMalloc(&dt_bias, LAB_H * 4));
    fill_f32<<<1, 32>>>(a_log, LAB_H, 6, 1.0f, 1.2f);
    fill_f32<<<1, 32>>>(dt_bias, LAB_H, 7, 0.5f, 0.5f);
    p.a_log = (u64)a_log;
    p.dt_bias = (u64)dt_bias;
    std::vector<int> slots(batch);
    for (int i = 0; i < batch; ++i) slots[i] = i;
    unsigned s = 12345;
    for (int i = batch - 1; i > 0; --i) {
        s = s * 1664525u + 1013904223u;
        std::swap(slots[i], slots[s % (unsigned)(i + 1)]);
    }
    int* d_slots;
    CHECK(cudaMalloc(&d_slots, batch * 4));
    CHECK(cudaMemcpy(d_slots, slots.data(), batch * 4, cudaMemcpyHostToDevice));
    p.slots = (u64)d_slots;
    const long long elems = (long long)batch * LAB_H * SLAB;
    pr.pool_bytes = elems * (bf16_pool ? 2 : 4);
    CHECK(cudaMalloc(&pr.pool, pr.pool_bytes));
    CHECK(cudaMalloc(&pr.pool_init, pr.pool_bytes));
    CHECK(cudaMalloc(&pr.scratch, pr.pool_bytes));
    if (bf16_pool) {
        fill_f32<<<1024, 256>>>((float*)pr.scratch, elems / 2, 8, 0.5f, 0.f);
        fill_f32<<<1024, 256>>>((float*)pr.pool, elems / 2, 9, 0.5f, 0.f);
        to_bf16<<<1024, 256>>>((float*)pr.scratch, (unsigned short*)pr.pool_init, elems / 2);
        to_bf16<<<1024, 256>>>((float*)pr.pool, (unsigned short*)pr.pool_init + elems / 2, elems / 2);
    } else {
        fill_f32<<<1024, 256>>>((float*)pr.pool_init, elems, 8, 0.5f, 0.f);
    }
    CHECK(cudaMalloc(&pr.o, v_elems * 2));
    p.pool = (u64)pr.pool;
    p.o = (u64)pr.o;
    p.batch = batch;
    p.tokens = 1;
    p.key_heads = LAB_HG;
    p.value_heads = LAB_H;
    p.key_dim = LAB_D;
    p.value_dim = LAB_D;
    p.act_dtype = p.out_dtype = p.a_dtype = p.b_dtype = DT_BF16;
    p.g_dtype = p.beta_dtype = DT_F32;
    p.a_log_dtype = p.dt_bias_dtype = DT_F32;
    p.slot_dtype = DT_I32;
    p.fused_gating = 1;
    p.l2norm = 1;
    p.scale = 1.f / sqrtf((float)LAB_D);
    p.key_head_magic = ((1ull << 32) + (LAB_H / LAB_HG) - 1) / (LAB_H / LAB_HG);
    CHECK(cudaDeviceSynchronize());
    return pr;
}

typedef void (*Kernel)(const DecodeParams);

// A decode kernel and its launch shape, or a ceiling (kernel == nullptr, run by `ceiling`).
struct Variant {
    std::string name;
    int pool;  // 0 f32, 1 bf16, 2 either
    Kernel kernel;
    int tiles, threads, smem;
    std::function<void(Problem&, cudaStream_t)> ceiling;
};

static int sms() {
    int n;
    CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0));
    return n;
}

static void launch(const Variant& v, Problem& pr, cudaStream_t s) {
    if (v.kernel) v.kernel<<<dim3(v.tiles, LAB_H, pr.batch), v.threads, v.smem, s>>>(pr.params);
    else v.ceiling(pr, s);
}

static std::vector<Variant> variants() {
    std::vector<Variant> v;
    v.push_back({"copy_d2d", 2, nullptr, 0, 0, 0, [](Problem& pr, cudaStream_t s) {
                     CHECK(cudaMemcpyAsync(pr.scratch, pr.pool, pr.pool_bytes, cudaMemcpyDeviceToDevice, s));
                 }});
    v.push_back({"rmw_float4", 2, nullptr, 0, 0, 0, [](Problem& pr, cudaStream_t s) {
                     ceiling_rmw<<<sms() * 8, 256, 0, s>>>((float4*)pr.pool, pr.pool_bytes / 16);
                 }});
    v.push_back({"slab_bulk_slot", 0, nullptr, 0, 0, 0, [](Problem& pr, cudaStream_t s) {
                     ceiling_slab<<<pr.batch * LAB_H, 128, 65536, s>>>((float*)pr.pool, (const int*)pr.params.slots);
                 }});
    // The reference of each pool dtype (the general kernel, tested against the f64 oracle by
    // the Rust suite) comes first among the decode kernels.
    v.push_back({"general_f32", 0, gdn_decode_k128_v128_f32, 4, 128, 16384, nullptr});
    v.push_back({"general_bf16", 1, gdn_decode_k128_v128_bf16, 2, 128, 16384, nullptr});
    v.push_back({"bands_f32", 0, gdn_decode_k128_v128_t1_bands_f32, 1, 256, 65536, nullptr});
    v.push_back({"bands_bf16", 1, gdn_decode_k128_v128_t1_bands_bf16, 1, 256, 32768, nullptr});
    v.push_back({"registers_f32", 0, gdn_decode_k128_v128_t1_registers_f32, 8, 128, 0, nullptr});
    v.push_back({"registers_bf16", 1, gdn_decode_k128_v128_t1_registers_bf16, 8, 128, 0, nullptr});
    v.push_back({"lab_narrow_regs", 0, lab_narrow_regs, 8, 128, 0, nullptr});
    v.push_back({"lab_narrow_div", 0, lab_narrow_div, 8, 128, 0, nullptr});
    v.push_back({"lab_narrow_gates", 0, lab_narrow_gates, 8, 128, 0, nullptr});
    v.push_back({"lab_narrow_bits", 0, lab_narrow_bits, 8, 128, 0, nullptr});
    v.push_back({"lab_narrow_skip", 0, lab_narrow_skip, 8, 128, 0, nullptr});
    v.push_back({"lab_narrow_index", 0, lab_narrow_index, 8, 128, 0, nullptr});
    v.push_back({"lab_narrow_all", 0, lab_narrow_all, 8, 128, 0, nullptr});
    CHECK(cudaFuncSetAttribute(ceiling_slab, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536));
    for (auto& x : v)
        if (x.kernel) CHECK(cudaFuncSetAttribute(x.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536));
    return v;
}

static float bf16_host(unsigned short x) {
    unsigned u = (unsigned)x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// Runs one launch from the initial pool; returns (o, pool) on the host, widened to f32.
static void run_once(Problem& pr, const Variant& v, std::vector<float>& o, std::vector<float>& pool) {
    CHECK(cudaMemcpy(pr.pool, pr.pool_init, pr.pool_bytes, cudaMemcpyDeviceToDevice));
    const size_t on = (size_t)pr.batch * LAB_H * LAB_D;
    CHECK(cudaMemset(pr.o, 0xff, on * 2));  // poison: NaN in bf16
    launch(v, pr, 0);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    std::vector<unsigned short> ob(on);
    CHECK(cudaMemcpy(ob.data(), pr.o, on * 2, cudaMemcpyDeviceToHost));
    o.resize(on);
    for (size_t i = 0; i < on; ++i) o[i] = bf16_host(ob[i]);
    if (pr.bf16_pool) {
        std::vector<unsigned short> pb(pr.pool_bytes / 2);
        CHECK(cudaMemcpy(pb.data(), pr.pool, pr.pool_bytes, cudaMemcpyDeviceToHost));
        pool.resize(pb.size());
        for (size_t i = 0; i < pb.size(); ++i) pool[i] = bf16_host(pb[i]);
    } else {
        pool.resize(pr.pool_bytes / 4);
        CHECK(cudaMemcpy(pool.data(), pr.pool, pr.pool_bytes, cudaMemcpyDeviceToHost));
    }
}

static double rel_rms(const std::vector<float>& x, const std::vector<float>& ref) {
    double num = 0, den = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        if (!std::isfinite(x[i])) return INFINITY;
        const double d = (double)x[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return std::sqrt(num / std::max(den, 1e-30));
}

static double median_graph_us(Problem& pr, const Variant& v, int per_graph, int samples) {
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t graph;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < per_graph; ++i) launch(v, pr, s);
    CHECK(cudaStreamEndCapture(s, &graph));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 2; ++i) CHECK(cudaGraphLaunch(exec, s));
    std::vector<double> times;
    for (int i = 0; i < samples; ++i) {
        CHECK(cudaEventRecord(a, s));
        CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaEventRecord(b, s));
        CHECK(cudaEventSynchronize(b));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, a, b));
        times.push_back(ms * 1e3 / per_graph);
    }
    std::sort(times.begin(), times.end());
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaStreamDestroy(s));
    return times[times.size() / 2];
}

static void free_problem(Problem& pr) {
    const DecodeParams& p = pr.params;
    for (u64 x : {p.q, p.k, p.v, p.a, p.b, p.a_log, p.dt_bias, p.slots}) CHECK(cudaFree((void*)x));
    for (void* x : {pr.pool, pr.pool_init, pr.scratch, (void*)pr.o}) CHECK(cudaFree(x));
}

int main(int argc, char** argv) {
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    const auto all = variants();
    if (argc == 5 && std::string(argv[1]) == "--profile") {
        Problem pr = make_problem(atoi(argv[4]), std::string(argv[2]) == "bf16");
        CHECK(cudaMemcpy(pr.pool, pr.pool_init, pr.pool_bytes, cudaMemcpyDeviceToDevice));
        for (auto& v : all)
            if (v.name == argv[3])
                for (int i = 0; i < 10; ++i) launch(v, pr, 0);
        CHECK(cudaDeviceSynchronize());
        return 0;
    }
    if (argc < 3 || (std::string(argv[1]) != "f32" && std::string(argv[1]) != "bf16")) {
        fprintf(stderr, "usage: decode_lab f32|bf16 B [B ...] | --profile f32|bf16 NAME B\n");
        return 2;
    }
    const bool bf16_pool = std::string(argv[1]) == "bf16";
    printf("GPU: %s, %d SMs; %s pool\n", prop.name, prop.multiProcessorCount, argv[1]);
    printf("%-16s %5s %10s %8s %10s %10s\n", "kernel", "B", "us", "TB/s", "o_rel", "pool_rel");
    for (int i = 2; i < argc; ++i) {
        const int batch = atoi(argv[i]);
        Problem pr = make_problem(batch, bf16_pool);
        std::vector<float> ref_o, ref_pool;
        bool have_ref = false;
        for (auto& v : all) {
            if (v.pool != 2 && v.pool != (int)bf16_pool) continue;
            double o_err = NAN, pool_err = NAN;
            if (v.kernel) {  // a decode, checked
                std::vector<float> o, pool;
                run_once(pr, v, o, pool);
                if (!have_ref) {
                    ref_o = o;
                    ref_pool = pool;
                    have_ref = true;
                }
                o_err = rel_rms(o, ref_o);
                pool_err = rel_rms(pool, ref_pool);
            }
            CHECK(cudaMemcpy(pr.pool, pr.pool_init, pr.pool_bytes, cudaMemcpyDeviceToDevice));
            const int per_graph = batch >= 64 ? 20 : 100;
            const double us = median_graph_us(pr, v, per_graph, 30);
            printf("%-16s %5d %10.2f %8.3f %10.2e %10.2e\n", v.name.c_str(), batch, us,
                   2.0 * pr.pool_bytes / (us * 1e-6) / 1e12, o_err, pool_err);
            fflush(stdout);
        }
        free_problem(pr);
    }
    return 0;
}

// Compressed-KV lab: times deltakv's attention over the paged compressed cache (the library's
// tensor-core kernels, included as they are, beside candidate kernels from attend_v3.cuh) and
// its encode (the library's Hadamard kernel beside encode_v3.cuh) on one GPU in one process,
// with a
// device copy and a device read measured in the same run. Every attention output is checked
// against a plain f64 reference kernel here (rel_rms; FAIL past 1e-5), every encode's pool word
// for word against the library kernel (which the Rust suite checks against the CPU codec).
//
// Shapes (issue 12): Hq 32, Hkv 8, d 128, 4-bit keys, 2-bit values, f32 norms, pages of 64
// tokens in a shuffled order, bf16 queries; B 8 x 32768 and B 1 x 131072. d = 256 and d = 64
// checks (B 2, 1000 and 76 tokens, Hq 8, Hkv 2). Encode: 8 x 8192 new bf16 tokens (Hkv 8, d 128).
//
// Build: nvcc -O3 -std=c++17 -arch=sm_90a -o kv_lab tools/kv-lab/kv_lab.cu
// Run:   kv_lab [attend|encode|all]      (all by default)
//        kv_lab small                     every attention kernel once on small shapes, checked
//                                         (no timing: for compute-sanitizer)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "../../crates/cuda/kernels/common.cuh"
#define KVM_BK 4
#define KVM_BV 2
#include "../../crates/cuda/kernels/kv_attend.cu"
#include "../../crates/cuda/kernels/kv_attend_mma.cu"
#include "../../crates/cuda/kernels/kv_attend_block.cu"
#include "../../crates/cuda/kernels/kv_attend_pages.cu"
#include "../../crates/cuda/kernels/kv_encode.cu"
#include "attend_v3.cuh"
#include "encode_v3.cuh"

#define CHECK(x)                                                                              \
    do {                                                                                      \
        cudaError_t e_ = (x);                                                                 \
        if (e_ != cudaSuccess) {                                                              \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

static int g_sms = 132;

// Gaussian Lloyd-Max levels (unit variance), scaled by 1/sqrt(d) below.
static const double LM4[16] = {-2.7326, -2.0690, -1.6180, -1.2562, -0.9424, -0.6568, -0.3881, -0.1284,
                               0.1284,  0.3881,  0.6568,  0.9424,  1.2562,  1.6180,  2.0690,  2.7326};
static const double LM2[4] = {-1.5104, -0.4528, 0.4528, 1.5104};

static float level_scale(const float* levels, int n) {
    float largest = 0.0f;
    for (int i = 0; i < n; ++i) largest = std::max(largest, std::fabs(levels[i]));
    if (!(largest > 0.0f)) return 1.0f;
    return std::ldexp(1.0f, -std::ilogb(largest));
}

// ---------------------------------------------------------------------------------------------
// Random device data.

__device__ __forceinline__ unsigned lab_hash(unsigned long long x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return (unsigned)x;
}
__device__ __forceinline__ float lab_uniform(unsigned long long x) {
    return (lab_hash(x) >> 8) * (1.0f / 16777216.0f);
}
// Roughly normal: the sum of four uniforms, centred and scaled.
__device__ __forceinline__ float lab_normal(unsigned long long x) {
    float s = 0.0f;
    for (int k = 0; k < 4; ++k) s += lab_uniform(4 * x + k);
    return (s - 2.0f) * 1.7320508f;
}

__global__ void fill_random_words(unsigned* x, long long n, unsigned long long seed) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        x[i] = lab_hash(seed * 0x9e3779b97f4a7c15ull + i);
}

// Norms of every (page, head, slot): keys in [0.5, 3), values in [0.25, 2).
__global__ void fill_norms(unsigned* pool, long long pages, int kv_heads, int page_tokens,
                           int page_words, int head_words, int norms_offset, int norm_words) {
    const long long n = pages * kv_heads * page_tokens;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const int slot = (int)(i % page_tokens);
        const long long ph = i / page_tokens;
        const int h = (int)(ph % kv_heads);
        const long long page = ph / kv_heads;
        unsigned* sec = pool + page * page_words + (long long)h * head_words + norms_offset;
        sec[slot] = __float_as_uint(0.5f + 2.5f * lab_uniform(3 * i + 1));
        sec[norm_words + slot] = __float_as_uint(0.25f + 1.75f * lab_uniform(3 * i + 2));
    }
}

__global__ void fill_bf16_normal(unsigned short* x, long long n, unsigned long long seed) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        x[i] = f32_to_bf16(lab_normal(seed * 0x9e3779b97f4a7c15ull + i));
}

// ---------------------------------------------------------------------------------------------
// Ceilings.

__global__ void ceiling_read(const uint4* x, long long n4, unsigned* sink) {
    unsigned a = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4;
         i += (long long)gridDim.x * blockDim.x) {
        const uint4 v = x[i];
        a ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (a == 0x12345678u) sink[0] = a;
}

// ---------------------------------------------------------------------------------------------
// The reference: f64 throughout, one simple kernel per step.

struct Cache {
    int batch, len, hq, hkv, d, dp, page_tokens, bits_k, bits_v;
    int row_words_k, row_words_v, norm_words, head_words, page_words, max_pages;
    long long pages;
    unsigned* pool;
    int* table;
    int* lens;
    float* consts;  // levels K at 0, boundaries K at 256, levels V at 512, boundaries V at 768, signs at 1024
    unsigned short* q;  // [B, 1, Hq, d] bf16
    std::vector<float> levels_k, levels_v;
};

struct RefView {
    const unsigned* pool;
    const int* table;
    const int* lens;
    const float* consts;
    int len, hq, hkv, d, page_tokens, bits_k, bits_v, row_words_k, row_words_v, norm_words,
        head_words, page_words, max_pages;
};

__device__ __forceinline__ const unsigned* ref_section(const RefView& v, int b, int h, int t) {
    const long long page = v.table[(long long)b * v.max_pages + t / v.page_tokens];
    return v.pool + page * v.page_words + (long long)h * v.head_words;
}
__device__ __forceinline__ unsigned ref_code(const unsigned* row, int c, int bits) {
    const int bit = c * bits;
    return (row[bit >> 5] >> (bit & 31)) & ((1u << bits) - 1u);
}

// q' = norm H diag(s) (scale q), per (b, head): one thread per output dimension.
__global__ void ref_rotate(RefView v, const unsigned short* q, float scale, double* qp) {
    const int bh = blockIdx.x, i = threadIdx.x;
    if (i >= v.d) return;
    double y = 0.0;
    for (int c = 0; c < v.d; ++c) {
        const double x = (double)bf16_to_f32(q[(long long)bh * v.d + c]) * scale * v.consts[1024 + c];
        y += (__popc(i & c) & 1) ? -x : x;
    }
    qp[(long long)bh * v.d + i] = y / sqrt((double)v.d);
}

__global__ void ref_scores(RefView v, const double* qp, double* s) {
    const int bh = blockIdx.y, b = bh / v.hq, head = bh % v.hq, h = head / (v.hq / v.hkv);
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= v.len) return;
    if (t >= v.lens[b]) {
        s[(long long)bh * v.len + t] = -INFINITY;
        return;
    }
    const unsigned* sec = ref_section(v, b, h, t);
    const int slot = t % v.page_tokens;
    const unsigned* row = sec + slot * v.row_words_k;
    double dot = 0.0;
    for (int c = 0; c < v.d; ++c) dot += qp[(long long)bh * v.d + c] * v.consts[ref_code(row, c, v.bits_k)];
    const float kn = __uint_as_float(sec[v.page_tokens * (v.row_words_k + v.row_words_v) + slot]);
    s[(long long)bh * v.len + t] = dot * kn;
}

// p_t = exp(s_t - max) in place, l = sum p.
__global__ void ref_softmax(RefView v, double* s, double* l) {
    __shared__ double red[256];
    const int bh = blockIdx.x;
    double* row = s + (long long)bh * v.len;
    double m = -INFINITY;
    for (int t = threadIdx.x; t < v.len; t += blockDim.x) m = fmax(m, row[t]);
    red[threadIdx.x] = m;
    __syncthreads();
    for (int o = 128; o > 0; o >>= 1) {
        if (threadIdx.x < o) red[threadIdx.x] = fmax(red[threadIdx.x], red[threadIdx.x + o]);
        __syncthreads();
    }
    m = red[0];
    __syncthreads();
    double sum = 0.0;
    for (int t = threadIdx.x; t < v.len; t += blockDim.x) {
        const double e = exp(row[t] - m);
        row[t] = e;
        sum += e;
    }
    red[threadIdx.x] = sum;
    __syncthreads();
    for (int o = 128; o > 0; o >>= 1) {
        if (threadIdx.x < o) red[threadIdx.x] += red[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) l[bh] = red[0];
}

// acc[bh][c] += sum over a chunk of tokens of p_t norm_v[t] level(code_v(t, c)).
__global__ void ref_values(RefView v, const double* p, double* acc, int chunk) {
    const int bh = blockIdx.y, b = bh / v.hq, head = bh % v.hq, h = head / (v.hq / v.hkv);
    const int c = threadIdx.x;
    if (c >= v.d) return;
    const int t0 = blockIdx.x * chunk, t1 = min(t0 + chunk, v.lens[b]);
    double a = 0.0;
    for (int t = t0; t < t1; ++t) {
        const unsigned* sec = ref_section(v, b, h, t);
        const int slot = t % v.page_tokens;
        const unsigned* row = sec + v.page_tokens * v.row_words_k + slot * v.row_words_v;
        const float vn =
            __uint_as_float(sec[v.page_tokens * (v.row_words_k + v.row_words_v) + v.norm_words + slot]);
        a += p[(long long)bh * v.len + t] * vn * v.consts[512 + ref_code(row, c, v.bits_v)];
    }
    atomicAdd(&acc[(long long)bh * v.d + c], a);
}

// o = norm diag(s) H (acc / l).
__global__ void ref_output(RefView v, const double* acc, const double* l, float* o) {
    const int bh = blockIdx.x, c = threadIdx.x;
    if (c >= v.d) return;
    double y = 0.0;
    for (int i = 0; i < v.d; ++i) {
        const double x = acc[(long long)bh * v.d + i] / l[bh];
        y += (__popc(i & c) & 1) ? -x : x;
    }
    o[(long long)bh * v.d + c] = (float)(y / sqrt((double)v.d) * v.consts[1024 + c]);
}

static RefView ref_view(const Cache& c) {
    return RefView{c.pool, c.table, c.lens, c.consts, c.len, c.hq, c.hkv, c.d, c.page_tokens, c.bits_k,
                   c.bits_v, c.row_words_k, c.row_words_v, c.norm_words, c.head_words,
                   c.page_words, c.max_pages};
}

static std::vector<float> reference(const Cache& c, float scale) {
    const RefView v = ref_view(c);
    const int bh = c.batch * c.hq;
    double *qp, *s, *l, *acc;
    float* o;
    CHECK(cudaMalloc(&qp, sizeof(double) * bh * c.d));
    CHECK(cudaMalloc(&s, sizeof(double) * (size_t)bh * c.len));
    CHECK(cudaMalloc(&l, sizeof(double) * bh));
    CHECK(cudaMalloc(&acc, sizeof(double) * bh * c.d));
    CHECK(cudaMalloc(&o, sizeof(float) * bh * c.d));
    CHECK(cudaMemset(acc, 0, sizeof(double) * bh * c.d));
    ref_rotate<<<bh, 256>>>(v, c.q, scale, qp);
    ref_scores<<<dim3((c.len + 127) / 128, bh), 128>>>(v, qp, s);
    ref_softmax<<<bh, 256>>>(v, s, l);
    const int chunk = 512;
    ref_values<<<dim3((c.len + chunk - 1) / chunk, bh), 256>>>(v, s, acc, chunk);
    ref_output<<<bh, 256>>>(v, acc, l, o);
    CHECK(cudaGetLastError());
    std::vector<float> out((size_t)bh * c.d);
    CHECK(cudaMemcpy(out.data(), o, sizeof(float) * out.size(), cudaMemcpyDeviceToHost));
    for (void* x : {(void*)qp, (void*)s, (void*)l, (void*)acc, (void*)o}) CHECK(cudaFree(x));
    return out;
}

// ---------------------------------------------------------------------------------------------
// The cache: every sequence `len` tokens in pages of a shuffled pool.

// The library's nearest-level grid of n sorted boundaries (crates/cuda/src/kv/mod.rs,
// nearest_grid), written to out (KV_GRID_FLOATS floats).
#define LAB_GRID 1280
static void lab_grid(const float* levels, const float* b, int n, float* out) {
    std::fill(out, out + KV_GRID_FLOATS, 0.0f);
    const float b0 = b[0];
    const float span = b[n - 1] - b0;
    for (int cells = KV_GRID_CELLS - 1; cells >= 1; --cells) {
        const float scale =
            span > 0.0f ? (float)((double)cells / ((KV_GRID_CELLS - 1) * (double)span)) : 0.0f;
        const float offset = -b0 * scale;
        std::vector<int> g(n);
        for (int i = 0; i < n; ++i) {
            float t = std::fma(b[i], scale, offset);
            t = std::isnan(t) ? 0.0f : std::min(std::max(t, 0.0f), 1.0f);
            g[i] = (int)std::floor((KV_GRID_CELLS - 1) * (double)t);
        }
        bool ok = true;
        for (int i = 1; i < n; ++i) ok &= g[i - 1] < g[i];
        if (!ok) continue;
        out[0] = scale;
        out[1] = offset;
        out[2] = 1.0f;
        for (int c = 0; c < KV_GRID_CELLS; ++c) {
            int below = 0;
            float own = INFINITY;
            for (int i = 0; i < n; ++i) {
                below += g[i] < c;
                if (g[i] == c) own = b[i];
            }
            const float c0 = levels[below], c1 = below + 1 < 256 ? levels[below + 1] : 0.0f;
            unsigned bits = (unsigned)below;
            std::memcpy(&out[4 + 4 * c], &bits, 4);
            out[5 + 4 * c] = own;
            out[6 + 4 * c] = c0 * c0;
            out[7 + 4 * c] = c1 * c1;
        }
        return;
    }
}

static Cache make_cache(int batch, int len, int hq, int hkv, int d, unsigned seed) {
    Cache c{};
    c.batch = batch;
    c.len = len;
    c.hq = hq;
    c.hkv = hkv;
    c.d = d;
    c.dp = std::max(64, 1 << (int)std::ceil(std::log2((double)d)));
    c.page_tokens = 64;
    c.bits_k = 4;
    c.bits_v = 2;
    auto round4 = [](int x) { return (x + 3) / 4 * 4; };
    c.row_words_k = round4((d * c.bits_k + 31) / 32);
    c.row_words_v = round4((d * c.bits_v + 31) / 32);
    c.norm_words = round4(c.page_tokens);
    c.head_words = c.page_tokens * (c.row_words_k + c.row_words_v) + 2 * c.norm_words;
    c.page_words = hkv * c.head_words;
    c.max_pages = (len + c.page_tokens - 1) / c.page_tokens;
    c.pages = (long long)batch * c.max_pages;
    CHECK(cudaMalloc(&c.pool, 4 * (size_t)c.pages * c.page_words));
    fill_random_words<<<1024, 256>>>(c.pool, c.pages * c.page_words, seed);
    fill_norms<<<1024, 256>>>(c.pool, c.pages, hkv, c.page_tokens, c.page_words, c.head_words,
                              c.page_tokens * (c.row_words_k + c.row_words_v), c.norm_words);
    std::vector<int> table(c.pages);
    std::iota(table.begin(), table.end(), 0);
    std::mt19937 rng(seed);
    std::shuffle(table.begin(), table.end(), rng);
    CHECK(cudaMalloc(&c.table, 4 * table.size()));
    CHECK(cudaMemcpy(c.table, table.data(), 4 * table.size(), cudaMemcpyHostToDevice));
    std::vector<int> lens(batch, len);
    if (batch > 1 && len < 4096) lens[1] = std::max(1, len / 13);  // the d = 256 check: two lengths
    c.len = len;
    CHECK(cudaMalloc(&c.lens, 4 * batch));
    CHECK(cudaMemcpy(c.lens, lens.data(), 4 * batch, cudaMemcpyHostToDevice));
    // Levels, boundaries, signs, then the encode's key and value grids at LAB_GRID (zero:
    // disabled, the binary search) as crates/cuda/src/kv/mod.rs builds them.
    std::vector<float> consts(LAB_GRID + 2 * KV_GRID_FLOATS + KV_GRID_FLOATS, 0.0f);
    const double inv = 1.0 / std::sqrt((double)d);
    for (int i = 0; i < 256; ++i) consts[256 + i] = consts[768 + i] = INFINITY;
    for (int i = 0; i < 16; ++i) consts[i] = (float)(LM4[i] * inv);
    for (int i = 0; i < 15; ++i) consts[256 + i] = 0.5f * (consts[i] + consts[i + 1]);
    for (int i = 0; i < 4; ++i) consts[512 + i] = (float)(LM2[i] * inv);
    for (int i = 0; i < 3; ++i) consts[768 + i] = 0.5f * (consts[512 + i] + consts[513 + i]);
    for (int i = 0; i < d; ++i) consts[1024 + i] = (rng() & 1) ? 1.0f : -1.0f;
    for (int kv = 0; kv < 2; ++kv) {
        const int n = kv == 0 ? 15 : 3;
        lab_grid(&consts[512 * kv], &consts[256 + 512 * kv], n,
                 &consts[LAB_GRID + kv * KV_GRID_FLOATS]);
    }
    c.levels_k.assign(consts.begin(), consts.begin() + 16);
    c.levels_v.assign(consts.begin() + 512, consts.begin() + 516);
    CHECK(cudaMalloc(&c.consts, 4 * consts.size()));
    CHECK(cudaMemcpy(c.consts, consts.data(), 4 * consts.size(), cudaMemcpyHostToDevice));
    CHECK(cudaMalloc(&c.q, 2 * (size_t)batch * hq * d));
    fill_bf16_normal<<<256, 256>>>(c.q, (long long)batch * hq * d, seed + 7);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    return c;
}

static void free_cache(Cache& c) {
    for (void* x : {(void*)c.pool, (void*)c.table, (void*)c.lens, (void*)c.consts, (void*)c.q})
        CHECK(cudaFree(x));
}

// Bytes an attention call must read: every token's codes and norms of every KV head.
static double attend_bytes(const Cache& c) {
    const double per_token = 4.0 * ((c.d * c.bits_k + 31) / 32 + (c.d * c.bits_v + 31) / 32) + 8.0;
    return (double)c.batch * c.len * c.hkv * per_token;
}

// ---------------------------------------------------------------------------------------------
// Attention variants: pass 1 (library or lab) + the library's merge.

struct AttnRun {
    std::string name;
    KvAttnParams params;
    const void* pass1;
    dim3 grid;
    size_t smem;
    float* part_ml = nullptr;
    float* part_acc = nullptr;
    float* o = nullptr;
    bool check = true;  // false: a ceiling, not attention
};

static KvAttnParams base_params(const Cache& c, float scale) {
    KvAttnParams p{};
    p.q = c.q;
    p.pool = c.pool;
    p.block_table = c.table;
    p.seq_lens = c.lens;
    p.consts = c.consts;
    p.batch = c.batch;
    p.tq = 1;
    p.hq = c.hq;
    p.kv_heads = c.hkv;
    p.dim = c.d;
    p.dim_pad = c.dp;
    p.group = c.hq / c.hkv;
    p.rows = p.group;
    p.row_chunks = (p.rows + 3) / 4;
    p.q_dtype = DT_BF16;
    p.bits_k = c.bits_k;
    p.bits_v = c.bits_v;
    p.norm_f16 = 0;
    p.hadamard = 1;
    p.page_tokens = c.page_tokens;
    p.max_pages = c.max_pages;
    p.page_words = c.page_words;
    p.head_words = c.head_words;
    p.row_words_k = c.row_words_k;
    p.row_words_v = c.row_words_v;
    p.norm_words = c.norm_words;
    p.tile = 16;
    p.stages = 0;
    p.stage_words = 0;
    p.lanes_per_token = c.dp / 16;
    p.scale = scale;
    p.hadamard_norm = 1.0f / std::sqrt((float)c.d);
    p.level_scale_k = level_scale(c.levels_k.data(), 16);
    p.level_scale_v = level_scale(c.levels_v.data(), 4);
    p.ml_log2 = 1;
    return p;
}

// `split_unit` tokens per split step (16: v2's tiles; page_tokens: v3's pages); `splits` 0:
// one full wave of resident blocks (the library's rule); negative: -n times that.
static AttnRun make_run(const Cache& c, float scale, const std::string& name, const void* kernel,
                        size_t smem, int split_unit, int splits) {
    AttnRun r;
    r.name = name;
    r.pass1 = kernel;
    r.smem = smem;
    r.params = base_params(c, scale);
    if (smem > 48 * 1024)
        CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, KV_THREADS, smem));
    per_sm = std::max(per_sm, 1);
    const int blocks_per_split = c.batch * c.hkv * r.params.row_chunks;
    const int max_units = (c.len + split_unit - 1) / split_unit;
    int wave = std::max(1, per_sm * g_sms / blocks_per_split);
    int s = splits > 0 ? splits : (splits == 0 ? wave : -splits * wave);
    s = std::min(std::max(s, 1), max_units);
    r.params.splits = s;
    r.grid = dim3(s, c.hkv * r.params.row_chunks, c.batch);
    const size_t out_rows = (size_t)c.batch * c.hq;
    CHECK(cudaMalloc(&r.part_ml, 4 * out_rows * s * 2));
    CHECK(cudaMalloc(&r.part_acc, 4 * out_rows * s * c.dp));
    CHECK(cudaMalloc(&r.o, 4 * out_rows * c.d));
    r.params.part_ml = r.part_ml;
    r.params.part_acc = r.part_acc;
    r.params.o = r.o;
    r.name += " (splits " + std::to_string(s) + ", " + std::to_string(per_sm) + "/SM)";
    return r;
}

static void launch_attend(const AttnRun& r, int batch, int hq, int dp, cudaStream_t s) {
    void* args[] = {(void*)&r.params};
    CHECK(cudaLaunchKernel(r.pass1, r.grid, dim3(KV_THREADS), args, r.smem, s));
    // As the library launches pass 2: groups of dp threads, each merging a run of eight or more
    // splits (at most four groups), and one merge weight per split in dynamic shared memory.
    const int groups = std::min(std::max((r.params.splits + 7) / 8, 1), 4);
    CHECK(cudaLaunchKernel((const void*)kv_attend_merge, dim3(batch * hq), dim3(groups * dp), args,
                           4 * (size_t)r.params.splits, s));
}

static double median_graph_us(const std::function<void(cudaStream_t)>& body, int per_graph,
                              int samples) {
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t graph;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < per_graph; ++i) body(s);
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
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
    CHECK(cudaStreamDestroy(s));
    return times[times.size() / 2];
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

// Copy and read ceilings over `bytes` (TB/s; the copy counts both directions, as the kernel
// log does).
static void ceilings(double bytes, double* copy_tbs, double* read_tbs) {
    void *a, *b;
    unsigned* sink;
    CHECK(cudaMalloc(&a, (size_t)bytes));
    CHECK(cudaMalloc(&b, (size_t)bytes));
    CHECK(cudaMalloc(&sink, 4));
    CHECK(cudaMemset(a, 1, (size_t)bytes));
    const double copy_us = median_graph_us(
        [&](cudaStream_t s) { CHECK(cudaMemcpyAsync(b, a, (size_t)bytes, cudaMemcpyDeviceToDevice, s)); },
        10, 15);
    const double read_us = median_graph_us(
        [&](cudaStream_t s) {
            ceiling_read<<<g_sms * 8, 256, 0, s>>>((const uint4*)a, (long long)(bytes / 16), sink);
        },
        10, 15);
    *copy_tbs = 2.0 * bytes / (copy_us * 1e-6) / 1e12;
    *read_tbs = bytes / (read_us * 1e-6) / 1e12;
    printf("ceilings over %.1f MB: copy %.2f us (%.3f TB/s, read + write), read %.2f us (%.3f TB/s)\n",
           bytes / 1e6, copy_us, *copy_tbs, read_us, *read_tbs);
    for (void* x : {a, b, (void*)sink}) CHECK(cudaFree(x));
}

static void attend_shape(const char* label, int batch, int len, int hq, int hkv, int d,
                         bool timed) {
    Cache c = make_cache(batch, len, hq, hkv, d, 1234u + len + d);
    const float scale = 1.0f / std::sqrt((float)d);
    const std::vector<float> ref = reference(c, scale);
    const double bytes = attend_bytes(c);
    double copy_tbs = 0, read_tbs = 0;
    if (timed) ceilings(bytes, &copy_tbs, &read_tbs);
    printf("== attend %s: B %d x %d, Hq %d, Hkv %d, d %d, 4/2 bits, %.1f MB to read\n", label, batch,
           len, hq, hkv, d, bytes / 1e6);
    printf("%-52s %10s %8s %8s %10s %s\n", "variant", "us", "TB/s", "%copy", "rel_rms", "check");
    std::vector<AttnRun> runs;
    const size_t v2_smem = 128 * (size_t)c.dp;
    const size_t v3s2 = kv3_smem_bytes(2, c.head_words, c.dp), v3s3 = kv3_smem_bytes(3, c.head_words, c.dp);
    const size_t pages_smem = 4 * (size_t)KVM_WARPS * KVP_STAGES * c.head_words + 64 * (size_t)c.dp;
    if (d == 64) {
        runs.push_back(make_run(c, scale, "pages library kv_attend_pages_k4v2_d64",
                                (const void*)kv_attend_pages_k4v2_d64, pages_smem, c.page_tokens, 0));
    } else if (d == 128) {
        runs.push_back(make_run(c, scale, "v2 library kv_attend_mma_k4v2_d128",
                                (const void*)kv_attend_mma_k4v2_d128, v2_smem, 16, 0));
        if (batch == 1)
            runs.push_back(make_run(c, scale, "v2 library, 2x splits",
                                    (const void*)kv_attend_mma_k4v2_d128, v2_smem, 16, -2));
        runs.push_back(make_run(c, scale, "v3 pages s2", (const void*)kv3_k4v2_d128_s2, v3s2,
                                c.page_tokens, 0));
        runs.push_back(make_run(c, scale, "pages library kv_attend_pages_k4v2_d128",
                                (const void*)kv_attend_pages_k4v2_d128, pages_smem, c.page_tokens, 0));
        runs.push_back(make_run(c, scale, "v3 pages s3 qreg", (const void*)kv3_k4v2_d128_s3_qreg,
                                v3s3, c.page_tokens, 0));
        runs.push_back(make_run(c, scale, "pages library, 2x splits",
                                (const void*)kv_attend_pages_k4v2_d128, pages_smem, c.page_tokens, -2));
        runs.push_back(make_run(c, scale, "v3 movement only (no math; not checked)",
                                (const void*)kv3_k4v2_d128_s2_move, v3s2, c.page_tokens, 0));
        runs.back().check = false;
        runs.push_back(make_run(c, scale, "v3 level lookups only (no products; not checked)",
                                (const void*)kv3_k4v2_d128_s2_lookups, v3s2, c.page_tokens, 0));
        runs.back().check = false;
    } else {
        runs.push_back(make_run(c, scale, "v2 library kv_attend_mma_k4v2_d256 (fixed)",
                                (const void*)kv_attend_mma_k4v2_d256, v2_smem, 16, 0));
        runs.push_back(make_run(c, scale, "pages library kv_attend_pages_k4v2_d256",
                                (const void*)kv_attend_pages_k4v2_d256, pages_smem, c.page_tokens, 0));
    }
    const size_t out = (size_t)batch * hq * d;
    for (auto& r : runs) {
        CHECK(cudaMemset(r.o, 0xff, 4 * out));  // poisoned: unwritten outputs read NaN
        launch_attend(r, batch, hq, c.dp, 0);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        std::vector<float> o(out);
        CHECK(cudaMemcpy(o.data(), r.o, 4 * out, cudaMemcpyDeviceToHost));
        const double err = rel_rms(o, ref);
        double us = NAN;
        if (timed)
            us = median_graph_us([&](cudaStream_t s) { launch_attend(r, batch, hq, c.dp, s); }, 20, 25);
        const double tbs = bytes / (us * 1e-6) / 1e12;
        printf("%-52s %10.2f %8.3f %7.1f%% %10.2e %s\n", r.name.c_str(), us, tbs,
               100.0 * tbs / copy_tbs, err, !r.check ? "-" : err <= 1e-5 ? "ok" : "FAIL");
        fflush(stdout);
        for (void* x : {(void*)r.part_ml, (void*)r.part_acc, (void*)r.o}) CHECK(cudaFree(x));
    }
    free_cache(c);
}

// ---------------------------------------------------------------------------------------------
// Encode: 8 x 8192 new tokens into an empty cache (the same rows every launch).

static void encode_lab() {
    const int batch = 8, tokens = 8192, hkv = 8, d = 128;
    Cache c = make_cache(batch, tokens, 32, hkv, d, 99u);
    const size_t n = (size_t)batch * tokens * hkv * d;
    unsigned short *k, *v;
    int *zero_lens, *new_lens, *flags;
    CHECK(cudaMalloc(&k, 2 * n));
    CHECK(cudaMalloc(&v, 2 * n));
    fill_bf16_normal<<<1024, 256>>>(k, (long long)n, 5);
    fill_bf16_normal<<<1024, 256>>>(v, (long long)n, 6);
    std::vector<int> zeros(batch, 0), news(batch, tokens);
    CHECK(cudaMalloc(&zero_lens, 4 * batch));
    CHECK(cudaMalloc(&new_lens, 4 * batch));
    CHECK(cudaMalloc(&flags, 4));
    CHECK(cudaMemcpy(zero_lens, zeros.data(), 4 * batch, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(new_lens, news.data(), 4 * batch, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(flags, 0, 4));
    KvEncodeParams p{};
    p.k = k;
    p.v = v;
    p.pool = c.pool;
    p.block_table = c.table;
    p.seq_lens = zero_lens;
    p.new_lens = new_lens;
    p.consts = c.consts;
    p.flags = flags;
    p.batch = batch;
    p.tokens = tokens;
    p.kv_heads = hkv;
    p.dim = d;
    p.in_dtype = DT_BF16;
    p.norm_f16 = 0;
    p.bits_k = 4;
    p.bits_v = 2;
    p.words_k = d * 4 / 32;
    p.words_v = d * 2 / 32;
    p.page_tokens = c.page_tokens;
    p.max_pages = c.max_pages;
    p.page_words = c.page_words;
    p.head_words = c.head_words;
    p.row_words_k = c.row_words_k;
    p.row_words_v = c.row_words_v;
    p.norm_words = c.norm_words;
    p.hadamard_norm = 1.0f / std::sqrt((float)d);
    p.grid = LAB_GRID;
    // The library's division constants (as `divide_magic` in crates/cuda/src/kv/cache.rs).
    auto magic = [](unsigned divisor, unsigned* m, int* shift) {
        int l = 0;
        while ((1ull << l) < divisor) ++l;
        *m = (unsigned)(((1ull << 32) * ((1ull << l) - divisor)) / divisor + 1);
        *shift = l;
    };
    magic(hkv, &p.heads_magic, &p.heads_shift);
    magic(tokens, &p.tokens_magic, &p.tokens_shift);
    p.page_shift = 0;
    while ((1 << p.page_shift) < c.page_tokens) ++p.page_shift;
    KvEncodeParams p_search = p;  // the grids' zero tail: the binary search (the library before)
    p_search.grid = LAB_GRID + 2 * KV_GRID_FLOATS;
    const long long vectors = (long long)batch * tokens * hkv;
    const int blocks = (int)std::min<long long>((vectors + 15) / 16, 64LL * g_sms);
    const double in_bytes = 2.0 * 2.0 * n;
    const size_t pool_bytes = 4 * (size_t)c.pages * c.page_words;
    printf("== encode: %d x %d tokens, Hkv %d, d %d, bf16 in, 4/2 bits: %.1f MB of input\n", batch,
           tokens, hkv, d, in_bytes / 1e6);
    printf("%-52s %10s %8s %10s %s\n", "variant", "us", "TB/s", "words!=", "check");
    struct Enc {
        const char* name;
        const void* kernel;
        bool search = false;  // run with the grids disabled
        int per_sm = 128;     // blocks per SM in the launch, K and V together (the kernels loop)
    };
    const Enc encs[] = {{"library, binary search", (const void*)kv_encode_hadamard128_bf16, true},
                        {"library kv_encode_hadamard128_bf16 (grid)", (const void*)kv_encode_hadamard128_bf16},
                        {"library, one wave of blocks (7 per SM)", (const void*)kv_encode_hadamard128_bf16, false, 7},
                        {"library, two waves of blocks (14 per SM)", (const void*)kv_encode_hadamard128_bf16, false, 14},
                        {"pred loads", (const void*)kv3_encode_pred},
                        {"register nearest", (const void*)kv3_encode_reg},
                        {"pred loads + register nearest", (const void*)kv3_encode_pred_reg},
                        {"pred + register nearest + next prefetched", (const void*)kv3_encode_pred_reg_next},
                        {"pred + grid (keys) / compares (values)", (const void*)kv3_encode_pred_grid},
                        {"ablation of grid: f32 sqrt/div (no check)", (const void*)kv3_abl_f64},
                        {"ablation of grid: no lane butterflies (no check)", (const void*)kv3_abl_lanes},
                        {"ablation of grid: no search (no check)", (const void*)kv3_abl_search},
                        {"ablation of grid: no ordered sums (no check)", (const void*)kv3_abl_sums},
                        {"ablation of grid: all four (no check)", (const void*)kv3_abl_all},
                        {"loads and stores alone (no check)", (const void*)kv3_abl_move}};
    // The key grid (the lab's codebook: 4-bit keys).
    {
        std::vector<float> bk(c.levels_k.size() - 1);
        for (size_t i = 0; i + 1 < c.levels_k.size(); ++i) bk[i] = 0.5f * (c.levels_k[i] + c.levels_k[i + 1]);
        Kv3Grid grid{};
        grid.b0 = bk[0];
        const int n = (int)bk.size();
        bool distinct = false;
        for (float cells = KV3_GRID - 1; cells > 1 && !distinct; cells -= 1) {
            grid.inv_step = cells / (bk[n - 1] - bk[0]);
            std::vector<int> g(n);
            for (int i = 0; i < n; ++i) {
                volatile float t = bk[i] - grid.b0;
                volatile float m = t * grid.inv_step;
                g[i] = std::min(std::max((int)std::floor((float)m), 0), KV3_GRID - 1);
            }
            distinct = true;
            for (int i = 1; i < n; ++i) distinct &= g[i] != g[i - 1];
            if (!distinct) continue;
            for (int cell = 0; cell < KV3_GRID; ++cell) {
                int below = 0;
                float own = INFINITY;
                for (int i = 0; i < n; ++i) {
                    if (g[i] < cell) ++below;
                    if (g[i] == cell) own = bk[i];
                }
                grid.cell[cell] = make_float2((float)below, own);
            }
        }
        if (!distinct) printf("grid: no spacing separates the boundaries (grid variant will FAIL)\n");
        CHECK(cudaMemcpyToSymbol(kv3_grid_k, &grid, sizeof(grid)));
    }
    std::vector<unsigned> ref_pool, pool(pool_bytes / 4);
    for (const Enc& e : encs) {
        void* args[] = {e.search ? (void*)&p_search : (void*)&p};
        auto go = [&](cudaStream_t s) {
            const int launch_blocks = (int)std::min<long long>(blocks, std::max(1LL, (long long)e.per_sm * g_sms / 2));
            CHECK(cudaLaunchKernel(e.kernel, dim3(launch_blocks, 2), dim3(128), args, 0, s));
        };
        CHECK(cudaMemset(c.pool, 0, pool_bytes));
        go(0);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaMemcpy(pool.data(), c.pool, pool_bytes, cudaMemcpyDeviceToHost));
        long long differ = 0;
        if (ref_pool.empty()) {
            ref_pool = pool;
        } else {
            for (size_t i = 0; i < pool.size(); ++i) differ += pool[i] != ref_pool[i];
        }
        const double us = median_graph_us(go, 20, 25);
        const bool ablation = std::string(e.name).find("no check") != std::string::npos;
        printf("%-52s %10.2f %8.3f %10lld %s\n", e.name, us, in_bytes / (us * 1e-6) / 1e12, differ,
               ablation ? "-" : differ == 0 ? "ok" : "FAIL");
        fflush(stdout);
    }
    for (void* x : {(void*)k, (void*)v, (void*)zero_lens, (void*)new_lens, (void*)flags}) CHECK(cudaFree(x));
    free_cache(c);
}

int main(int argc, char** argv) {
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    g_sms = prop.multiProcessorCount;
    const std::string what = argc > 1 ? argv[1] : "all";
    int clock_khz = 0;
    CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    printf("GPU: %s, %d SMs, SM clock %d MHz (max)\n", prop.name, g_sms, clock_khz / 1000);
    if (what == "small") {  // every kernel once on small shapes, no timing (for the sanitizers)
        attend_shape("d256 check", 2, 1000, 8, 2, 256, false);
        attend_shape("d64 check", 2, 1000, 8, 2, 64, false);
        attend_shape("small d128", 2, 3000, 32, 8, 128, false);
        return 0;
    }
    // Encode first: a failing attention candidate (a trap) ends the process.
    if (what == "all" || what == "encode") encode_lab();
    if (what == "all" || what == "attend") {
        attend_shape("d256 check", 2, 1000, 8, 2, 256, false);
        attend_shape("d64 check", 2, 1000, 8, 2, 64, false);
        attend_shape("B8 x 32k", 8, 32768, 32, 8, 128, true);
        attend_shape("B1 x 128k", 1, 131072, 32, 8, 128, true);
    }
    return 0;
}

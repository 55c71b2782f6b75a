// Prefill kernel lab: times deltakv's GDN prefill prepare kernel (the library's .cu files are
// included as they are) beside variants written here first, at the Qwen3-Next shape, and checks
// every variant's W, U and gates against the library kernel's (which the Rust suite tests
// against the f64 oracle). A variant with per-phase clocks says where a block's time goes.
//
// Shape: B 1, T 16384, Hg 16, H 32, K = V = 128, bf16 k/v (k l2-normalised), f32 g and beta
// with Qwen3-Next-like gates.
//
// Build: nvcc -O3 -std=c++17 -arch=sm_90a -o prefill_lab tools/prefill-lab/prefill_lab.cu
// Run:   prefill_lab [T]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../../crates/cuda/kernels/common.cuh"

// Per-block phase clocks ([blocks][8]) when set; the library's PF_MARK points record them.
__device__ long long* lab_phase_clock;
#define PF_MARK(phase)                                                                        \
    if (threadIdx.x == 0 && lab_phase_clock)                                                  \
        lab_phase_clock[((long long)blockIdx.y * gridDim.x + blockIdx.x) * 8 + (phase)] = clock64();

#include "../../crates/cuda/kernels/gdn_prefill.cu"

#define CHECK(x)                                                                              \
    do {                                                                                      \
        cudaError_t e_ = (x);                                                                 \
        if (e_ != cudaSuccess) {                                                              \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

#include "prepare_variants.cuh"

static unsigned short to_bf16(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
static float from_bf16(unsigned short h) {
    unsigned u = (unsigned)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

typedef void (*Kernel)(PrefillParams);

int main(int argc, char** argv) {
    const int T = argc > 1 ? atoi(argv[1]) : 16384;
    const int HG = 16, H = 32, D = 128;
    const int chunks = (T + 63) / 64;
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("GPU: %s, %d SMs; prepare at B 1, T %d, Hg %d, H %d, K = V = %d (%d chunks x %d heads)\n",
           prop.name, prop.multiProcessorCount, T, HG, H, D, chunks, H);

    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
    std::vector<unsigned short> k((size_t)T * HG * D), v((size_t)T * H * D);
    for (size_t r = 0; r < (size_t)T * HG; ++r) {
        float x[D], n2 = 0.0f;
        for (int d = 0; d < D; ++d) n2 += (x[d] = normal(rng)) * x[d];
        for (int d = 0; d < D; ++d) k[r * D + d] = to_bf16(x[d] / sqrtf(n2 + 1e-6f));
    }
    for (auto& x : v) x = to_bf16(normal(rng));
    std::vector<float> g((size_t)T * H), beta((size_t)T * H);
    std::vector<float> a_log(H), dt_bias(H);
    for (int h = 0; h < H; ++h) {
        a_log[h] = 2.5f * uniform(rng);
        dt_bias[h] = -5.0f + 4.0f * uniform(rng);
    }
    for (int t = 0; t < T; ++t) {
        for (int h = 0; h < H; ++h) {
            float a = normal(rng) + dt_bias[h];
            float softplus = a > 20.0f ? a : log1pf(expf(a));
            g[(size_t)t * H + h] = -expf(a_log[h]) * softplus;
            beta[(size_t)t * H + h] = 1.0f / (1.0f + expf(-normal(rng)));
        }
    }
    std::vector<long long> first_row(chunks);
    std::vector<int> len(chunks);
    for (int c = 0; c < chunks; ++c) {
        first_row[c] = 64LL * c;
        len[c] = std::min(64, T - 64 * c);
    }

    auto upload = [](const void* host, size_t bytes) {
        void* dev;
        CHECK(cudaMalloc(&dev, bytes));
        CHECK(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
        return dev;
    };
    PrefillParams p;
    memset(&p, 0, sizeof p);
    p.k = (u64)upload(k.data(), k.size() * 2);
    p.v = (u64)upload(v.data(), v.size() * 2);
    p.g = (u64)upload(g.data(), g.size() * 4);
    p.beta = (u64)upload(beta.data(), beta.size() * 4);
    p.chunk_first_row = (u64)upload(first_row.data(), chunks * 8);
    p.chunk_len = (u64)upload(len.data(), chunks * 4);
    p.key_heads = HG;
    p.value_heads = H;
    p.key_dim = p.value_dim = p.key_pad = p.value_pad = D;
    p.beta_dtype = DT_F32;
    p.out_dtype = DT_BF16;
    p.reset_gate = -1e4f;
    const size_t wu = (size_t)chunks * H * 64 * D;
    const size_t gates_bytes = (size_t)chunks * H * PF_GATES_BYTES;
    void *w_ref, *u_ref, *gates_ref;
    CHECK(cudaMalloc(&w_ref, wu * 2));
    CHECK(cudaMalloc(&u_ref, wu * 2));
    CHECK(cudaMalloc(&gates_ref, gates_bytes));
    const int smem = (int)(PF_GATES_BYTES + 2 * (64 * (D + 8) + 64 * (D + 8)) +
                           4 * (2 * 64 * 65 + 3 * 16 * 17));
    std::vector<unsigned short> w_host(wu), u_host(wu), w_var(wu), u_var(wu);
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));

    auto run = [&](const char* name, Kernel kernel, int threads, int kernel_smem, bool reference) {
        PrefillParams q = p;
        void *w, *u, *gates;
        if (reference) {
            w = w_ref, u = u_ref, gates = gates_ref;
        } else {
            CHECK(cudaMalloc(&w, wu * 2));
            CHECK(cudaMalloc(&u, wu * 2));
            CHECK(cudaMalloc(&gates, gates_bytes));
        }
        CHECK(cudaMemset(w, 0xff, wu * 2));  // poison: NaN bf16
        CHECK(cudaMemset(u, 0xff, wu * 2));
        q.w = (u64)w, q.u = (u64)u, q.gates = (u64)gates;
        CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kernel_smem));
        dim3 grid(chunks, H);
        kernel<<<grid, threads, kernel_smem>>>(q);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        std::vector<float> times;
        for (int rep = 0; rep < 20; ++rep) {
            CHECK(cudaEventRecord(start));
            kernel<<<grid, threads, kernel_smem>>>(q);
            CHECK(cudaEventRecord(stop));
            CHECK(cudaEventSynchronize(stop));
            float ms;
            CHECK(cudaEventElapsedTime(&ms, start, stop));
            times.push_back(ms * 1000.0f);
        }
        std::sort(times.begin(), times.end());
        int blocks = 0;
        CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, kernel_smem));
        std::string check = "reference";
        if (!reference) {
            CHECK(cudaMemcpy(w_var.data(), w, wu * 2, cudaMemcpyDeviceToHost));
            CHECK(cudaMemcpy(u_var.data(), u, wu * 2, cudaMemcpyDeviceToHost));
            double dw = 0, nw = 0, du = 0, nu = 0;
            bool finite = true;
            for (size_t i = 0; i < wu; ++i) {
                float a = from_bf16(w_var[i]), b = from_bf16(w_host[i]);
                float c = from_bf16(u_var[i]), d = from_bf16(u_host[i]);
                finite &= std::isfinite(a) && std::isfinite(c);
                dw += (double)(a - b) * (a - b), nw += (double)b * b;
                du += (double)(c - d) * (c - d), nu += (double)d * d;
            }
            std::vector<unsigned char> g1(gates_bytes), g2(gates_bytes);
            CHECK(cudaMemcpy(g1.data(), gates, gates_bytes, cudaMemcpyDeviceToHost));
            CHECK(cudaMemcpy(g2.data(), gates_ref, gates_bytes, cudaMemcpyDeviceToHost));
            bool gates_same = true;  // the records' padding is never written
            for (size_t r = 0; r < gates_bytes / PF_GATES_BYTES; ++r) {
                gates_same &= memcmp(&g1[r * PF_GATES_BYTES], &g2[r * PF_GATES_BYTES],
                                     sizeof(ChunkGates)) == 0;
            }
            char buf[160];
            snprintf(buf, sizeof buf, "W %.2e U %.2e gates %s %s", sqrt(dw / nw), sqrt(du / nu),
                     gates_same ? "same" : "DIFFER",
                     finite && sqrt(dw / nw) < 1e-2 && sqrt(du / nu) < 1e-2 && gates_same ? "ok" : "FAIL");
            check = buf;
            CHECK(cudaFree(w));
            CHECK(cudaFree(u));
            CHECK(cudaFree(gates));
        } else {
            CHECK(cudaMemcpy(w_host.data(), w, wu * 2, cudaMemcpyDeviceToHost));
            CHECK(cudaMemcpy(u_host.data(), u, wu * 2, cudaMemcpyDeviceToHost));
        }
        printf("%-44s %9.2f us  (min %8.2f)  %d blocks/SM  %s\n", name, times[times.size() / 2],
               times[0], blocks, check.c_str());
    };

    run("library gdn_prefill_prepare_k128_v128", gdn_prefill_prepare_k128_v128, 256, smem, true);
    run_variants(run, smem);
    report_phases(p, chunks, H, smem);
    return 0;
}

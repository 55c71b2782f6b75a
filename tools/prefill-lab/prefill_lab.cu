// Prefill kernel lab: times deltakv's GDN prefill prepare kernel (the library's .cu files are
// included as they are) beside variants written here first, at the Qwen3-Next shape, and checks
// every variant's W, U, scores and gates against the library kernel's (which the Rust suite
// tests against the f64 oracle). Per-phase clocks say where a block's time goes.
//
// Shape: B 1, T 16384, Hg 16, H 32, K = V = 128, bf16 q/k/v, f32 g and beta with
// Qwen3-Next-like gates, the scores for the overlapped state pass. The reference run reads q
// and k l2-normalised on the host (as the convert kernel leaves them); the library kernel is
// also run with both value heads of a key head per block (the launcher's layout) and with the
// l2 norm fused (raw q and k in, the normalised copies written).
//
// Build: nvcc -O3 -std=c++17 -arch=sm_90a -o prefill_lab tools/prefill-lab/prefill_lab.cu
//        (add -DPF_PREPARE_BLOCKS_PER_SM=2 for the prepare at 128 registers, 2 blocks per SM;
//        `tools/gpu-check.sh build` makes both, prefill_lab and prefill_lab2)
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
#define LAB_MARKS 32
__device__ long long* lab_phase_clock;
#define PF_MARK(phase)                                                                        \
    if (threadIdx.x == 0 && lab_phase_clock)                                                  \
        lab_phase_clock[((long long)blockIdx.y * gridDim.x + blockIdx.x) * LAB_MARKS + (phase)] = clock64();

// The library's prepare module: the reference here.
#include "../../crates/cuda/kernels/gdn_prefill.cu"
#include "../../crates/cuda/kernels/gdn_prefill_inverse.cu"
#include "../../crates/cuda/kernels/gdn_prefill_prepare.cu"
#define LAB_REFERENCE gdn_prefill_prepare_mma_k128_v128

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
    // Raw q and k (bf16) and their l2-normalised copies (from the bf16 values, in f32).
    std::vector<unsigned short> q_raw((size_t)T * HG * D), k_raw((size_t)T * HG * D);
    std::vector<unsigned short> q((size_t)T * HG * D), k((size_t)T * HG * D), v((size_t)T * H * D);
    for (auto* pair : {&q_raw, &k_raw}) {
        auto& raw = *pair;
        auto& normed = pair == &q_raw ? q : k;
        for (size_t r = 0; r < (size_t)T * HG; ++r) {
            float n2 = 0.0f;
            for (int d = 0; d < D; ++d) {
                raw[r * D + d] = to_bf16(normal(rng));
                n2 += from_bf16(raw[r * D + d]) * from_bf16(raw[r * D + d]);
            }
            for (int d = 0; d < D; ++d) normed[r * D + d] = to_bf16(from_bf16(raw[r * D + d]) / sqrtf(n2 + 1e-6f));
        }
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
    p.q = (u64)upload(q.data(), q.size() * 2);
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
    p.heads_per_block = 1;  // the reference: one value head per block
    p.head_groups = H / HG;
    // The state passes' stage layouts (PF_W_ELEMS: U by 64-column tiles, rows swizzled).
    const size_t w_count = (size_t)chunks * H * PF_W_ELEMS(D);
    const size_t u_count = (size_t)chunks * H * (D / PF_TILE) * PF_U_TILE_ELEMS;
    const size_t gates_bytes = (size_t)chunks * H * PF_GATES_BYTES;
    const size_t scores_count = (size_t)chunks * H * PF_SCORES_ELEMS;
    void *w_ref, *u_ref, *gates_ref, *scores_ref;
    CHECK(cudaMalloc(&w_ref, w_count * 2));
    CHECK(cudaMalloc(&u_ref, u_count * 2));
    CHECK(cudaMalloc(&gates_ref, gates_bytes));
    CHECK(cudaMalloc(&scores_ref, scores_count * 2));
    // The launcher's prepare_smem: a gates record per value head of the block, then the rest.
    auto smem_for = [&](int heads_per_block) {
        return (int)(heads_per_block * PF_GATES_BYTES + 2 * (64 * (D + 8) + 64 * (D + 8)) +
                     4 * (2 * 64 * PF_LDF + 3 * 16 * 17));
    };
    const int smem = smem_for(1);
    std::vector<unsigned short> w_host(w_count), u_host(u_count), w_var(w_count), u_var(u_count);
    std::vector<unsigned short> s_host(scores_count), s_var(scores_count);
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));

    // Runs `kernel` with `params` (its w, u, gates and scores replaced by fresh buffers) on a
    // grid of chunks x (Hg x head_groups) blocks.
    auto run = [&](const char* name, Kernel kernel, const PrefillParams& params, int threads,
                   int kernel_smem, bool reference) {
        PrefillParams q = params;
        void *w, *u, *gates, *scores;
        if (reference) {
            w = w_ref, u = u_ref, gates = gates_ref, scores = scores_ref;
        } else {
            CHECK(cudaMalloc(&w, w_count * 2));
            CHECK(cudaMalloc(&u, u_count * 2));
            CHECK(cudaMalloc(&gates, gates_bytes));
            CHECK(cudaMalloc(&scores, scores_count * 2));
        }
        CHECK(cudaMemset(w, 0xff, w_count * 2));  // poison: NaN bf16
        CHECK(cudaMemset(u, 0xff, u_count * 2));
        CHECK(cudaMemset(scores, 0xff, scores_count * 2));
        q.w = (u64)w, q.u = (u64)u, q.gates = (u64)gates, q.scores = (u64)scores;
        CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kernel_smem));
        dim3 grid(chunks, HG * q.head_groups);
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
            CHECK(cudaMemcpy(w_var.data(), w, w_count * 2, cudaMemcpyDeviceToHost));
            CHECK(cudaMemcpy(u_var.data(), u, u_count * 2, cudaMemcpyDeviceToHost));
            CHECK(cudaMemcpy(s_var.data(), scores, scores_count * 2, cudaMemcpyDeviceToHost));
            double dw = 0, nw = 0, du = 0, nu = 0, ds = 0, ns = 0;
            bool finite = true;
            for (size_t i = 0; i < w_count; ++i) {
                float a = from_bf16(w_var[i]), b = from_bf16(w_host[i]);
                finite &= std::isfinite(a);
                dw += (double)(a - b) * (a - b), nw += (double)b * b;
            }
            for (size_t i = 0; i < u_count; ++i) {
                float c = from_bf16(u_var[i]), d = from_bf16(u_host[i]);
                finite &= std::isfinite(c);
                du += (double)(c - d) * (c - d), nu += (double)d * d;
            }
            for (size_t i = 0; i < scores_count; ++i) {
                float a = from_bf16(s_var[i]), b = from_bf16(s_host[i]);
                finite &= std::isfinite(a);
                ds += (double)(a - b) * (a - b), ns += (double)b * b;
            }
            std::vector<unsigned char> g1(gates_bytes), g2(gates_bytes);
            CHECK(cudaMemcpy(g1.data(), gates, gates_bytes, cudaMemcpyDeviceToHost));
            CHECK(cudaMemcpy(g2.data(), gates_ref, gates_bytes, cudaMemcpyDeviceToHost));
            bool gates_same = true;  // the records' padding is never written
            for (size_t r = 0; r < gates_bytes / PF_GATES_BYTES; ++r) {
                gates_same &= memcmp(&g1[r * PF_GATES_BYTES], &g2[r * PF_GATES_BYTES],
                                     sizeof(ChunkGates)) == 0;
            }
            char buf[200];
            snprintf(buf, sizeof buf, "W %.2e U %.2e scores %.2e gates %s %s", sqrt(dw / nw),
                     sqrt(du / nu), sqrt(ds / ns), gates_same ? "same" : "DIFFER",
                     finite && sqrt(dw / nw) < 1e-2 && sqrt(du / nu) < 1e-2 &&
                             sqrt(ds / ns) < 1e-2 && gates_same
                         ? "ok"
                         : "FAIL");
            check = buf;
            CHECK(cudaFree(w));
            CHECK(cudaFree(u));
            CHECK(cudaFree(gates));
            CHECK(cudaFree(scores));
        } else {
            CHECK(cudaMemcpy(w_host.data(), w, w_count * 2, cudaMemcpyDeviceToHost));
            CHECK(cudaMemcpy(u_host.data(), u, u_count * 2, cudaMemcpyDeviceToHost));
            CHECK(cudaMemcpy(s_host.data(), scores, scores_count * 2, cudaMemcpyDeviceToHost));
        }
        printf("%-44s %9.2f us  (min %8.2f)  %d blocks/SM  %s\n", name, times[times.size() / 2],
               times[0], blocks, check.c_str());
    };

    run("library, one value head per block", LAB_REFERENCE, p, 256, smem, true);
    // Both value heads of a key head per block (the launcher's layout at r = 2).
    PrefillParams grouped = p;
    grouped.heads_per_block = H / HG;
    grouped.head_groups = 1;
    run("library, a key head's 2 value heads per block", LAB_REFERENCE, grouped, 256,
        smem_for(H / HG), false);
    // The same with the l2 norm fused: raw q and k in, the normalised copies out (checked
    // against the host's below).
    PrefillParams fused = grouped;
    fused.fused_qk_norm = 1;
    fused.q_src = (u64)upload(q_raw.data(), q_raw.size() * 2);
    fused.k_src = (u64)upload(k_raw.data(), k_raw.size() * 2);
    void *q_copy, *k_copy;
    CHECK(cudaMalloc(&q_copy, q.size() * 2));
    CHECK(cudaMalloc(&k_copy, k.size() * 2));
    CHECK(cudaMemset(q_copy, 0xff, q.size() * 2));
    CHECK(cudaMemset(k_copy, 0xff, k.size() * 2));
    fused.q = (u64)q_copy, fused.k = (u64)k_copy;
    run("library, 2 value heads per block, l2 fused", LAB_REFERENCE, fused, 256,
        smem_for(H / HG), false);
    {
        std::vector<unsigned short> got(q.size());
        size_t differ = 0;
        double worst = 0;
        for (int which = 0; which < 2; ++which) {
            CHECK(cudaMemcpy(got.data(), which ? k_copy : q_copy, got.size() * 2, cudaMemcpyDeviceToHost));
            const auto& want = which ? k : q;
            for (size_t i = 0; i < got.size(); ++i) {
                differ += got[i] != want[i];
                worst = std::max(worst, (double)fabsf(from_bf16(got[i]) - from_bf16(want[i])));
            }
        }
        printf("fused l2 norm: %zu of %zu normalised q/k elements differ from the host's (largest %.2e) %s\n",
               differ, 2 * got.size(), worst, worst < 1e-2 ? "ok" : "FAIL");
    }
    run_variants(run, p, smem);
    report_phases("library, one value head per block", p, chunks, smem);
    report_phases("library, 2 value heads per block", grouped, chunks, smem_for(H / HG));
    report_phases("library, 2 value heads per block, l2 fused", fused, chunks, smem_for(H / HG));
    return 0;
}

// ---------------------------------------------------------------------------------------
// Warpgroup products for the state passes (sm_90a `wgmma`): D (64 x N, f32, in registers) +=
// A (64 x 16, bf16, from registers) x B (16 x N, bf16, from shared memory), issued by the four
// warps of a warpgroup together. Warp w of the warpgroup holds rows 16 w .. 16 w + 15 of A and
// D in the m16n8k16 fragment layouts (`frag_a`; D's n8 tile n as d[n][0..3]), so the state
// passes keep their register layouts and only the B operands move to shared memory in the
// layout below.
//
// B layout (no swizzle, K-major): B[k][n] of a K_DIM x N matrix in 8 x 8 core matrices of 128
// contiguous bytes, core matrix (n / 8, k / 8) at ((n / 8) (K_DIM / 8) + k / 8) 128 bytes, its
// row n % 8 at 16 (n % 8), element k % 8 at 2 (k % 8). So the descriptor's leading byte offset
// (between core matrices along k) is 128 and its stride byte offset (along n) K_DIM / 8 x 128.
// The producers write B from m16n8 fragments with `stmatrix .trans` (a fragment's column is
// a core matrix's row), 128 bytes per 8 x 8 block: no bank conflicts.
//
// wgmma exists on sm_90a only: elsewhere (sm_100a and later, or a plain sm_90 build)
// `wg_product` runs the same product on mma.sync, each warp its 16 rows, reading B's core
// matrices with ldmatrix (a core matrix's rows are the B fragment's columns).
//
// Ordering: a wgmma reads its A registers and B bytes asynchronously until the group that holds
// it is waited for, and its accumulators are not valid before then. `wg_fence` ties registers to
// the program order (an empty asm reading and writing them) so the compiler neither reuses A's
// registers nor reads D early; shared memory written by ordinary stores is made visible to the
// wgmma's (async) proxy by `fence.proxy.async` before the barrier that precedes the product.

// The wgmma descriptor of the 16 x N slab of B at rows k0.., columns n0.. (both multiples of
// 8; 16-byte aligned base).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
template <int K_DIM>
__device__ __forceinline__ unsigned long long wg_desc_b(const unsigned short* base, int k0, int n0) {
    const unsigned address = shared_address(base) + (unsigned)(((n0 >> 3) * (K_DIM / 8) + (k0 >> 3)) * 128);
    constexpr unsigned long long LEADING = 128, STRIDE = (K_DIM / 8) * 128;
    static_assert(STRIDE < (1u << 18), "the stride byte offset has 14 bits of 16 bytes");
    return (unsigned long long)((address & 0x3ffffu) >> 4) | ((LEADING >> 4) << 16) | ((STRIDE >> 4) << 32);
}

template <int NT>
__device__ __forceinline__ void wgmma_bf16(float (&d)[NT][4], const unsigned (&a)[4], unsigned long long desc);

template <>
__device__ __forceinline__ void wgmma_bf16<2>(float (&d)[2][4], const unsigned (&a)[4],
                                                unsigned long long desc) {
    asm volatile(
        "{ .reg .pred p; setp.ne.b32 p, %13, 0; "
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, 0; }"
        : "+f"(d[0][0]),
          "+f"(d[0][1]),
          "+f"(d[0][2]),
          "+f"(d[0][3]),
          "+f"(d[1][0]),
          "+f"(d[1][1]),
          "+f"(d[1][2]),
          "+f"(d[1][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1)
        : "memory");
}
template <>
__device__ __forceinline__ void wgmma_bf16<4>(float (&d)[4][4], const unsigned (&a)[4],
                                                unsigned long long desc) {
    asm volatile(
        "{ .reg .pred p; setp.ne.b32 p, %21, 0; "
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0; }"
        : "+f"(d[0][0]),
          "+f"(d[0][1]),
          "+f"(d[0][2]),
          "+f"(d[0][3]),
          "+f"(d[1][0]),
          "+f"(d[1][1]),
          "+f"(d[1][2]),
          "+f"(d[1][3]),
          "+f"(d[2][0]),
          "+f"(d[2][1]),
          "+f"(d[2][2]),
          "+f"(d[2][3]),
          "+f"(d[3][0]),
          "+f"(d[3][1]),
          "+f"(d[3][2]),
          "+f"(d[3][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1)
        : "memory");
}
template <>
__device__ __forceinline__ void wgmma_bf16<8>(float (&d)[8][4], const unsigned (&a)[4],
                                                unsigned long long desc) {
    asm volatile(
        "{ .reg .pred p; setp.ne.b32 p, %37, 0; "
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0; }"
        : "+f"(d[0][0]),
          "+f"(d[0][1]),
          "+f"(d[0][2]),
          "+f"(d[0][3]),
          "+f"(d[1][0]),
          "+f"(d[1][1]),
          "+f"(d[1][2]),
          "+f"(d[1][3]),
          "+f"(d[2][0]),
          "+f"(d[2][1]),
          "+f"(d[2][2]),
          "+f"(d[2][3]),
          "+f"(d[3][0]),
          "+f"(d[3][1]),
          "+f"(d[3][2]),
          "+f"(d[3][3]),
          "+f"(d[4][0]),
          "+f"(d[4][1]),
          "+f"(d[4][2]),
          "+f"(d[4][3]),
          "+f"(d[5][0]),
          "+f"(d[5][1]),
          "+f"(d[5][2]),
          "+f"(d[5][3]),
          "+f"(d[6][0]),
          "+f"(d[6][1]),
          "+f"(d[6][2]),
          "+f"(d[6][3]),
          "+f"(d[7][0]),
          "+f"(d[7][1]),
          "+f"(d[7][2]),
          "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1)
        : "memory");
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <int N>
__device__ __forceinline__ void wg_fence(float (&d)[N][4]) {
#pragma unroll
    for (int n = 0; n < N; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[n][e])::"memory");
    }
}
template <int N>
__device__ __forceinline__ void wg_fence(unsigned (&a)[N][4]) {
#pragma unroll
    for (int n = 0; n < N; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[n][e])::"memory");
    }
}

// The k16 steps of A fragments a state pass holds per wgmma group: all of them up to 8 (K <=
// 128), 4 of K = 256's 16 (its 512-thread blocks have 128 registers a thread).
__host__ __device__ constexpr int wg_batch(int ksteps) { return ksteps > 8 ? 4 : ksteps; }

// d += A B over KSTEPS k16 steps, B (K_DIM x N, `wg_desc_b`'s layout at `b`) from column n0:
// load_a(a, step) fills this warp's A fragment of k step `step`. On sm_90a every warp of the
// warpgroup calls it and the steps run as wgmma groups of BATCH (A's fragments of a batch are
// held until the group is waited for); elsewhere each warp runs its rows on mma.sync.
template <int NT, int KSTEPS, int BATCH, int K_DIM, typename LoadA>
__device__ __forceinline__ void wg_product(float (&d)[NT][4], LoadA load_a, const unsigned short* b,
                                           int n0) {
    static_assert(KSTEPS % BATCH == 0 && NT % 2 == 0, "whole batches, pairs of n8 tiles");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#pragma unroll
    for (int s0 = 0; s0 < KSTEPS; s0 += BATCH) {
        unsigned a[BATCH][4];
#pragma unroll
        for (int i = 0; i < BATCH; ++i) load_a(a[i], s0 + i);
        wg_fence(d);
        wgmma_fence();
#pragma unroll
        for (int i = 0; i < BATCH; ++i) wgmma_bf16<NT>(d, a[i], wg_desc_b<K_DIM>(b, 16 * (s0 + i), n0));
        wgmma_commit();
        wgmma_wait_all();
        wg_fence(d);
        wg_fence(a);
    }
#else
    const int lane = threadIdx.x & 31, m = lane >> 3, row = lane & 7;
#pragma unroll
    for (int step = 0; step < KSTEPS; ++step) {
        unsigned a[4];
        load_a(a, step);
#pragma unroll
        for (int j = 0; j < NT; j += 2) {
            // Core matrices (n tile, k block): (j, 2 step), (j, 2 step + 1), (j + 1, ..), ...
            unsigned r[4];
            ldsm_x4(r, b + (((n0 >> 3) + j + (m >> 1)) * (K_DIM / 8) + 2 * step + (m & 1)) * 64 + 8 * row);
            const unsigned b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
            mma_bf16_16816(d[j], a, b0);
            mma_bf16_16816(d[j + 1], a, b1);
        }
    }
#endif
}

__device__ __forceinline__ void stsm_x4_trans(unsigned short* at, unsigned r0, unsigned r1, unsigned r2,
                                              unsigned r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(
                     shared_address(at)),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}

// A warp's m16n8 fragments of a K_DIM x (8 n-tiles) block, rows k_block * 8 .. + 15 (the
// fragments' rows are B's k) and columns 8 (n_first + n) .. (B's n), stored as B for wgmma:
// pairs[n][h] holds the bf16 pair of fragment row lane / 4 + 8 h, columns 2 (lane % 4) .. + 1.
template <int K_DIM, int NT>
__device__ __forceinline__ void store_b_fragments(const unsigned (&pairs)[NT][2], unsigned short* b,
                                                  int n_first, int k_block, int lane) {
    static_assert(NT % 2 == 0, "two n8 tiles per stmatrix");
    const int m = lane >> 3, j = lane & 7;
#pragma unroll
    for (int n = 0; n < NT; n += 2) {
        unsigned short* at = b + ((n_first + n + (m >> 1)) * (K_DIM / 8) + k_block + (m & 1)) * 64 + 8 * j;
        stsm_x4_trans(at, pairs[n][0], pairs[n][1], pairs[n + 1][0], pairs[n + 1][1]);
    }
}

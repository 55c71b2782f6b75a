// Lab candidate v4 of the Hadamard encode (included by kv_lab.cu after the library's
// kv_encode.cu, whose helpers it uses): four lanes per vector instead of eight, eight vectors
// per warp. Lane l of a vector holds elements 8 j + 4 k + l (j < E, k < 2) in x[2 j + k]: the
// CPU's partial sums l and l + 4 (acc[i % 8]), so every sum keeps the CPU's order; the
// butterflies h = 1, 2 are lane exchanges, h = 4 a register pair, h >= 8 register pairs.
//
// Per element, against the library's eight lanes: two butterfly stages of shuffle + fma
// instead of three (one becomes an add or subtract in registers), the per-vector work (the
// two ordered 8-term sums, f64 sqrt and divisions, destination, norm store) spread over 32
// elements per lane instead of 16, and the OR reduce-scatter of the codes over 4 lanes (12
// shuffles for 16 words instead of 14 for 16 groups over 8 lanes). 2- and 4-bit codes only
// (the lab's shapes); other widths store nothing (the word check fails).

template <typename T, int E>
__device__ __forceinline__ void kv4_or_scatter4(T (&v)[E], int l) {
#pragma unroll
    for (int off = 2; off >= 1; off >>= 1) {
        const bool up = (l & off) != 0;
#pragma unroll
        for (int j = 0; j < E; ++j) {
            if ((j & (3 & ~(off - 1))) == 0) {
                const T lo = v[j], hi = v[j + off];
                v[j] = (up ? hi : lo) | __shfl_xor_sync(KV_FULL, up ? lo : hi, off);
            }
        }
    }
}

// The sum of the eight partials (lane g + i % 4, partial i / 4) in the order i = 0 .. 7.
__device__ __forceinline__ float kv4_sum8(float a0, float a1, int gbase) {
    float s = __shfl_sync(KV_FULL, a0, gbase);
#pragma unroll
    for (int i = 1; i < 8; ++i) s = __fadd_rn(s, __shfl_sync(KV_FULL, i < 4 ? a0 : a1, gbase + (i & 3)));
    return s;
}

template <int E>
__device__ __forceinline__ void kv4_encode_hadamard(const KvEncodeParams& p) {
    constexpr int R = 2 * E;  // elements per lane
    __shared__ float levels[256];
    __shared__ float bounds[256];
    __shared__ float2 grid_cells[KV_GRID_CELLS];
    const int kv = blockIdx.y;
    const int bits = kv == 0 ? p.bits_k : p.bits_v;
    const int words = kv == 0 ? p.words_k : p.words_v;
    const int row_words = kv == 0 ? p.row_words_k : p.row_words_v;
    const float* src_levels = p.consts + (kv == 0 ? KV_C_LEVELS_K : KV_C_LEVELS_V);
    const float* src_bounds = p.consts + (kv == 0 ? KV_C_BOUNDS_K : KV_C_BOUNDS_V);
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
        levels[i] = src_levels[i];
        bounds[i] = src_bounds[i];
    }
    float grid_b0, grid_inv;
    const bool use_grid = kv_load_grid(p, kv, grid_cells, &grid_b0, &grid_inv);
    __syncthreads();
    const void* src = kv == 0 ? p.k : p.v;
    const int lane = threadIdx.x & 31, l = lane & 3, gbase = lane & 28;
    float sign[R];
#pragma unroll
    for (int r = 0; r < R; ++r) sign[r] = p.consts[KV_C_ROTATION + 8 * (r / 2) + 4 * (r % 2) + l];
    const long long total = (long long)p.batch * p.tokens * p.kv_heads;
    const long long warps = (long long)gridDim.x * KV_ENC_WARPS;
    for (long long w = (long long)blockIdx.x * KV_ENC_WARPS + (threadIdx.x >> 5); w * 8 < total;
         w += warps) {
        const long long vec = w * 8 + (lane >> 2);
        bool valid = vec < total;
        int b = 0, t = 0, h = 0;
        if (valid) {
            h = (int)(vec % p.kv_heads);
            const long long bt = vec / p.kv_heads;
            t = (int)(bt % p.tokens);
            b = (int)(bt / p.tokens);
            valid = t < p.new_lens[b];
        }
        float x[R];
        bool bad = false;
        float acc[2] = {0.0f, 0.0f};
#pragma unroll
        for (int r = 0; r < R; ++r) {
            x[r] = valid ? load_float(src, vec * p.dim + 8 * (r / 2) + 4 * (r % 2) + l, p.in_dtype) : 0.0f;
            bad |= !kv_finite(x[r]);
            acc[r % 2] = __fadd_rn(acc[r % 2], __fmul_rn(x[r], x[r]));
        }
        if (bad) atomicOr(p.flags, 1);
        const float fast = kv4_sum8(acc[0], acc[1], gbase);
        const bool slow = !(kv_finite(fast) && fast >= 1e-30f);
        double rn = __dsqrt_rn((double)fast);
        if (__any_sync(KV_FULL, slow && valid)) {
            double s = 0.0;
#pragma unroll
            for (int r = 0; r < R; ++r) {  // element 8 j + 4 k + i: index order
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const double e = (double)__shfl_sync(KV_FULL, x[r], gbase + i);
                    s = __dadd_rn(s, __dmul_rn(e, e));
                }
            }
            if (slow) rn = __dsqrt_rn(s);
        }
#pragma unroll
        for (int r = 0; r < R; ++r) x[r] = __fmul_rn(x[r], sign[r]);
#pragma unroll
        for (int hb = 1; hb < 4; hb <<= 1) {
            const float sgn = (l & hb) ? -1.0f : 1.0f;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const float other = __shfl_xor_sync(KV_FULL, x[r], hb);
                x[r] = __fmaf_rn(sgn, x[r], other);
            }
        }
        // h = 4 (k), then h = 8, 16, .. (j): register pairs.
#pragma unroll
        for (int hr = 1; hr < R; hr <<= 1) {
#pragma unroll
            for (int r = 0; r < R; ++r) {
                if ((r & hr) == 0) {
                    const float a = x[r], c = x[r + hr];
                    x[r] = __fadd_rn(a, c);
                    x[r + hr] = __fsub_rn(a, c);
                }
            }
        }
        const float inv = rn > 0.0 ? __double2float_rn(__ddiv_rn(1.0, rn)) : 0.0f;
        unsigned code[R];
        float cacc[2] = {0.0f, 0.0f};
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float u = __fmul_rn(__fmul_rn(x[r], p.hadamard_norm), inv);
            code[r] = use_grid ? kv_nearest_grid(grid_cells, grid_b0, grid_inv, u)
                               : kv_nearest(bounds, bits, u);
            const float c = levels[code[r]];
            cacc[r % 2] = __fadd_rn(cacc[r % 2], __fmul_rn(c, c));
        }
        const float code_sq = kv4_sum8(cacc[0], cacc[1], gbase);
        const double code_norm = __dsqrt_rn((double)code_sq);
        const float norm =
            (rn > 0.0 && code_norm > 0.0) ? __double2float_rn(__ddiv_rn(rn, code_norm)) : 0.0f;
        unsigned* row = 0;
        unsigned* norms = 0;
        int slot = 0;
        if (valid) kv_destination(p, kv, b, t, h, &row, &norms, &slot);
        // Group j (elements 8 j .. 8 j + 7, two per lane) is 8 * bits bits; lane l gathers
        // groups l, l + 4, .. by an OR reduce-scatter over the vector's four lanes.
        unsigned g[E];
#pragma unroll
        for (int j = 0; j < E; ++j) g[j] = (code[2 * j] << (bits * l)) | (code[2 * j + 1] << (bits * (l + 4)));
        kv4_or_scatter4<unsigned, E>(g, l);
        if (valid) {
#pragma unroll
            for (int m = 0; m < E / 4; ++m) {
                const int j = 4 * m + l;
                if (bits == 4) row[j] = g[4 * m];
                else if (bits == 2) ((unsigned short*)row)[j] = (unsigned short)g[4 * m];
            }
            for (int pad = words + l; pad < row_words; pad += 4) row[pad] = 0u;
            if (l == 0) kv_store_norm(norms, slot, norm, p.norm_f16, p.flags);
        }
    }
}

extern "C" __global__ void __launch_bounds__(128, 4) kv4_encode_lanes4_b4(KvEncodeParams p) {
    kv4_encode_hadamard<16>(p);
}
extern "C" __global__ void __launch_bounds__(128, 5) kv4_encode_lanes4_b5(KvEncodeParams p) {
    kv4_encode_hadamard<16>(p);
}

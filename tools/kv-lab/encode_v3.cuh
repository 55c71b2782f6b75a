// Lab candidates for the Hadamard encode (included by kv_lab.cu after kv_encode.cu). The math
// and every rounding are the library's `kv_encode_hadamard` (the lab checks the pool word for
// word against it); the knobs change only how the work is fed:
//
//   PRED    the E input loads of a lane as predicated loads of both widths into one register
//           (`load_bits`), all issued before any is converted: the library's `load_float`
//           converts inside a dtype branch, which can make each load wait for the previous.
//   REGNEAR the nearest level for 2- and 4-bit codes from the boundaries held in registers
//           (2 bits: three compares; 4 bits: a bisection whose candidates are picked by
//           selects), no shared-memory loads; 8 bits keep the shared binary search.
//   GRID    4-bit keys: the uniform-grid lookup below (values: REGNEAR's compares).
//   NEXT    the next iteration's inputs are loaded before this iteration's work (two vectors
//           per lane group in flight).

// #{boundaries < u} for 4-bit codes, boundaries b[0..14] in registers.
__device__ __forceinline__ unsigned kv3_nearest4(const float (&b)[15], float u) {
    const bool t3 = u > b[7];
    const float c2 = t3 ? b[11] : b[3];
    const bool t2 = u > c2;
    const float c1 = t3 ? (t2 ? b[13] : b[9]) : (t2 ? b[5] : b[1]);
    const bool t1 = u > c1;
    const float e3 = t3 ? (t2 ? (t1 ? b[14] : b[12]) : (t1 ? b[10] : b[8]))
                        : (t2 ? (t1 ? b[6] : b[4]) : (t1 ? b[2] : b[0]));
    const bool t0 = u > e3;
    return (t3 ? 8u : 0u) + (t2 ? 4u : 0u) + (t1 ? 2u : 0u) + (t0 ? 1u : 0u);
}

// GRID (4-bit codes): a uniform grid over the boundaries. Cell g(u) = clamp(floor((u - b0) *
// inv_step), 0, G - 1), each product and difference rounded as f32 on the host and here, is
// monotone in u, so every boundary in a lower cell is below u and every one in a higher cell
// above it; the host picks inv_step so that no cell holds two boundaries and stores, per cell,
// the count of boundaries in lower cells and the cell's own boundary (+inf if none):
// idx = count[g] + (u > bound[g]), exact, one shared load.
#define KV3_GRID 64
struct Kv3Grid {
    float b0, inv_step;
    float2 cell[KV3_GRID];  // (count as float, boundary)
};
__constant__ Kv3Grid kv3_grid_k;

__device__ __forceinline__ unsigned kv3_nearest_grid(const float2* cells, float b0, float inv_step,
                                                     float u) {
    int g = __float2int_rd(__fmul_rn(__fsub_rn(u, b0), inv_step));
    g = min(max(g, 0), KV3_GRID - 1);
    const float2 c = cells[g];
    return (unsigned)c.x + (u > c.y ? 1u : 0u);
}

// Ablations (timing only, outputs wrong): which part of the work costs the time.
#define KV3_NO_F64 1      // f32 sqrt and divisions instead of the f64 ones
#define KV3_NO_LANES 2    // no butterflies across lanes (h = 1, 2, 4)
#define KV3_NO_SEARCH 4   // every code 0 (no nearest-level search)
#define KV3_NO_SUMS 8     // no ordered norm and code-square sums across lanes
#define KV3_MOVE 16       // the loads and the stores alone (input bits as codes)

template <int E, bool PRED, bool REGNEAR, bool NEXT, bool GRID = false, int ABL = 0>
__device__ __forceinline__ void kv3_encode_hadamard(const KvEncodeParams& p) {
    __shared__ float levels[256];
    __shared__ float bounds[256];
    __shared__ float2 grid_cells[KV3_GRID];
    if (GRID && threadIdx.x < KV3_GRID) grid_cells[threadIdx.x] = kv3_grid_k.cell[threadIdx.x];
    const float grid_b0 = kv3_grid_k.b0, grid_inv = kv3_grid_k.inv_step;
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
    float breg[15];
#pragma unroll
    for (int i = 0; i < 15; ++i) breg[i] = REGNEAR ? src_bounds[i] : 0.0f;
    __syncthreads();
    const void* src = kv == 0 ? p.k : p.v;
    const int lane = threadIdx.x & 31, l = lane & 7, gbase = lane & 24;
    float sign[E];
#pragma unroll
    for (int j = 0; j < E; ++j) sign[j] = p.consts[KV_C_ROTATION + 8 * j + l];
    const long long total = (long long)p.batch * p.tokens * p.kv_heads;
    const long long warps = (long long)gridDim.x * KV_ENC_WARPS;
    // The vector of iteration w and whether it exists; its inputs' bits.
    auto locate = [&](long long w, int& b, int& t, int& h) -> bool {
        const long long vec = w * 4 + (lane >> 3);
        b = 0;
        t = 0;
        h = 0;
        if (vec >= total) return false;
        h = (int)(vec % p.kv_heads);
        const long long bt = vec / p.kv_heads;
        t = (int)(bt % p.tokens);
        b = (int)(bt / p.tokens);
        return t < p.new_lens[b];
    };
    auto fetch = [&](long long w, bool valid, unsigned (&bitsx)[E]) {
        const long long vec = w * 4 + (lane >> 3);
#pragma unroll
        for (int j = 0; j < E; ++j)
            bitsx[j] = load_bits(src, valid ? vec * p.dim + 8 * j + l : 0, p.in_dtype);
    };
    long long w = (long long)blockIdx.x * KV_ENC_WARPS + (threadIdx.x >> 5);
    int nb = 0, nt = 0, nh = 0;
    bool nvalid = false;
    unsigned nbits[E];
    if (NEXT && w * 4 < total) {
        nvalid = locate(w, nb, nt, nh);
        fetch(w, nvalid, nbits);
    }
    for (; w * 4 < total; w += warps) {
        const long long vec = w * 4 + (lane >> 3);
        bool valid;
        int b, t, h;
        float x[E];
        if (NEXT) {
            valid = nvalid;
            b = nb;
            t = nt;
            h = nh;
#pragma unroll
            for (int j = 0; j < E; ++j) x[j] = valid ? bits_to_float(nbits[j], p.in_dtype) : 0.0f;
            if ((w + warps) * 4 < total) {
                nvalid = locate(w + warps, nb, nt, nh);
                fetch(w + warps, nvalid, nbits);
            }
        } else if (PRED) {
            valid = locate(w, b, t, h);
            unsigned xb[E];
            fetch(w, valid, xb);
#pragma unroll
            for (int j = 0; j < E; ++j) x[j] = valid ? bits_to_float(xb[j], p.in_dtype) : 0.0f;
        } else {
            valid = locate(w, b, t, h);
#pragma unroll
            for (int j = 0; j < E; ++j)
                x[j] = valid ? load_float(src, vec * p.dim + 8 * j + l, p.in_dtype) : 0.0f;
        }
        if (ABL & KV3_MOVE) {
            if (!valid) continue;
            unsigned* row;
            unsigned* norms;
            int slot;
            kv_destination(p, kv, b, t, h, &row, &norms, &slot);
#pragma unroll
            for (int m = 0; m < E / 8; ++m) {
                const unsigned word = __float_as_uint(x[8 * m]) ^ __float_as_uint(x[8 * m + 1]);
                if (bits == 4) row[8 * m + l] = word;
                else ((unsigned short*)row)[8 * m + l] = (unsigned short)word;
            }
            if (l == 0) norms[slot] = __float_as_uint(x[2]);
            continue;
        }
        bool bad = false;
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < E; ++j) {
            bad |= !kv_finite(x[j]);
            acc = __fadd_rn(acc, __fmul_rn(x[j], x[j]));
        }
        if (bad) atomicOr(p.flags, 1);
        float fast = __shfl_sync(KV_FULL, acc, gbase);
        if (!(ABL & KV3_NO_SUMS)) {
#pragma unroll
            for (int k = 1; k < 8; ++k) fast = __fadd_rn(fast, __shfl_sync(KV_FULL, acc, gbase + k));
        }
        const bool slow = !(kv_finite(fast) && fast >= 1e-30f);
        double r = (ABL & KV3_NO_F64) ? (double)sqrtf(fast) : __dsqrt_rn((double)fast);
        if (__any_sync(KV_FULL, slow && valid)) {
            double s = 0.0;
#pragma unroll
            for (int j = 0; j < E; ++j) {
#pragma unroll
                for (int k = 0; k < 8; ++k) {
                    double e = (double)__shfl_sync(KV_FULL, x[j], gbase + k);
                    s = __dadd_rn(s, __dmul_rn(e, e));
                }
            }
            if (slow) r = __dsqrt_rn(s);
        }
#pragma unroll
        for (int j = 0; j < E; ++j) x[j] = __fmul_rn(x[j], sign[j]);
#pragma unroll
        for (int hb = 1; hb < ((ABL & KV3_NO_LANES) ? 1 : 8); hb <<= 1) {
            const float sgn = (l & hb) ? -1.0f : 1.0f;
#pragma unroll
            for (int j = 0; j < E; ++j) {
                float other = __shfl_xor_sync(KV_FULL, x[j], hb);
                x[j] = __fmaf_rn(sgn, x[j], other);
            }
        }
#pragma unroll
        for (int hj = 1; hj < E; hj <<= 1) {
#pragma unroll
            for (int j = 0; j < E; ++j) {
                if ((j & hj) == 0) {
                    float a = x[j], c = x[j + hj];
                    x[j] = __fadd_rn(a, c);
                    x[j + hj] = __fsub_rn(a, c);
                }
            }
        }
        const float inv = r > 0.0 ? ((ABL & KV3_NO_F64) ? 1.0f / (float)r : __double2float_rn(__ddiv_rn(1.0, r)))
                                  : 0.0f;
        unsigned code[E];
        float cacc = 0.0f;
#pragma unroll
        for (int j = 0; j < E; ++j) {
            float u = __fmul_rn(__fmul_rn(x[j], p.hadamard_norm), inv);
            if (ABL & KV3_NO_SEARCH) {
                code[j] = __float_as_uint(u) >> 31;
            } else if (GRID && kv == 0) {
                code[j] = kv3_nearest_grid(grid_cells, grid_b0, grid_inv, u);
            } else if (REGNEAR && bits == 4) {
                code[j] = kv3_nearest4(breg, u);
            } else if (REGNEAR && bits == 2) {
                code[j] = (u > breg[0] ? 1u : 0u) + (u > breg[1] ? 1u : 0u) + (u > breg[2] ? 1u : 0u);
            } else {
                code[j] = kv_nearest(bounds, bits, u);
            }
            float c = levels[code[j]];
            cacc = __fadd_rn(cacc, __fmul_rn(c, c));
        }
        float code_sq = __shfl_sync(KV_FULL, cacc, gbase);
        if (!(ABL & KV3_NO_SUMS)) {
#pragma unroll
            for (int k = 1; k < 8; ++k)
                code_sq = __fadd_rn(code_sq, __shfl_sync(KV_FULL, cacc, gbase + k));
        }
        const double code_norm = (ABL & KV3_NO_F64) ? (double)sqrtf(code_sq) : __dsqrt_rn((double)code_sq);
        const float norm = (r > 0.0 && code_norm > 0.0)
                               ? ((ABL & KV3_NO_F64) ? (float)r / (float)code_norm
                                                     : __double2float_rn(__ddiv_rn(r, code_norm)))
                               : 0.0f;
        unsigned* row = 0;
        unsigned* norms = 0;
        int slot = 0;
        if (valid) kv_destination(p, kv, b, t, h, &row, &norms, &slot);
        unsigned char* bytes = (unsigned char*)row;
        if (bits == 8) {
            u64 g[E];
#pragma unroll
            for (int j = 0; j < E; ++j) g[j] = (u64)code[j] << (8 * l);
            kv_or_scatter<u64, E>(g, l);
#pragma unroll
            for (int m = 0; m < E / 8; ++m)
                if (valid) ((u64*)bytes)[8 * m + l] = g[8 * m];
        } else {
            unsigned g[E];
#pragma unroll
            for (int j = 0; j < E; ++j) g[j] = code[j] << (bits * l);
            kv_or_scatter<unsigned, E>(g, l);
#pragma unroll
            for (int m = 0; m < E / 8; ++m) {
                const int j = 8 * m + l;
                if (!valid) continue;
                if (bits == 4) {
                    ((unsigned*)bytes)[j] = g[8 * m];
                } else if (bits == 2) {
                    ((unsigned short*)bytes)[j] = (unsigned short)g[8 * m];
                } else {
                    bytes[3 * j] = (unsigned char)g[8 * m];
                    bytes[3 * j + 1] = (unsigned char)(g[8 * m] >> 8);
                    bytes[3 * j + 2] = (unsigned char)(g[8 * m] >> 16);
                }
            }
        }
        if (valid) {
            for (int pad = words + l; pad < row_words; pad += 8) row[pad] = 0u;
            if (l == 0) kv_store_norm(norms, slot, norm, p.norm_f16, p.flags);
        }
    }
}

extern "C" __global__ void __launch_bounds__(128, 6) kv3_encode_pred(KvEncodeParams p) {
    kv3_encode_hadamard<16, true, false, false>(p);
}
extern "C" __global__ void __launch_bounds__(128, 6) kv3_encode_pred_reg(KvEncodeParams p) {
    kv3_encode_hadamard<16, true, true, false>(p);
}
extern "C" __global__ void __launch_bounds__(128, 5) kv3_encode_pred_reg_next(KvEncodeParams p) {
    kv3_encode_hadamard<16, true, true, true>(p);
}
extern "C" __global__ void __launch_bounds__(128, 7) kv3_encode_reg(KvEncodeParams p) {
    kv3_encode_hadamard<16, false, true, false>(p);
}
extern "C" __global__ void __launch_bounds__(128, 6) kv3_encode_pred_grid(KvEncodeParams p) {
    kv3_encode_hadamard<16, true, true, false, true>(p);
}
extern "C" __global__ void __launch_bounds__(128, 6) kv3_abl_f64(KvEncodeParams p) {
    kv3_encode_hadamard<16, true, true, false, true, KV3_NO_F64>(p);
}
extern "C" __global__ void __launch_bounds__(128, 6) kv3_abl_lanes(KvEncodeParams p) {
    kv3_encode_hadamard<16, true, true, false, true, KV3_NO_LANES>(p);
}
extern "C" __global__ void __launch_bounds__(128, 6) kv3_abl_search(KvEncodeParams p) {
    kv3_encode_hadamard<16, true, true, false, true, KV3_NO_SEARCH>(p);
}
extern "C" __global__ void __launch_bounds__(128, 6) kv3_abl_sums(KvEncodeParams p) {
    kv3_encode_hadamard<16, true, true, false, true, KV3_NO_SUMS>(p);
}
extern "C" __global__ void __launch_bounds__(128, 6) kv3_abl_all(KvEncodeParams p) {
    kv3_encode_hadamard<16, true, true, false, true,
                        KV3_NO_F64 | KV3_NO_LANES | KV3_NO_SEARCH | KV3_NO_SUMS>(p);
}
extern "C" __global__ void __launch_bounds__(128, 6) kv3_abl_move(KvEncodeParams p) {
    kv3_encode_hadamard<16, true, true, false, true, KV3_MOVE>(p);
}

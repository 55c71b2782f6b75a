// Compressed-KV encode: new keys and values appended into the paged cache through the block
// table (layout: deltakv_contract::kv::paged), codes and norms bit for bit those of the CPU
// codec (deltakv_contract::kv::codec::Quantizer::encode):
//
//   r = |x|   (f32 squares in 8 partial sums, acc[i % 8] in index order, then acc0 + .. + acc7;
//              when that overflows or underflows below 1e-30: the f64 sum in index order)
//   y = Pi x  (Hadamard: x * s, the butterflies h = 1, 2, 4, ... each one f32 add or subtract,
//              then * (1 / sqrt(d)) as f32; dense: 16 partial sums per row, as `dot_lanes`)
//   u = y * (float)(1 / r),  idx = #{boundaries < u},  packed LSB first
//   norm = (float)(r / sqrt((double) sum_squares(levels[idx])))      (0 for a zero vector)
//
// Every product and sum is an explicit round-to-nearest intrinsic, so the compiler cannot
// contract a multiply and an add into an FMA the CPU does not do. A flag word reports a
// non-finite input (bit 0) or a norm beyond its storage (bit 1); the host refuses the append.

#define KV_FULL 0xffffffffu
#define KV_ENC_WARPS 4

struct KvEncodeParams {
    const void* k;           // [B, Tn, Hkv, d]
    const void* v;
    unsigned* pool;          // [num_pages, page_words]
    const int* block_table;  // [B, max_pages]
    const int* seq_lens;     // [B] tokens held before this append
    const int* new_lens;     // [B] tokens appended (each <= Tn)
    const float* consts;     // see KV_C_* below
    int* flags;
    int batch, tokens, kv_heads, dim, in_dtype, norm_f16;
    int bits_k, bits_v, words_k, words_v;
    int page_tokens, max_pages, page_words, head_words, row_words_k, row_words_v, norm_words;
    float hadamard_norm;     // 1 / sqrt(d) as the CPU computes it (f32 sqrt, f32 divide)
    int grid;                // offset (floats) of the K and V nearest-level grids in consts
    unsigned heads_magic, tokens_magic;  // n / kv_heads, n / tokens as `kv_divide` takes them
    int heads_shift, tokens_shift;
    int page_shift;          // log2(page_tokens)
    int first_stream;        // the one-lane kernels' stream is first_stream + blockIdx.y
    unsigned signs[128];     // the Hadamard signs for d <= 128, read by the one-lane kernels
                             // (kv_encode_lanes.cu): f32 inputs a sign bit (0 or 0x80000000)
                             // per element, 16-bit inputs one word per element pair (bit 15
                             // the even element's sign, bit 31 the odd one's)
};

// n / d for n < 2^31 by a multiply and a shift (Granlund-Montgomery): with l = ceil(log2 d) and
// magic = floor(2^32 (2^l - d) / d) + 1 (the host computes both), n / d = (mulhi(n, magic) + n)
// >> l; the sum stays below 2^32 because n < 2^31.
__device__ __forceinline__ unsigned kv_divide(unsigned n, unsigned magic, int shift) {
    return (__umulhi(n, magic) + n) >> shift;
}

// Offsets (in floats) into `consts`: levels and boundaries of K and V (256 each, boundaries
// padded with +inf), then the Hadamard signs (d) or the dense matrix transposed (d x d).
#define KV_C_LEVELS_K 0
#define KV_C_BOUNDS_K 256
#define KV_C_LEVELS_V 512
#define KV_C_BOUNDS_V 768
#define KV_C_ROTATION 1024

__device__ __forceinline__ bool kv_finite(float x) {
    return (__float_as_uint(x) & 0x7f800000u) != 0x7f800000u;
}

// Index of the nearest level: the number of boundaries below u (sorted, so a binary search).
__device__ __forceinline__ unsigned kv_nearest(const float* bounds, int bits, float u) {
    unsigned idx = 0;
    for (unsigned step = 1u << (bits - 1); step > 0; step >>= 1) {
        if (u > bounds[idx + step - 1]) idx += step;
    }
    return idx;
}

// The same index from a uniform grid over the boundaries (one shared load instead of `bits`).
// Cell g(u) = floor(63 sat(fma(u, scale, offset))), `sat` clamping to [0, 1] (NaN to 0) and
// the fma rounded to nearest once, as the host's `f32::mul_add` rounds it, is monotone in u, so
// a boundary in a lower cell is below u and one in a higher cell above it; the host picks scale
// and offset so that no cell holds two boundaries and stores per cell the count of boundaries
// in lower cells (its integer bits), the cell's own boundary or +inf, and the CPU's rounded
// squares of the levels at that count and the next: idx = count + (u > boundary), exactly the
// search's answer, and its squared level one select away. Layout in consts (per stream, from a
// multiple of four floats): scale, offset, enabled (0: search instead), 0, then the cells, four
// floats each. Two fmas and no clamp: the saturated t is in [0, 1], and 63 t + 2^23 rounded
// toward zero is 2^23 + floor(63 t), an f32 whose low bits are the cell.
#define KV_GRID_CELLS 64
#define KV_GRID_FLOATS (4 + 4 * KV_GRID_CELLS)

// The grid cell of u (above) as its f32 bits: 0x4b000000 + the cell, in [0, KV_GRID_CELLS - 1].
__device__ __forceinline__ unsigned kv_grid_cell_bits(float u, float scale, float offset) {
    const float t = __saturatef(__fmaf_rn(u, scale, offset));
    return __float_as_uint(__fmaf_rz(t, (float)(KV_GRID_CELLS - 1), 8388608.0f));
}

// The grid cell of u itself (the eight-lane kernel indexes `cells` with it).
__device__ __forceinline__ unsigned kv_grid_cell(float u, float scale, float offset) {
    return kv_grid_cell_bits(u, scale, offset) - 0x4b000000u;
}

// Copies a stream's grid cells into shared memory (the caller synchronises the block): eight
// copies, cell g's copy c at [8 g + c], so lane l reading copy l % 8, the eight lanes of a
// quarter-warp's 16-byte loads always hit eight distinct groups of four banks (one copy: random
// cells collide, and those conflicts made the L1 data pipe the bound). Plain loads, which hit L1
// after an SM's first block: `cp.async.cg` (L2 only) queued every block of a launch on the same
// few L2 lines, and `cp.async.ca` ran the eight-lane kernel slower.
__device__ __forceinline__ void kv_copy_grid_cells(const float* grid, float4* cells) {
    const float4* src = (const float4*)(grid + 4);
    for (int i = threadIdx.x; i < KV_GRID_CELLS * 8; i += blockDim.x) cells[i] = __ldg(src + i / 8);
}

// Stores the stored norm of a vector (f32, or f16 in its half of a word).
__device__ __forceinline__ void kv_store_norm(unsigned* section, int slot, float norm, int f16,
                                              int* flags) {
    if (f16) {
        unsigned short h = f32_to_f16(norm);
        if ((h & 0x7c00u) == 0x7c00u) atomicOr(flags, 2);
        ((unsigned short*)section)[slot] = h;
    } else {
        if (!kv_finite(norm)) atomicOr(flags, 2);
        section[slot] = __float_as_uint(norm);
    }
}

// The page and slot that token t of sequence b lands in (two dependent loads: the length,
// then the block table).
__device__ __forceinline__ void kv_page_slot(const KvEncodeParams& p, int b, int t, int* page,
                                             int* slot) {
    const int at = __ldg(p.seq_lens + b) + t;
    *page = __ldg(p.block_table + (long long)b * p.max_pages + (at >> p.page_shift));
    *slot = at & (p.page_tokens - 1);
}

// The row's first word and the norm section of KV head h of stream `kv` in `page` at `slot`.
__device__ __forceinline__ void kv_row_in_page(const KvEncodeParams& p, int kv, long long page,
                                               int h, int slot, unsigned** row,
                                               unsigned** norms) {
    unsigned* head = p.pool + page * p.page_words + (long long)h * p.head_words;
    int kcodes = p.page_tokens * p.row_words_k;
    int vcodes = p.page_tokens * p.row_words_v;
    if (kv == 0) {
        *row = head + (long long)slot * p.row_words_k;
        *norms = head + kcodes + vcodes;
    } else {
        *row = head + kcodes + (long long)slot * p.row_words_v;
        *norms = head + kcodes + vcodes + p.norm_words;
    }
}

// The destination of vector (b, t, h) of stream `kv`: the row's first word and the norm
// section, in the pool.
__device__ __forceinline__ void kv_destination(const KvEncodeParams& p, int kv, int b, int t,
                                               int h, unsigned** row, unsigned** norms,
                                               int* slot) {
    int page;
    kv_page_slot(p, b, t, &page, slot);
    kv_row_in_page(p, kv, page, h, *slot, row, norms);
}

// Sequence b and token t of vector `vec` (vectors ordered [B, Tn, Hkv]); returns b Tn + t, from
// which the head is vec - (b Tn + t) Hkv.
__device__ __forceinline__ unsigned kv_vector_token(const KvEncodeParams& p, unsigned vec,
                                                    unsigned* b, unsigned* t) {
    const unsigned bt = kv_divide(vec, p.heads_magic, p.heads_shift);
    *b = kv_divide(bt, p.tokens_magic, p.tokens_shift);
    *t = bt - *b * (unsigned)p.tokens;
    return bt;
}

// OR reduce-scatter over the 8 lanes of a vector: lane l starts with v[j] (its code of group
// j, shifted into place) and ends with v[8m] = the whole group 8m + l. Each step pairs slots j
// and j + off, keeps the one whose bit `off` matches the lane's, and ORs in the partner's.
template <typename T, int E>
__device__ __forceinline__ void kv_or_scatter(T (&v)[E], int l) {
#pragma unroll
    for (int off = 4; off >= 1; off >>= 1) {
        const bool up = (l & off) != 0;
#pragma unroll
        for (int j = 0; j < E; ++j) {
            if ((j & (7 & ~(off - 1))) == 0) {
                const T lo = v[j], hi = v[j + off];
                v[j] = (up ? hi : lo) | __shfl_xor_sync(KV_FULL, up ? lo : hi, off);
            }
        }
    }
}

// One element of the input, widened to f32 with its Hadamard sign applied: `sign_bit` is
// 0x80000000 for -1 (x * -1 is exact, so flipping the sign bit is the CPU's product). For bf16
// the widening and the flip are one multiply-add: (raw << 16) + 2^31 flips bit 31.
template <int DT>
__device__ __forceinline__ float kv_signed_input(unsigned raw, unsigned sign_bit) {
    if (DT == DT_BF16) return __uint_as_float(raw * 65536u + sign_bit);
    if (DT == DT_F16) return __uint_as_float(__float_as_uint(f16_to_f32((unsigned short)raw)) ^ sign_bit);
    return __uint_as_float(raw ^ sign_bit);
}

// The sum acc_0 + acc_1 + .. + acc_7 over the 8 lanes of a vector, in that order (every lane
// of the vector gets it).
__device__ __forceinline__ float kv_ordered_sum8(float acc, int gbase) {
    float sum = __shfl_sync(KV_FULL, acc, gbase);
#pragma unroll
    for (int k = 1; k < 8; ++k) sum = __fadd_rn(sum, __shfl_sync(KV_FULL, acc, gbase + k));
    return sum;
}

// Hadamard d = 8 * E: eight lanes per vector, four vectors per warp. Lane l of a vector holds
// elements i = 8 j + l (j < E): exactly the elements of the CPU's partial sum acc[l], and
// the butterflies h < 8 are lane exchanges, h >= 8 register pairs. DT is the input dtype.
//
// Bound by instruction issue and by the L1 data pipe (the shuffles and the table loads), so the
// common path does the least per element: 32-bit index arithmetic, the finiteness check only
// when the squared norm is not finite, the sign folded into the widening, and the nearest level
// with its squared level from one 16-byte cell of the grid (count, boundary, level(count)^2,
// level(count + 1)^2: the CPU's rounded squares), read conflict-free from the lane's own copy.
template <int E, int DT>
__device__ __forceinline__ void kv_encode_hadamard(const KvEncodeParams& p, float* bounds,
                                                   float* level_sq, float4* cells) {
    const int kv = blockIdx.y;
    const int bits = kv == 0 ? p.bits_k : p.bits_v;
    const int words = kv == 0 ? p.words_k : p.words_v;
    const int row_words = kv == 0 ? p.row_words_k : p.row_words_v;
    const float* src_levels = p.consts + (kv == 0 ? KV_C_LEVELS_K : KV_C_LEVELS_V);
    const float* src_bounds = p.consts + (kv == 0 ? KV_C_BOUNDS_K : KV_C_BOUNDS_V);
    const float* grid = p.consts + p.grid + kv * KV_GRID_FLOATS;
    const float grid_scale = grid[0], grid_offset = grid[1];
    const bool use_grid = grid[2] != 0.0f;
    if (!use_grid) {  // the binary search's boundaries and squared levels
        for (int i = threadIdx.x; i < 256; i += blockDim.x) {
            const float c = src_levels[i];
            level_sq[i] = __fmul_rn(c, c);
            bounds[i] = src_bounds[i];
        }
    } else {
        kv_copy_grid_cells(grid, cells);
    }
    __syncthreads();
    const void* src = kv == 0 ? p.k : p.v;
    const int lane = threadIdx.x & 31, l = lane & 7, gbase = lane & 24;
    // The sign bit of element 8 j + l's Hadamard sign (+-1.0f): taken from the float's bits, not
    // chosen by a compare, so the compiler keeps one word per element for the one-instruction
    // widening instead of rebuilding it from predicates per element.
    unsigned sign_bit[E];
#pragma unroll
    for (int j = 0; j < E; ++j)
        sign_bit[j] = __float_as_uint(__ldg(p.consts + KV_C_ROTATION + 8 * j + l)) & 0x80000000u;
    // The host keeps 4 x (vectors + warps) below 2^31.
    const unsigned total = (unsigned)p.batch * p.tokens * p.kv_heads;
    const unsigned warps = gridDim.x * KV_ENC_WARPS;
    // Every lane of a warp runs every iteration (the shuffles need the whole warp); a lane
    // whose vector does not exist computes on zeros and stores nothing.
    for (unsigned w = blockIdx.x * KV_ENC_WARPS + (threadIdx.x >> 5); w * 4 < total; w += warps) {
        const unsigned vec = w * 4 + (lane >> 3);
        bool valid = vec < total;
        unsigned b = 0, t = 0, h = 0;
        if (valid) {
            h = vec - kv_vector_token(p, vec, &b, &t) * (unsigned)p.kv_heads;
            valid = (int)t < __ldg(p.new_lens + b);
        }
        float x[E];
        float acc = 0.0f;
        if (DT == DT_F32) {
            const unsigned* in = (const unsigned*)src + (size_t)vec * (E * 8) + l;
#pragma unroll
            for (int j = 0; j < E; ++j)
                x[j] = kv_signed_input<DT>(valid ? __ldg(in + 8 * j) : 0u, sign_bit[j]);
        } else {
            const unsigned short* in = (const unsigned short*)src + (size_t)vec * (E * 8) + l;
#pragma unroll
            for (int j = 0; j < E; ++j)
                x[j] = kv_signed_input<DT>(valid ? (unsigned)__ldg(in + 8 * j) : 0u, sign_bit[j]);
        }
#pragma unroll
        for (int j = 0; j < E; ++j) acc = __fadd_rn(acc, __fmul_rn(x[j], x[j]));
        const float fast = kv_ordered_sum8(acc, gbase);
        // A non-finite element makes `fast` non-finite (the squares are >= 0), so the elements
        // are checked only then.
        const bool slow = !(kv_finite(fast) && fast >= 1e-30f);
        double r = __dsqrt_rn((double)fast);
        if (__any_sync(KV_FULL, slow && valid)) {
            bool bad = false;
            double s = 0.0;
#pragma unroll
            for (int j = 0; j < E; ++j) {
                bad |= !kv_finite(x[j]);
#pragma unroll
                for (int k = 0; k < 8; ++k) {
                    double e = (double)__shfl_sync(KV_FULL, x[j], gbase + k);
                    s = __dadd_rn(s, __dmul_rn(e, e));
                }
            }
            if (bad && valid) atomicOr(p.flags, 1);
            if (slow) r = __dsqrt_rn(s);
        }
        // y = H diag(s) x / sqrt(d), butterflies in the CPU's order. Lane exchanges: the lower
        // lane of a pair keeps x + other, the upper other - x, both as one fma with +-1 (exact
        // product, one rounding: the CPU's add or subtract).
#pragma unroll
        for (int hb = 1; hb < 8; hb <<= 1) {
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
        const float inv = r > 0.0 ? __double2float_rn(__ddiv_rn(1.0, r)) : 0.0f;
        unsigned code[E];
        float cacc = 0.0f;
        if (use_grid) {
#pragma unroll
            for (int j = 0; j < E; ++j) {
                const float u = __fmul_rn(__fmul_rn(x[j], p.hadamard_norm), inv);
                const unsigned g = kv_grid_cell(u, grid_scale, grid_offset);
                const float4 cell = cells[8 * g + l];
                const bool above = u > cell.y;
                code[j] = __float_as_uint(cell.x) + (above ? 1u : 0u);
                cacc = __fadd_rn(cacc, above ? cell.w : cell.z);
            }
        } else {
#pragma unroll
            for (int j = 0; j < E; ++j) {
                const float u = __fmul_rn(__fmul_rn(x[j], p.hadamard_norm), inv);
                code[j] = kv_nearest(bounds, bits, u);
                cacc = __fadd_rn(cacc, level_sq[code[j]]);
            }
        }
        const float code_sq = kv_ordered_sum8(cacc, gbase);
        const double code_norm = __dsqrt_rn((double)code_sq);
        const float norm =
            (r > 0.0 && code_norm > 0.0) ? __double2float_rn(__ddiv_rn(r, code_norm)) : 0.0f;
        unsigned* row = 0;
        unsigned* norms = 0;
        int slot = 0;
        if (valid) kv_destination(p, kv, (int)b, (int)t, (int)h, &row, &norms, &slot);
        // Group j (codes 8j .. 8j+7, one per lane) is 8 * bits bits starting at byte j * bits;
        // lane l gathers groups l, l + 8, .. by an OR reduce-scatter and stores them.
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

// The kernel for d = 8 E and one input dtype: the tables in shared memory, then the body. One
// kernel per dtype: a kernel holding all three bodies spills at these register bounds.
template <int E, int DT>
__device__ __forceinline__ void kv_encode_hadamard_kernel(const KvEncodeParams& p) {
    __shared__ float bounds[256];
    __shared__ float level_sq[256];
    __shared__ float4 cells[KV_GRID_CELLS * 8];
    kv_encode_hadamard<E, DT>(p, bounds, level_sq, cells);
}

// As many warps as fit without spills (long chains of ordered sums per vector), per dtype (f16
// widens through a conversion and takes the most registers).
#define KV_ENCODE_HADAMARD(D, BLOCKS_F32, BLOCKS_F16, BLOCKS_BF16)                             \
    extern "C" __global__ void __launch_bounds__(128, BLOCKS_F32)                              \
        kv_encode_hadamard##D##_f32(KvEncodeParams p) {                                        \
        kv_encode_hadamard_kernel<D / 8, DT_F32>(p);                                           \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(128, BLOCKS_F16)                              \
        kv_encode_hadamard##D##_f16(KvEncodeParams p) {                                        \
        kv_encode_hadamard_kernel<D / 8, DT_F16>(p);                                           \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(128, BLOCKS_BF16)                             \
        kv_encode_hadamard##D##_bf16(KvEncodeParams p) {                                       \
        kv_encode_hadamard_kernel<D / 8, DT_BF16>(p);                                          \
    }
KV_ENCODE_HADAMARD(64, 8, 8, 8)
KV_ENCODE_HADAMARD(128, 7, 6, 7)
KV_ENCODE_HADAMARD(256, 1, 1, 1)

// Any d (the dense rotation): one warp per vector, the vector staged in shared memory, each
// sum in the CPU's order by the lanes that own it.
extern "C" __global__ void __launch_bounds__(128) kv_encode_dense(KvEncodeParams p) {
    __shared__ float levels[256];
    __shared__ float bounds[256];
    __shared__ float xs[KV_ENC_WARPS][256];
    __shared__ unsigned char cs[KV_ENC_WARPS][256];
    const int kv = blockIdx.y;
    const int bits = kv == 0 ? p.bits_k : p.bits_v;
    const int words = kv == 0 ? p.words_k : p.words_v;
    const int row_words = kv == 0 ? p.row_words_k : p.row_words_v;
    const float* src_levels = p.consts + (kv == 0 ? KV_C_LEVELS_K : KV_C_LEVELS_V);
    const float* src_bounds = p.consts + (kv == 0 ? KV_C_BOUNDS_K : KV_C_BOUNDS_V);
    const float* matrix_t = p.consts + KV_C_ROTATION;  // [c][i] = M[i][c]
    for (int i = threadIdx.x; i < 256; i += blockDim.x) {
        levels[i] = src_levels[i];
        bounds[i] = src_bounds[i];
    }
    __syncthreads();
    const void* src = kv == 0 ? p.k : p.v;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, d = p.dim;
    float* x = xs[warp];
    unsigned char* codes = cs[warp];
    const long long total = (long long)p.batch * p.tokens * p.kv_heads;
    for (long long vec = (long long)blockIdx.x * KV_ENC_WARPS + warp; vec < total;
         vec += (long long)gridDim.x * KV_ENC_WARPS) {
        const int h = (int)(vec % p.kv_heads);
        const long long bt = vec / p.kv_heads;
        const int t = (int)(bt % p.tokens), b = (int)(bt / p.tokens);
        if (t >= p.new_lens[b]) continue;  // uniform over the warp
        bool bad = false;
        for (int i = lane; i < d; i += 32) {
            x[i] = load_float(src, vec * d + i, p.in_dtype);
            bad |= !kv_finite(x[i]);
        }
        if (bad) atomicOr(p.flags, 1);
        __syncwarp();
        // |x|: acc[l] over indices 8j + l, then the tail d - d % 8 .. d.
        float acc = 0.0f;
        if (lane < 8) {
            for (int j = 0; j < d / 8; ++j) {
                float e = x[8 * j + lane];
                acc = __fadd_rn(acc, __fmul_rn(e, e));
            }
        }
        float fast = __shfl_sync(KV_FULL, acc, 0);
        for (int k = 1; k < 8; ++k) fast = __fadd_rn(fast, __shfl_sync(KV_FULL, acc, k));
        float tail = 0.0f;
        for (int i = d / 8 * 8; i < d; ++i) tail = __fadd_rn(tail, __fmul_rn(x[i], x[i]));
        fast = __fadd_rn(fast, tail);
        double r;
        if (kv_finite(fast) && fast >= 1e-30f) {
            r = __dsqrt_rn((double)fast);
        } else {
            double s = 0.0;
            for (int i = 0; i < d; ++i) {
                double e = (double)x[i];
                s = __dadd_rn(s, __dmul_rn(e, e));
            }
            r = __dsqrt_rn(s);
        }
        const float inv = r > 0.0 ? __double2float_rn(__ddiv_rn(1.0, r)) : 0.0f;
        // y_i = M[i] . x with sixteen partial sums, then the tail (as `dot_lanes`).
        for (int i = lane; i < d; i += 32) {
            float part[16];
#pragma unroll
            for (int k = 0; k < 16; ++k) part[k] = 0.0f;
            for (int j = 0; j < d / 16; ++j) {
#pragma unroll
                for (int k = 0; k < 16; ++k) {
                    int c = 16 * j + k;
                    part[k] = __fadd_rn(part[k], __fmul_rn(matrix_t[(long long)c * d + i], x[c]));
                }
            }
            float tl = 0.0f;
            for (int c = d / 16 * 16; c < d; ++c)
                tl = __fadd_rn(tl, __fmul_rn(matrix_t[(long long)c * d + i], x[c]));
            float y = part[0];
#pragma unroll
            for (int k = 1; k < 16; ++k) y = __fadd_rn(y, part[k]);
            y = __fadd_rn(y, tl);
            codes[i] = (unsigned char)kv_nearest(bounds, bits, __fmul_rn(y, inv));
        }
        __syncwarp();
        float cacc = 0.0f;
        if (lane < 8) {
            for (int j = 0; j < d / 8; ++j) {
                float c = levels[codes[8 * j + lane]];
                cacc = __fadd_rn(cacc, __fmul_rn(c, c));
            }
        }
        float code_sq = __shfl_sync(KV_FULL, cacc, 0);
        for (int k = 1; k < 8; ++k) code_sq = __fadd_rn(code_sq, __shfl_sync(KV_FULL, cacc, k));
        float ctail = 0.0f;
        for (int i = d / 8 * 8; i < d; ++i) {
            float c = levels[codes[i]];
            ctail = __fadd_rn(ctail, __fmul_rn(c, c));
        }
        code_sq = __fadd_rn(code_sq, ctail);
        const double code_norm = __dsqrt_rn((double)code_sq);
        const float norm =
            (r > 0.0 && code_norm > 0.0) ? __double2float_rn(__ddiv_rn(r, code_norm)) : 0.0f;
        unsigned* row;
        unsigned* norms;
        int slot;
        kv_destination(p, kv, b, t, h, &row, &norms, &slot);
        // Word w holds the bits 32w .. 32w + 31 of the LSB-first stream.
        for (int w = lane; w < row_words; w += 32) {
            unsigned word = 0u;
            if (w < words) {
                int first = 32 * w / bits, last = min((32 * w + 31) / bits, d - 1);
                for (int i = first; i <= last; ++i) {
                    int shift = i * bits - 32 * w;
                    unsigned c = codes[i];
                    word |= shift >= 0 ? c << shift : c >> (-shift);
                }
            }
            row[w] = word;
        }
        if (lane == 0) kv_store_norm(norms, slot, norm, p.norm_f16, p.flags);
        __syncwarp();
    }
}

// After an append: seq_lens[b] += new_lens[b].
extern "C" __global__ void kv_advance_lens(int* seq_lens, const int* new_lens, int batch) {
    int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b < batch) seq_lens[b] += new_lens[b];
}

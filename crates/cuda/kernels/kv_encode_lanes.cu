// Compressed-KV encode with one lane per vector (d = 64 or 128, the Hadamard rotation, both
// streams' nearest levels from their grids, 16-byte-aligned inputs): each thread encodes whole
// vectors, so the CPU's eight partial sums, the butterflies and the packing all run in the
// lane's registers without lane exchanges, and the per-vector steps (f64 roots and divisions,
// the destination, the norm) are one lane's work instead of eight lanes'. The math and its
// rounding are kv_encode.cu's (the header comment there); this file follows it step for step.
//
// The Hadamard signs come as sign bits in the parameters (`signs`: a word per element of f32
// inputs, a word per element pair of 16-bit inputs), so one XOR signs a whole input word.
// Codes are packed first as bytes (element i in byte i % 4 of word i / 4), then into the
// stream's bit width.

// Words of one input vector (16-byte loads).
template <int D, int DT>
struct KvLaneRaw {
    static constexpr int N = DT == DT_F32 ? D / 4 : D / 8;
    uint4 w[N];
};

// Loads the chunk's vector `vec` of stream `src`.
template <int D, int DT>
__device__ __forceinline__ void kv_lane_fetch(const void* src, unsigned vec, KvLaneRaw<D, DT>& raw) {
    const uint4* in = (const uint4*)src + (size_t)vec * KvLaneRaw<D, DT>::N;
#pragma unroll
    for (int c = 0; c < KvLaneRaw<D, DT>::N; ++c) raw.w[c] = __ldg(in + c);
}

// 16-bit inputs reach the lanes through shared memory: the warp copies its 32 vectors (one
// contiguous range) by `cp.async` with consecutive lanes on consecutive 16-byte chunks, so each
// copy instruction moves whole lines, where lane-per-vector loads touched 32 lines per
// instruction. Vector v's chunk c lands at v N + (c ^ (v % 8)) of the warp's region, so the
// eight lanes of a quarter-warp reading the same chunk of their own vectors hit distinct banks.
template <int D, int DT>
__device__ __forceinline__ void kv_lane_stage_warp(const void* src, unsigned base, unsigned total,
                                                   uint4* region) {
    constexpr int N = KvLaneRaw<D, DT>::N;
    const unsigned lane = threadIdx.x & 31;
    const uint4* in = (const uint4*)src + (size_t)base * N;
#pragma unroll
    for (int k = 0; k < N; ++k) {
        const unsigned g = lane + 32 * k, v = g / N, c = g % N;
        if (base + v < total) cp_async16(region + v * N + (c ^ (v & 7)), in + g);
    }
    cp_async_commit();
}

template <int D, int DT>
__device__ __forceinline__ void kv_lane_unstage(const uint4* region, KvLaneRaw<D, DT>& raw) {
    constexpr int N = KvLaneRaw<D, DT>::N;
    const unsigned lane = threadIdx.x & 31;
    // The region is 128-byte aligned and a lane's vector a multiple of 128 bytes, so chunk c's
    // byte address is the lane's chunk (lane % 8) XOR (c % 8) 16, plus 128 (c / 8): one XOR
    // per chunk, the rest a load's constant offset.
    const unsigned own = (unsigned)__cvta_generic_to_shared(region + lane * N + (lane & 7));
#pragma unroll
    for (int c = 0; c < N; ++c) {
        const unsigned at = (own ^ (16u * (c % 8))) + 128u * (c / 8);
        asm("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
            : "=r"(raw.w[c].x), "=r"(raw.w[c].y), "=r"(raw.w[c].z), "=r"(raw.w[c].w)
            : "r"(at));
    }
}

// The loaded vector widened to f32 with its Hadamard signs applied.
template <int D, int DT>
__device__ __forceinline__ void kv_lane_widen(const KvEncodeParams& p, const KvLaneRaw<D, DT>& raw,
                                              float (&x)[D]) {
#pragma unroll
    for (int c = 0; c < KvLaneRaw<D, DT>::N; ++c) {
        const unsigned w[4] = {raw.w[c].x, raw.w[c].y, raw.w[c].z, raw.w[c].w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            if (DT == DT_F32) {
                x[4 * c + k] = __uint_as_float(w[k] ^ p.signs[4 * c + k]);
                continue;
            }
            // Both elements' signs flipped by one XOR with the pair's sign word.
            const int i = 8 * c + 2 * k;
            const unsigned signed_pair = w[k] ^ p.signs[i / 2];
            if (DT == DT_BF16) {
                // Each half moved into the upper half by a byte permute, which the compiler
                // cannot take apart: with a shift and a mask it keeps the packed words live and
                // widens them again at each use (the 2-bit kernel at bf16: 226 registers
                // against 168).
                unsigned lower, upper;
                asm("prmt.b32 %0, %2, 0, 0x1044;\n\tprmt.b32 %1, %2, 0, 0x3244;"
                    : "=r"(lower), "=r"(upper)
                    : "r"(signed_pair));
                x[i] = __uint_as_float(lower);
                x[i + 1] = __uint_as_float(upper);
            } else {
                x[i] = f16_to_f32((unsigned short)(signed_pair & 0xffffu));
                x[i + 1] = f16_to_f32((unsigned short)(signed_pair >> 16));
            }
        }
    }
}

// Stores `N` words of a row, 16 or 8 bytes at a time where the row's address allows.
template <int N>
__device__ __forceinline__ void kv_lane_store_words(unsigned* row, const unsigned (&w)[N]) {
    const unsigned long long at = (unsigned long long)row;
    if (N % 4 == 0 && (at & 15) == 0) {
#pragma unroll
        for (int c = 0; c < N / 4; ++c)
            ((uint4*)row)[c] = make_uint4(w[4 * c], w[4 * c + 1], w[4 * c + 2], w[4 * c + 3]);
    } else if (N % 2 == 0 && (at & 7) == 0) {
#pragma unroll
        for (int c = 0; c < N / 2; ++c) ((uint2*)row)[c] = make_uint2(w[2 * c], w[2 * c + 1]);
    } else {
#pragma unroll
        for (int c = 0; c < N; ++c) row[c] = w[c];
    }
}

// The byte-packed codes (`cb`, code i in byte i % 4 of word i / 4) stored LSB first at `bits`
// (2, 3 or 4) per code.
template <int D>
__device__ __forceinline__ void kv_lane_store_codes(unsigned* row, const unsigned (&cb)[D / 4],
                                                    int bits) {
    if (bits == 4) {
        // Per byte word: a | a >> 4 puts codes 0, 1 in byte 0 and 2, 3 in byte 2.
        unsigned w[D / 8];
#pragma unroll
        for (int m = 0; m < D / 8; ++m) {
            const unsigned a = cb[2 * m] | (cb[2 * m] >> 4), b = cb[2 * m + 1] | (cb[2 * m + 1] >> 4);
            w[m] = __byte_perm(a, b, 0x6420);
        }
        kv_lane_store_words<D / 8>(row, w);
    } else if (bits == 2) {
        // Per byte word: t = a | a >> 6 (codes 0, 1 in byte 0; 2, 3 in byte 2), then t | t >> 12
        // gathers all four in byte 0.
        unsigned w[D / 16];
#pragma unroll
        for (int m = 0; m < D / 16; ++m) {
            unsigned q[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const unsigned t = cb[4 * m + k] | (cb[4 * m + k] >> 6);
                q[k] = t | (t >> 12);
            }
            w[m] = __byte_perm(__byte_perm(q[0], q[1], 0x0040), __byte_perm(q[2], q[3], 0x0040),
                               0x5410);
        }
        kv_lane_store_words<D / 16>(row, w);
    } else {
        unsigned w[3 * D / 32];
#pragma unroll
        for (int m = 0; m < 3 * D / 32; ++m) w[m] = 0u;
#pragma unroll
        for (int i = 0; i < D; ++i) {
            const unsigned c = (cb[i / 4] >> (8 * (i % 4))) & 0xffu;
            const int bit = 3 * i;
            w[bit / 32] |= c << (bit % 32);
            if (bit % 32 > 29) w[bit / 32 + 1] |= c >> (32 - bit % 32);
        }
        kv_lane_store_words<3 * D / 32>(row, w);
    }
}

// Whether vector `vec` is one of the append's tokens, and if so its page and slot: looked up
// before the encode so that the two dependent loads (the length, then the block table) are in
// flight through it instead of in front of the stores.
__device__ __forceinline__ bool kv_lane_destination(const KvEncodeParams& p, unsigned vec,
                                                    unsigned total, int* page, int* slot) {
    if (vec >= total) return false;
    unsigned b, t;
    kv_vector_token(p, vec, &b, &t);
    if ((int)t >= __ldg(p.new_lens + b)) return false;
    kv_page_slot(p, (int)b, (int)t, page, slot);
    return true;
}

// One lane per vector of stream first_stream + blockIdx.y (0 keys, 1 values): the whole encode
// of kv_encode.cu in the lane's registers. A stream of 2-bit codes finds its nearest levels by
// two comparisons with its three boundaries in registers (TWO_BITS, its own launch); the others
// look theirs up on the grid, `cells`, eight copies (cell g's copy c at [8 g + c]) so the lanes
// of a quarter-warp read distinct banks.
template <int D, int DT, bool TWO_BITS>
__device__ __forceinline__ void kv_encode_lane_stream(const KvEncodeParams& p, float4* cells,
                                                      uint4* stage) {
    constexpr bool STAGED = DT != DT_F32;
    // d 64 takes both streams in one launch: reading first_stream there, ptxas spilled at its
    // 168-register bound.
    const int kv = D == 128 ? p.first_stream + blockIdx.y : blockIdx.y;
    const float* grid = p.consts + p.grid + kv * KV_GRID_FLOATS;
    const void* src = kv == 0 ? p.k : p.v;
    uint4* region = stage + (threadIdx.x >> 5) * 32 * KvLaneRaw<D, DT>::N;
    // The host keeps the vectors below 2^29 and the grid at most 64 blocks per SM, so no index
    // here wraps.
    const unsigned total = (unsigned)p.batch * p.tokens * p.kv_heads;
    // Each warp takes 32 consecutive vectors per pass, lane l the vector base + l.
    unsigned base = blockIdx.x * blockDim.x + (threadIdx.x & ~31u);
    // The first pass's vectors are asked for first, then the grid's cells copied and the
    // destination looked up meanwhile; one wait and one block barrier cover them all.
    if (STAGED && base < total) kv_lane_stage_warp<D, DT>(src, base, total, region);
    if (!TWO_BITS) kv_copy_grid_cells(grid, cells);
    int page = 0, slot = 0;
    bool live = kv_lane_destination(p, base + (threadIdx.x & 31), total, &page, &slot);
    cp_async_wait<0>();
    __syncthreads();
    const float grid_scale = __ldg(grid), grid_offset = __ldg(grid + 1);
    // The lane's copy of the cells as a shared-memory address; a cell's entry is then one
    // multiply-add away (the compiler, left to index `cells`, rebuilt the copy bits per element).
    // The cell's bits from `kv_grid_cell_bits` carry 0x4b000000, taken off here (mod 2^32).
    const unsigned own_cells =
        (unsigned)__cvta_generic_to_shared(cells + (threadIdx.x & 7)) - 128u * 0x4b000000u;
    // A 2-bit stream's boundaries and its levels' rounded squares (the grid's, l * l in f32).
    float bound[3] = {}, square[4] = {};
    if (TWO_BITS) {
        const float* levels = p.consts + (kv == 0 ? KV_C_LEVELS_K : KV_C_LEVELS_V);
        const float* bounds = levels + (KV_C_BOUNDS_K - KV_C_LEVELS_K);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            if (k < 3) bound[k] = __ldg(bounds + k);
            square[k] = __fmul_rn(__ldg(levels + k), __ldg(levels + k));
        }
    }
    for (bool ready = true; base < total; base += gridDim.x * blockDim.x, ready = false) {
        const unsigned vec = base + (threadIdx.x & 31);
        if (!ready) {
            if (STAGED) {
                __syncwarp();  // the last pass's reads of the region are done
                kv_lane_stage_warp<D, DT>(src, base, total, region);
            }
            live = kv_lane_destination(p, vec, total, &page, &slot);
            if (STAGED) {
                cp_async_wait<0>();
                __syncwarp();  // every lane's copies are in
            }
        }
        if (!live) continue;
        KvLaneRaw<D, DT> raw;
        if (STAGED) {
            kv_lane_unstage<D, DT>(region, raw);
        } else {
            kv_lane_fetch<D, DT>(src, vec, raw);
        }
        float x[D];
        kv_lane_widen<D, DT>(p, raw, x);
        // |x|: the CPU's partial sums acc[i % 8] in index order, then acc0 + .. + acc7.
        float acc[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[k] = __fmul_rn(x[k], x[k]);
#pragma unroll
        for (int i = 8; i < D; ++i) acc[i % 8] = __fadd_rn(acc[i % 8], __fmul_rn(x[i], x[i]));
        float fast = acc[0];
#pragma unroll
        for (int k = 1; k < 8; ++k) fast = __fadd_rn(fast, acc[k]);
        double r = __dsqrt_rn((double)fast);
        // A non-finite element makes `fast` non-finite (the squares are >= 0).
        if (!(kv_finite(fast) && fast >= 1e-30f)) {
            bool bad = false;
            double s = 0.0;
#pragma unroll
            for (int i = 0; i < D; ++i) {
                bad |= !kv_finite(x[i]);
                const double e = (double)x[i];
                s = __dadd_rn(s, __dmul_rn(e, e));
            }
            if (bad) atomicOr(p.flags, 1);
            r = __dsqrt_rn(s);
        }
        // y = H diag(s) x: the butterflies h = 1, 2, 4, .. in the CPU's order.
#pragma unroll
        for (int hb = 1; hb < D; hb <<= 1) {
#pragma unroll
            for (int i = 0; i < D; ++i) {
                if ((i & hb) == 0) {
                    const float a = x[i], c = x[i + hb];
                    x[i] = __fadd_rn(a, c);
                    x[i + hb] = __fsub_rn(a, c);
                }
            }
        }
        const float inv = r > 0.0 ? __double2float_rn(__ddiv_rn(1.0, r)) : 0.0f;
        // Nearest levels from the grid (kv_encode.cu's `kv_encode_hadamard`), codes as bytes,
        // and the squared levels' partial sums in the CPU's order.
        unsigned cb[D / 4];
        float cacc[8];
        // Element i's scale waits for the codes of elements i - 16 .. i - 13 (their packed word
        // ORed into 1 / sqrt(d) under a mask that is zero at run time, the launch's z being 1,
        // which the compiler cannot see), so ptxas spreads the 128 lookups through the values'
        // and cells' arithmetic instead of running them as one phase whose 16-byte loads
        // saturate the shared-memory pipe (docs/cuda-kernel-log.md, KV rows 31 and 33). A lag
        // of 8 spills; 24, 32 and 64 gain less at two blocks per SM. The bf16 grid kernel at
        // d 128 runs three blocks per SM (168 registers), where ptxas spills at every lag tried
        // but 48 (KV row 37). The 2-bit kernel has no lookups to spread: no lag (KV row 38).
        constexpr int LAG = TWO_BITS ? D : D == 128 && DT == DT_BF16 ? 48 : 16;
        const unsigned zero = blockIdx.z;
#pragma unroll
        for (int i = 0; i < D; ++i) {
            const float hn = i < LAG ? p.hadamard_norm
                                     : __uint_as_float(__float_as_uint(p.hadamard_norm) |
                                                       (cb[(i - LAG) / 4] & zero));
            const float u = __fmul_rn(__fmul_rn(x[i], hn), inv);
            const unsigned byte = 8 * (i % 4);
            unsigned word = i % 4 == 0 ? 0u : cb[i / 4];
            float sq;
            if (TWO_BITS) {
                // code = 2 (u > b1) + (u > b2 or b0, the boundary on u's side): the count of
                // boundaries below u, as the search and the grid count them; each step added
                // into the code's byte under its comparison's predicate.
                asm("{\n\t.reg .pred upper, above;\n\t.reg .f32 side, sq_upper, sq_lower;\n\t"
                    "setp.gt.f32 upper, %2, %4;\n\t"
                    "selp.f32 side, %5, %3, upper;\n\t"
                    "setp.gt.f32 above, %2, side;\n\t"
                    "selp.f32 sq_upper, %9, %7, upper;\n\t"
                    "selp.f32 sq_lower, %8, %6, upper;\n\t"
                    "selp.f32 %0, sq_upper, sq_lower, above;\n\t"
                    "@upper add.u32 %1, %1, %10;\n\t"
                    "@above add.u32 %1, %1, %11;\n\t}"
                    : "=f"(sq), "+r"(word)
                    : "f"(u), "f"(bound[0]), "f"(bound[1]), "f"(bound[2]), "f"(square[0]),
                      "f"(square[1]), "f"(square[2]), "f"(square[3]), "r"(2u << byte),
                      "r"(1u << byte));
            } else {
                const unsigned g = kv_grid_cell_bits(u, grid_scale, grid_offset);
                float4 cell;
                asm("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                    : "=f"(cell.x), "=f"(cell.y), "=f"(cell.z), "=f"(cell.w)
                    : "r"(own_cells + 128 * g));
                // code = count + (u > boundary) in byte i % 4 of its word: the count shifted in,
                // then the step added under the comparison's predicate, which also picks the
                // squared level.
                word += __float_as_uint(cell.x) << byte;
                asm("{\n\t.reg .pred above;\n\tsetp.gt.f32 above, %2, %3;\n\t"
                    "selp.f32 %0, %4, %5, above;\n\t@above add.u32 %1, %1, %6;\n\t}"
                    : "=f"(sq), "+r"(word)
                    : "f"(u), "f"(cell.y), "f"(cell.w), "f"(cell.z), "r"(1u << byte));
            }
            cb[i / 4] = word;
            cacc[i % 8] = i < 8 ? sq : __fadd_rn(cacc[i % 8], sq);
        }
        float code_sq = cacc[0];
#pragma unroll
        for (int k = 1; k < 8; ++k) code_sq = __fadd_rn(code_sq, cacc[k]);
        const double code_norm = __dsqrt_rn((double)code_sq);
        const float norm =
            (r > 0.0 && code_norm > 0.0) ? __double2float_rn(__ddiv_rn(r, code_norm)) : 0.0f;
        // The head from `vec` again here (held through the body it cost a register).
        const unsigned h = vec - kv_divide(vec, p.heads_magic, p.heads_shift) * (unsigned)p.kv_heads;
        unsigned* row;
        unsigned* norms;
        kv_row_in_page(p, kv, page, (int)h, slot, &row, &norms);
        kv_lane_store_codes<D>(row, cb, kv == 0 ? p.bits_k : p.bits_v);
        const int row_words = kv == 0 ? p.row_words_k : p.row_words_v;
        for (int pad = kv == 0 ? p.words_k : p.words_v; pad < row_words; ++pad) row[pad] = 0u;
        kv_store_norm(norms, slot, norm, p.norm_f16, p.flags);
    }
}

// The two paths are separate kernels, so the blocks an SM holds at once mostly run one body
// (both in one kernel, the instruction fetch stalls doubled: docs/cuda-kernel-log.md, KV row
// 34). Where a scheme takes both, the host queues the 2-bit stream's launch as the other's
// programmatic dependent: it starts as the first launch's last blocks run. Its last block
// waits for that launch to complete before it ends, so the launch completes after the first
// one and work queued after the encode finds both streams written; the other blocks end at
// once, their places free for the blocks after them.
template <int D, int DT, bool TWO_BITS>
__device__ __forceinline__ void kv_encode_lane_kernel(const KvEncodeParams& p) {
    __shared__ float4 cells[TWO_BITS ? 1 : KV_GRID_CELLS * 8];
    __shared__ __align__(128) uint4 stage[DT == DT_F32 ? 1 : 128 * KvLaneRaw<D, DT>::N];
    // Only the grid kernel at d 128 is ever a first launch with a dependent after it.
    if (D == 128 && !TWO_BITS) asm volatile("griddepcontrol.launch_dependents;");
    kv_encode_lane_stream<D, DT, TWO_BITS>(p, cells, stage);
    if (TWO_BITS && blockIdx.x == gridDim.x - 1 && blockIdx.y == gridDim.y - 1)
        asm volatile("griddepcontrol.wait;" ::: "memory");
}

// Entry points kv_encode_lane{D}_{f32,f16,bf16}{SUFFIX}: the grid path, and with the suffix
// `_two_bits` the 2-bit path (d 128); BLOCKS per SM for f32 and f16 inputs, BLOCKS_BF16 for
// bf16.
#define KV_ENCODE_LANE(D, BLOCKS, BLOCKS_BF16, SUFFIX, TWO_BITS)                               \
    extern "C" __global__ void __launch_bounds__(128, BLOCKS) kv_encode_lane##D##_f32##SUFFIX( \
        KvEncodeParams p) {                                                                    \
        kv_encode_lane_kernel<D, DT_F32, TWO_BITS>(p);                                         \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(128, BLOCKS) kv_encode_lane##D##_f16##SUFFIX( \
        KvEncodeParams p) {                                                                    \
        kv_encode_lane_kernel<D, DT_F16, TWO_BITS>(p);                                         \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(128, BLOCKS_BF16)                             \
        kv_encode_lane##D##_bf16##SUFFIX(KvEncodeParams p) {                                   \
        kv_encode_lane_kernel<D, DT_BF16, TWO_BITS>(p);                                        \
    }
// d 128's grid kernels at 2 blocks (two warps per scheduler, ~195-200 registers) but bf16 at 3
// (168 registers, at LAG 48: KV row 37); at 3 the f16 and f32 kernels spill at every lag tried.
// The 2-bit kernels at 3 (168 registers).
KV_ENCODE_LANE(64, 3, 3, , false)
KV_ENCODE_LANE(128, 2, 3, , false)
KV_ENCODE_LANE(128, 3, 3, _two_bits, true)

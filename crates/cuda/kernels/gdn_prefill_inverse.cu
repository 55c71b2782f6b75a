// GDN chunked prefill: T = (I + A)^-1 of a chunk's strictly lower A (f32 [64][PF_LDF] in
// shared memory) for the prepare kernel (gdn_prefill_prepare.cu). The library compiles the
// prepare's module as one source, in the order gdn_prefill.cu, this file, the prepare.
//
// Blockwise: the 16 x 16 diagonal blocks T_II by forward substitution, then the blocks below
// them in two levels. Level 1, in both 32 x 32 diagonal blocks (at 0 and 32): T_21 = -T_22
// (A_21 T_11) on 16 x 16 blocks. Level 2: T_BA = -T_BB (A_BA T_AA) on the 32 x 32 blocks.
// The levels run on tensor cores (`invert_below_mma`: tf32 m16n8k8 with each operand split hi
// + lo, three products per step, ~22 bits): each warp keeps its product A T in registers and
// feeds it to the second product through shuffles, so a level needs no barrier inside.

// f32 elements per row of A and T: 68, so each tf32 A-fragment load reads 32 distinct banks
// (B-fragment loads and accumulator stores two ways).
#define PF_LDF (PF_CHUNK + 4)

// The diagonal blocks of T (and zeros above them). Column j by the four lanes of a quad:
// lane part p sums the terms m = p (mod 4) of T_ij = -sum_{m=j}^{i-1} A_im T_mj and keeps
// those T_mj in registers, the quad's sum by two shuffles. 256 threads; no barrier at the end.
__device__ __forceinline__ void invert_diagonal_blocks(const float* a_mat, float* t_mat) {
    const int j = threadIdx.x >> 2, part = threadIdx.x & 3;
    const int base = j & ~15, c = j & 15;
    float column[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < 16; ++r) {
        float sum = 0.0f;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int m = 4 * q + part;
            const float a = a_mat[(base + r) * PF_LDF + base + m];
            sum += (m >= c && m < r) ? a * column[q] : 0.0f;
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const float t = r == c ? 1.0f : (r > c ? -sum : 0.0f);
        if ((r & 3) == part) column[r >> 2] = t;
        if (part == 0) t_mat[(base + r) * PF_LDF + j] = t;
    }
    // The blocks above the diagonal blocks are zero (T is lower triangular); those below are
    // written by the levels.
    for (int r = part; r < base; r += 4) t_mat[r * PF_LDF + j] = 0.0f;
}

// The diagonal blocks of T (and zeros above them) by one thread per column, for callers with
// registers to spare (at least 16 for the column beyond the quads' form above): thread 16 b + c
// of the first two warps forward-substitutes column c of diagonal block b in registers, T_rc =
// -sum_{m<r} A_rm T_mc with T_mc = 0 above the diagonal, so each sum runs over every m < r (A
// is zero on and above its diagonal) in order of m; A's rows are read four floats at a time
// (one address for the 16 threads of a block). The other six warps write the zeros above the
// diagonal blocks. 256 threads; no barrier at the end.
__device__ __forceinline__ void invert_diagonal_columns(const float* a_mat, float* t_mat) {
    if (threadIdx.x < 64) {
        const int base = threadIdx.x & ~15, c = threadIdx.x & 15;
        const float* a_block = a_mat + base * PF_LDF + base;
        float* t_column = t_mat + base * PF_LDF + base + c;
        float t[16];
#pragma unroll
        for (int r = 0; r < 16; ++r) {
            float sum = 0.0f;
#pragma unroll
            for (int m4 = 0; m4 < r; m4 += 4) {
                const float4 a = *(const float4*)(a_block + r * PF_LDF + m4);
                sum = fmaf(a.x, t[m4], sum);
                if (m4 + 1 < r) sum = fmaf(a.y, t[m4 + 1], sum);
                if (m4 + 2 < r) sum = fmaf(a.z, t[m4 + 2], sum);
                if (m4 + 3 < r) sum = fmaf(a.w, t[m4 + 3], sum);
            }
            t[r] = r < c ? 0.0f : (r == c ? 1.0f : -sum);
            t_column[r * PF_LDF] = t[r];
        }
    } else {
        // Rows above column j's diagonal block (r < j & ~15), j from 16: consecutive threads
        // take consecutive columns.
        for (int at = threadIdx.x - 64; at < 48 * 48; at += blockDim.x - 64) {
            const int r = at / 48, j = 16 + at % 48;
            if (r < (j & ~15)) t_mat[r * PF_LDF + j] = 0.0f;
        }
    }
}

// ---------------------------------------------------------------------------------------
// tf32 tensor-core pieces. Fragments of m16n8k8 (g = lane / 4, t = lane % 4): A (16 x 8)
// a0 = (g, t), a1 = (g + 8, t), a2 = (g, t + 4), a3 = (g + 8, t + 4); B (8 x 8) b0 = (t, g),
// b1 = (t + 4, g); C (16 x 8) c0 = (g, 2t), c1 = (g, 2t + 1), c2 = (g + 8, 2t), c3 = (g + 8,
// 2t + 1).

__device__ __forceinline__ void mma_tf32_1688(float (&d)[4], const unsigned (&a)[4],
                                              const unsigned (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// x as tf32 hi + lo halves (x - hi exact in f32), each rounded to nearest (ties away) by its
// bits: half a tf32 ulp added, then the 13 low bits cleared (a carry rounds up through the
// exponent; inf stays inf). The same halves as cvt.rna.tf32.f32, which sm_90 emulates with a
// compare and a select per value for non-finite inputs; T's entries are finite where the
// product is used (non-finite inputs give non-finite halves either way).
__device__ __forceinline__ void tf32_split(float x, unsigned& hi, unsigned& lo) {
    hi = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
    lo = (__float_as_uint(x - __uint_as_float(hi)) + 0x1000u) & 0xffffe000u;
}

// d += a b in ~f32 accuracy: each operand as hi + lo tf32 halves, the products lo hi, hi lo,
// hi hi (small terms first; lo lo, ~2^-22 relative, is left out).
__device__ __forceinline__ void mma_tf32x3(float (&d)[4], const float (&a)[4], const float (&b)[2]) {
    unsigned a_hi[4], a_lo[4], b_hi[2], b_lo[2];
#pragma unroll
    for (int i = 0; i < 4; ++i) tf32_split(a[i], a_hi[i], a_lo[i]);
#pragma unroll
    for (int i = 0; i < 2; ++i) tf32_split(b[i], b_hi[i], b_lo[i]);
    mma_tf32_1688(d, a_lo, b_hi);
    mma_tf32_1688(d, a_hi, b_lo);
    mma_tf32_1688(d, a_hi, b_hi);
}

// The A operand (16 x 8 at row0, col0) of a row-major f32 matrix x with leading dimension ld.
__device__ __forceinline__ void frag_a_f32(float (&a)[4], const float* x, int ld, int row0,
                                           int col0, int lane) {
    const float* p = x + (row0 + (lane >> 2)) * ld + col0 + (lane & 3);
    a[0] = p[0];
    a[1] = p[8 * ld];
    a[2] = p[4];
    a[3] = p[8 * ld + 4];
}

// The B operand (8 x 8 at k0, n0) of a row-major f32 matrix x[k][n].
__device__ __forceinline__ void frag_b_f32(float (&b)[2], const float* x, int ld, int k0, int n0,
                                           int lane) {
    const float* p = x + (k0 + (lane & 3)) * ld + n0 + (lane >> 2);
    b[0] = p[0];
    b[1] = p[4 * ld];
}

// The B operand of rows 8 H .. 8 H + 7 of a 16 x 8 matrix the warp holds as an accumulator c:
// b0 = (8 H + t, g) sits in lane 4 t + g / 2, element 2 H + g % 2; b1 four rows further down.
template <int H>
__device__ __forceinline__ void frag_b_from_acc(float (&b)[2], const float (&c)[4], int lane) {
    const int g = lane >> 2, t = lane & 3;
    const int from = 4 * t + (g >> 1);
    const float even0 = __shfl_sync(0xffffffffu, c[2 * H], from);
    const float odd0 = __shfl_sync(0xffffffffu, c[2 * H + 1], from);
    const float even1 = __shfl_sync(0xffffffffu, c[2 * H], from + 16);
    const float odd1 = __shfl_sync(0xffffffffu, c[2 * H + 1], from + 16);
    b[0] = (g & 1) ? odd0 : even0;
    b[1] = (g & 1) ? odd1 : even1;
}

// -c (16 x 8 accumulator) into the row-major f32 x at (row0, col0).
__device__ __forceinline__ void store_negated_acc(float* x, int ld, int row0, int col0,
                                                  const float (&c)[4], int lane) {
    float* p = x + (row0 + (lane >> 2)) * ld + col0 + 2 * (lane & 3);
    p[0] = -c[0];
    p[1] = -c[1];
    p[8 * ld] = -c[2];
    p[8 * ld + 1] = -c[3];
}

// The levels on tensor cores. A is only read. Each warp owns 8 columns of one output tile and
// forms the A T product rows that tile needs itself (X = A T in registers), so the second
// product reads X through shuffles; blocks of T known to be zero (above its diagonal) are
// skipped. 8 warps; ends with a barrier.
__device__ __forceinline__ void invert_below_mma(const float* a_mat, float* t_mat) {
    constexpr int LDF = PF_LDF;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    // Level 1 on warps 0-3: block blk (rows 32 blk + 16.., columns 32 blk..), strip of 8
    // columns ns.
    if (warp < 4) {
        const int blk = warp >> 1, ns = warp & 1;
        const int r0 = 32 * blk + 16, c0 = 32 * blk;
        float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
            if (kk < ns) continue;  // T_11 rows above the strip's first column are zero
            float a[4], b[2];
            frag_a_f32(a, a_mat, LDF, r0, c0 + 8 * kk, lane);
            frag_b_f32(b, t_mat, LDF, c0 + 8 * kk, c0 + 8 * ns, lane);
            mma_tf32x3(x, a, b);
        }
        float y[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        {
            float a[4], b[2];
            frag_a_f32(a, t_mat, LDF, r0, r0, lane);
            frag_b_from_acc<0>(b, x, lane);
            mma_tf32x3(y, a, b);
            frag_a_f32(a, t_mat, LDF, r0, r0 + 8, lane);
            frag_b_from_acc<1>(b, x, lane);
            mma_tf32x3(y, a, b);
        }
        store_negated_acc(t_mat, LDF, r0, c0 + 8 * ns, y, lane);
    }
    __syncthreads();
    // Level 2 on all 8 warps: output rows 32 + 16 mt.., strip of 8 columns ns. The tile needs
    // X rows 16 kt.. for kt <= mt (T_BB is lower triangular).
    {
        const int mt = warp >> 2, ns = warp & 3;
        float y[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int kt = 0; kt < 2; ++kt) {
            if (kt > mt) continue;
            // X rows 16 kt.., then its share of the output: y += T_BB[mt][kt] X.
            float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                if (kk < ns) continue;  // T_AA rows above the strip's first column are zero
                float a[4], b[2];
                frag_a_f32(a, a_mat, LDF, 32 + 16 * kt, 8 * kk, lane);
                frag_b_f32(b, t_mat, LDF, 8 * kk, 8 * ns, lane);
                mma_tf32x3(x, a, b);
            }
            float a[4], b[2];
            frag_a_f32(a, t_mat, LDF, 32 + 16 * mt, 32 + 16 * kt, lane);
            frag_b_from_acc<0>(b, x, lane);
            mma_tf32x3(y, a, b);
            frag_a_f32(a, t_mat, LDF, 32 + 16 * mt, 32 + 16 * kt + 8, lane);
            frag_b_from_acc<1>(b, x, lane);
            mma_tf32x3(y, a, b);
        }
        store_negated_acc(t_mat, LDF, 32 + 16 * mt, 8 * ns, y, lane);
    }
    __syncthreads();
}

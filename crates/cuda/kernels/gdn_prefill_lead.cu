// GDN chunked prefill, the relay's lead walk on one warpgroup with the state in registers
// (sm_90a, K = 128; the library compiles it after gdn_prefill_state.cu, whose stage layout and
// copies it shares). The lead carries a segment's entry state to the segment's end without
// writing outputs:
//
//   V' = U - W S,   S <- exp(G_last) S + K^T diag(e) V'        (per chunk, as state_impl)
//
// computed transposed, so the state never leaves the registers: the warpgroup holds S^T (the
// tile's 64 value columns as rows, the 128 keys as columns) as the accumulators of two
// m64n64 products, and per chunk
//
//   X^T = S^T W^T          A = S^T (bf16, from the accumulators), B = W (shared memory)
//   P   = (U^T - X^T) diag(e)   element-wise, in the accumulators' layout
//   S^T <- exp(G_last) S^T + P K   A = P (bf16, from registers), B = k (shared memory)
//
// An accumulator's columns 16 s .. 16 s + 15 are, thread for thread, the A fragment of k-step
// s of the next product, so neither S nor V' is stored to shared memory, and one warpgroup
// needs no block-wide handover between the products (state_impl's two warpgroups meet at two
// barriers per chunk). W and k arrive in the walks' stage layouts (the prepare's); the
// warpgroup copies both into the core-matrix layout (`lead_cm`: 8 x 8 blocks of 128 bytes), a
// wgmma B operand K-major (W) and MN-major (k) alike.

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Elements of one 8-column block of a 64-row core-matrix matrix: its eight 8 x 8 core
// matrices (128 bytes each) and 16 bytes that put consecutive blocks on different banks.
#define LEAD_CM_BLOCK (PF_CHUNK * 8 + 8)

// Index of element (r, c) of a [64][cols] bf16 matrix in the core-matrix layout.
__device__ __forceinline__ int lead_cm(int r, int c) {
    return (c >> 3) * LEAD_CM_BLOCK + (r >> 3) * 64 + (r & 7) * 8 + (c & 7);
}

// The wgmma descriptor of the 16 x 64 operand at rows r0.., columns c0.. of a core-matrix
// matrix: the leading byte offset is the next core matrix along k, the stride byte offset the
// next along n, so k along the columns (K-major) takes a column block and a core matrix, k
// along the rows (MN-major) the reverse.
template <bool K_ALONG_COLUMNS>
__device__ __forceinline__ unsigned long long lead_desc(const unsigned short* base, int r0, int c0) {
    const unsigned address = shared_address(base + lead_cm(r0, c0));
    constexpr unsigned long long BLOCK = LEAD_CM_BLOCK * 2, CORE = 128;
    constexpr unsigned long long LEADING = K_ALONG_COLUMNS ? BLOCK : CORE;
    constexpr unsigned long long STRIDE = K_ALONG_COLUMNS ? CORE : BLOCK;
    return (unsigned long long)((address & 0x3ffffu) >> 4) | ((LEADING >> 4) << 16) | ((STRIDE >> 4) << 32);
}

// d += A (64 x 16, registers) B (16 x 64, shared memory by descriptor): TRANS_B 0 for a
// K-major B, 1 for an MN-major one. Issued by the whole warpgroup; d is valid after the wait.
template <int TRANS_B>
__device__ __forceinline__ void lead_wgmma(float (&d)[8][4], const unsigned (&a)[4], unsigned long long desc) {
    asm volatile(
        "{ .reg .pred p; setp.ne.b32 p, %37, 0; "
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
        "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %38; }"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
          "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
          "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
          "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1), "n"(TRANS_B)
        : "memory");
}

// The A fragment of k-step s (columns 16 s .. 16 s + 15) of a product whose A is the bf16 of
// the m64n64 accumulators `d`.
__device__ __forceinline__ void lead_a_from(unsigned (&a)[4], const float (&d)[8][4], int s) {
    a[0] = pack_bf16(d[2 * s][0], d[2 * s][1]);
    a[1] = pack_bf16(d[2 * s][2], d[2 * s][3]);
    a[2] = pack_bf16(d[2 * s + 1][0], d[2 * s + 1][1]);
    a[3] = pack_bf16(d[2 * s + 1][2], d[2 * s + 1][3]);
}

// Where a thread's accumulator element (n8 tile j, element e) of S^T sits: value column c of
// the tile (the row of S^T) and key (its column; half h adds 64).
__device__ __forceinline__ int lead_value_col(int warp, int lane, int e) {
    return 16 * warp + (lane >> 2) + 8 * (e >> 1);
}
__device__ __forceinline__ int lead_key(int h, int j, int lane, int e) {
    return 64 * h + 8 * j + 2 * (lane & 3) + (e & 1);
}

// Stages of lead_regs_impl: StateStage's without q (the lead writes no outputs), so four fit
// beside the core-matrix copies and the copies run three chunks ahead of the products (one
// chunk ahead left the walk waiting on its copies' latency).
#define LEAD_STAGES 4
template <int KP>
struct LeadStage {
    static constexpr int LDK = KP + PF_PAD;
    static constexpr int BYTES = PF_GATES_BYTES + 2 * (PF_CHUNK * LDK + PF_W_ELEMS(KP) + PF_U_TILE_ELEMS);
    ChunkGates* gates;
    unsigned short* k;
    unsigned short* w;
    unsigned short* u;
    __device__ LeadStage(unsigned char* base) {
        gates = (ChunkGates*)base;
        k = (unsigned short*)(base + PF_GATES_BYTES);
        w = k + PF_CHUNK * LDK;
        u = w + PF_W_ELEMS(KP);
    }
};

// Copies W of `stage` (`swizzled` rows) into `w_cm` (core-matrix layout), 16 bytes a move
// over the warpgroup; the caller fences and meets before a product reads it.
template <int KP, int THREADS>
__device__ __forceinline__ void lead_pack_w(const LeadStage<KP>& stage, unsigned short* w_cm) {
#pragma unroll
    for (int q = 0; q < PF_CHUNK * KP / 8 / THREADS; ++q) {
        const int piece = threadIdx.x + THREADS * q;
        const int i = piece / (KP / 8), c = 8 * (piece % (KP / 8));
        *(uint4*)(w_cm + lead_cm(i, c)) = *(const uint4*)(stage.w + swizzled(i, c, KP));
    }
}

// The same for k (padded rows).
template <int KP, int THREADS>
__device__ __forceinline__ void lead_pack_k(const LeadStage<KP>& stage, unsigned short* k_cm) {
    constexpr int LDK = KP + PF_PAD;
#pragma unroll
    for (int q = 0; q < PF_CHUNK * KP / 8 / THREADS; ++q) {
        const int piece = threadIdx.x + THREADS * q;
        const int i = piece / (KP / 8), c = 8 * (piece % (KP / 8));
        *(uint4*)(k_cm + lead_cm(i, c)) = *(const uint4*)(stage.k + i * LDK + c);
    }
}

// Per chunk c (stage c's W already in w_cm[c % 2]; chunk c + 3's copies issued at the top):
// X^T = S^T W^T issued; k copied into k_cm and U^T read (ldmatrix .trans) while it runs; P
// formed; S^T's update issued; then, while it runs, chunk c + 1's W copied into the other
// w_cm once its stage has landed. Two barriers a chunk: at the top (the stage of chunk c - 1,
// k_cm and the other w_cm free) and before the update (k_cm complete).
template <int KP>
__device__ void lead_regs_impl(const PrefillParams& p) {
    static_assert(KP == 128, "two m64n64 halves of S^T");
    constexpr int THREADS = 128;
    constexpr int CM_ELEMS = (KP / 8) * LEAD_CM_BLOCK;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    unsigned char* stage_base = smem_raw;
    unsigned short* w_cm = (unsigned short*)(stage_base + LEAD_STAGES * LeadStage<KP>::BYTES);  // 2 x [64][KP]
    unsigned short* k_cm = w_cm + 2 * CM_ELEMS;                                        // [64][KP]
    unsigned long long* full = (unsigned long long*)(k_cm + CM_ELEMS);                 // per stage

    // Grid (tile, head, segment), as the other walks.
    const int tile = blockIdx.x, head = blockIdx.y, segment = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int* seg = (const int*)p.segments + SEG_FIELDS * segment;
    const int seq = seg[SEG_SEQ], first_chunk = seg[SEG_FIRST_CHUNK], chunks = seg[SEG_CHUNKS];
    const int key_head = head / (p.value_heads / p.key_heads);
    const int col0 = tile * PF_TILE;
    const long long state_row = p.state_rows ? ((const long long*)p.state_rows)[seq] : (long long)seq;
    auto stage_of = [&](int ci) { return LeadStage<KP>(stage_base + (ci % LEAD_STAGES) * LeadStage<KP>::BYTES); };
    // The phase parity of chunk ci's stage barrier.
    auto parity = [](int ci) { return (unsigned)(ci / LEAD_STAGES) & 1u; };

    // S^T: keys 0..63 in state[0], 64..127 in state[1]; the entry state as load_entry_state.
    float state[2][8][4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = lead_key(h, j, lane, e), c = col0 + lead_value_col(warp, lane, e);
                float x = 0.0f;
                if (p.use_segment_states) {
                    x = ((const float*)p.segment_states)
                        [(((long long)segment * p.value_heads + head) * KP + r) * p.value_pad + c];
                } else if (p.initial_state && r < p.key_dim && c < p.value_dim) {
                    x = ((const float*)p.initial_state)
                        [((state_row * p.value_heads + head) * p.key_dim + r) * p.value_dim + c];
                }
                state[h][j][e] = x;
            }
        }
    }

    if (threadIdx.x == 0) {
        for (int s = 0; s < LEAD_STAGES; ++s) bulk_barrier_init(&full[s]);
    }
    __syncthreads();
    for (int ci = 0; ci < LEAD_STAGES - 1 && ci < chunks; ++ci) {
        issue_stage<KP, MODE_LEAD>(stage_of(ci), p, first_chunk + ci, 0, 0, head, key_head, col0, false,
                                   &full[ci]);
    }
    if (chunks > 0) {
        bulk_wait(&full[0], 0);
        lead_pack_w<KP, THREADS>(stage_of(0), w_cm);
        fence_proxy_async();
    }
    for (int ci = 0; ci < chunks; ++ci) {
        const LeadStage<KP> stage = stage_of(ci);
        const unsigned short* w_now = w_cm + (ci & 1) * CM_ELEMS;
        bulk_wait(&full[ci % LEAD_STAGES], parity(ci));
        // Every warp is done with the last chunk (its stage, k_cm and the other w_cm are free)
        // and has copied this chunk's W.
        __syncthreads();
        const int ahead = ci + LEAD_STAGES - 1;
        if (ahead < chunks) {
            issue_stage<KP, MODE_LEAD>(stage_of(ahead), p, first_chunk + ahead, 0, 0, head, key_head,
                                       col0, false, &full[ahead % LEAD_STAGES]);
        }

        // X^T = S^T W^T (K = the 128 keys, N = the chunk's 64 rows).
        float x[8][4];
#pragma unroll
        for (int j = 0; j < 8; ++j) x[j][0] = x[j][1] = x[j][2] = x[j][3] = 0.0f;
        unsigned a[8][4];
#pragma unroll
        for (int s = 0; s < 8; ++s) lead_a_from(a[s], state[s >> 2], s & 3);
        wg_fence(x);
        wg_fence(a);
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < 8; ++s) lead_wgmma<0>(x, a[s], lead_desc<true>(w_now, 0, 16 * s));
        wgmma_commit();

        // While it runs: k into k_cm, and U^T's fragments (chunk rows 16 s .., the warp's 16
        // value columns) by ldmatrix .trans.
        lead_pack_k<KP, THREADS>(stage, k_cm);
        fence_proxy_async();
        unsigned ut[4][4];
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const int m = lane >> 3;
            ldsm_x4_trans(ut[s], stage.u + swizzled(16 * s + 8 * (m >> 1) + (lane & 7), 16 * warp + 8 * (m & 1), PF_TILE));
        }
        wgmma_wait_all();
        wg_fence(x);
        wg_fence(a);

        // P = (U^T - X^T) diag(e), as the update's A fragments (k-step s: chunk rows 16 s ..).
        const ChunkGates& gates = *stage.gates;
        unsigned pa[4][4];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int i = 8 * j + 2 * (lane & 3);
            const float e0 = gates.end_decay[i], e1 = gates.end_decay[i + 1];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const unsigned bits = ut[j >> 1][2 * (j & 1) + h];
                const float u0 = bf16_to_f32((unsigned short)(bits & 0xffffu));
                const float u1 = bf16_to_f32((unsigned short)(bits >> 16));
                pa[j >> 1][2 * (j & 1) + h] = pack_bf16((u0 - x[j][2 * h]) * e0, (u1 - x[j][2 * h + 1]) * e1);
            }
        }
        const float decay = gates.state_decay;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int j = 0; j < 8; ++j) {
#pragma unroll
                for (int e = 0; e < 4; ++e) state[h][j][e] *= decay;
            }
        }
        // Every thread's part of k_cm is in place.
        __syncthreads();

        // S^T <- exp(G_last) S^T + P K (K = the chunk's 64 rows, N = the keys by halves).
        wg_fence(state[0]);
        wg_fence(state[1]);
        wg_fence(pa);
        wgmma_fence();
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            lead_wgmma<1>(state[0], pa[s], lead_desc<false>(k_cm, 16 * s, 0));
            lead_wgmma<1>(state[1], pa[s], lead_desc<false>(k_cm, 16 * s, 64));
        }
        wgmma_commit();
        // While it runs: the next chunk's W into the other w_cm (its last reader, the previous
        // chunk's X^T, is complete).
        if (ci + 1 < chunks) {
            bulk_wait(&full[(ci + 1) % LEAD_STAGES], parity(ci + 1));
            lead_pack_w<KP, THREADS>(stage_of(ci + 1), w_cm + ((ci + 1) & 1) * CM_ELEMS);
            fence_proxy_async();
        }
        wgmma_wait_all();
        wg_fence(state[0]);
        wg_fence(state[1]);
        wg_fence(pa);
    }

    // The hand-over: every key and column of the tile, where the segment that follows reads
    // its entry state (load_entry_state, the same index).
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = lead_key(h, j, lane, e), c = col0 + lead_value_col(warp, lane, e);
                ((float*)p.segment_states)[(((long long)segment * p.value_heads + head) * KP + r) * p.value_pad + c] =
                    state[h][j][e];
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(128, 1) gdn_prefill_lead_regs_k128(PrefillParams p) {
    lead_regs_impl<128>(p);
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// GDN prefill in two passes over chunks of CT = 32 tokens (the WY form of FLA's chunk algorithm,
// f32 throughout). For a chunk with normalised q_i, k_i, gates clamped at RESET_GATE and
// G_i = g_0 + ... + g_i counted from the chunk's start, and the state S at its start:
//
//     A_ij = beta_i exp(G_i - G_j) (k_i . k_j)  (j < i),     T = (I + A)^-1
//     W = T diag(beta exp(G)) K,     U = T diag(beta) V        (the u of the recurrence: U - W S)
//     V' = U - W S
//     O  = diag(scale exp(G)) Q S + P V',   P_ij = scale exp(G_i - G_j) (q_i . k_j)  (j <= i)
//     S <- exp(G_last) S + Kd^T V',         Kd_j = exp(G_last - G_j) k_j
//
// `gdn_chunk_prepare` (one workgroup per (chunk, value head), every chunk at once) computes the
// Gram matrices, T by blocks, and stores W, Qd = diag(scale exp(G)) Q, Kd, U, P
// and exp(G_last) in the scratch buffer (rows past a chunk's end are zeros). `gdn_chunk_state`
// (chunks_state.wgsl; one workgroup per (walk unit, value head, tile of VT columns)) walks the
// unit's chunks in order with the tile of S in registers and in workgroup memory, and writes o
// and the final state. A walk unit is a whole sequence, or one segment of a long sequence split
// into segments (a two-level scan, chunks_combine.wgsl: each segment's map S -> M S + D first,
// then every segment's entry state, then the outputs walk of every segment at once). All are
// plain tiled f32 loops (no subgroup operations), so one source serves every adapter.

const CT: u32 = 32u;
// Row stride of the CT x CT matrices and of the staged slices in workgroup memory (one more than
// 32: a column walk touches 32 different banks).
const CP: u32 = 33u;
const SLICE: u32 = 32u;
const RESET_GATE: f32 = -80.0;
const PREPARE_THREADS: u32 = 256u;

// Value columns per state workgroup (16 or 32; K * VT <= 4096), its row groups (8, 16 or 32;
// ROW_GROUPS * VT <= 512), the chunk rows of each (CT / ROW_GROUPS) and the 4-row blocks of S
// each thread keeps (ceil(K / (4 ROW_GROUPS))).
override VT: u32 = 32u;
override ROW_GROUPS: u32 = 8u;
override CHUNK_ROWS: u32 = CT / ROW_GROUPS;
override ROW_BLOCKS: u32 = 4u;
// ceil(K / 4), fixed when the pipeline is built: the loops over a row of W, Qd and Kd then have
// constant trip counts, so the driver can unroll them and issue the row's loads together
// instead of one load per trip.
override STATE_KP4: u32 = 32u;

struct ChunkParams {
    key_heads: u32,
    value_heads: u32,
    key_dim: u32,
    value_dim: u32,
    group: u32,       // H / Hg
    act_dtype: u32,   // q, k, v
    out_dtype: u32,   // o
    g_dtype: u32,
    beta_dtype: u32,
    l2norm: u32,
    scale: f32,
    chunks: u32,      // chunks over every sequence
    kp4: u32,         // ceil(K / 4): vec4 words per row of W, Qd, Kd
    vp4: u32,         // ceil(V / 4): vec4 words per row of U
    w_at: u32,        // offsets in the scratch buffer, in vec4 words
    qd_at: u32,
    kd_at: u32,
    u_at: u32,
    p_at: u32,
    decay_at: u32,
    // The state pass's walk units (see chunks_state.wgsl): their count, where the transition
    // walk's identity columns start (V rounded up to the tile), the row length of a
    // transition [K][trans_width], and where the entry states start in walk_states (in f32).
    units: u32,
    value_pad: u32,
    trans_width: u32,
    entry_at: u32,
}

@group(0) @binding(0) var<uniform> p: ChunkParams;
@group(0) @binding(1) var<storage, read> q: array<u32>;
@group(0) @binding(2) var<storage, read> k: array<u32>;
@group(0) @binding(3) var<storage, read> v: array<u32>;
@group(0) @binding(4) var<storage, read> g: array<u32>;
@group(0) @binding(5) var<storage, read> beta: array<u32>;
// [chunks, 2]: first token and length of each chunk; then the state pass's walk units
// ([units, UNIT_FIELDS], then [N + 1]: each sequence's first unit; chunks_state.wgsl).
@group(0) @binding(6) var<storage, read> chunk_info: array<u32>;
@group(0) @binding(7) var<storage, read_write> scratch: array<vec4<f32>>;


fn load_elem(which: u32, i: u32) -> f32 {
    let d = p.act_dtype;
    let w = word_of(i, d);
    if which == 0u {
        return widen(q[w], i, d);
    }
    if which == 1u {
        return widen(k[w], i, d);
    }
    return widen(v[w], i, d);
}

// Element c of the row starting at element `base` (0 past the row's `dim`).
fn load_row_elem(which: u32, base: u32, c: u32, dim: u32) -> f32 {
    if c < dim {
        return load_elem(which, base + c);
    }
    return 0.0;
}

// Elements 4 c4 .. 4 c4 + 3 of the row of `token` and `head` (zeros past the row's `dim`),
// each component named (no dynamic index into the vector).
fn load_row4(which: u32, token: u32, head: u32, heads: u32, dim: u32, c4: u32) -> vec4<f32> {
    let base = (token * heads + head) * dim;
    let c = 4u * c4;
    return vec4<f32>(
        load_row_elem(which, base, c, dim),
        load_row_elem(which, base, c + 1u, dim),
        load_row_elem(which, base, c + 2u, dim),
        load_row_elem(which, base, c + 3u, dim),
    );
}

// ---- gdn_chunk_prepare ----

// A slice of SLICE columns of the chunk's k and q, [CT][CP].
var<workgroup> k_slice: array<f32, 1056>;
var<workgroup> q_slice: array<f32, 1056>;
// K K^T (its diagonal gives |k_i|^2), then A; Q K^T, then P; T.
var<workgroup> gram_kk: array<f32, 1056>;
var<workgroup> gram_qk: array<f32, 1056>;
var<workgroup> t_inv: array<f32, 1056>;
var<workgroup> g_cum: array<f32, CT>;
var<workgroup> beta_c: array<f32, CT>;
var<workgroup> q_sq: array<f32, CT>;
var<workgroup> inv_q: array<f32, CT>;
var<workgroup> inv_k: array<f32, CT>;
// Row coefficients: of K in W (beta exp(G) / |k|), of q in Qd, of k in Kd.
var<workgroup> coef_w: array<f32, CT>;
var<workgroup> coef_qd: array<f32, CT>;
var<workgroup> coef_kd: array<f32, CT>;
var<workgroup> chunk_range: vec2<u32>;

// Eight rows of W or U being summed (named fields: no dynamically indexed array).
struct Rows8 {
    r0: vec4<f32>,
    r1: vec4<f32>,
    r2: vec4<f32>,
    r3: vec4<f32>,
    r4: vec4<f32>,
    r5: vec4<f32>,
    r6: vec4<f32>,
    r7: vec4<f32>,
}

// acc + (column m of T's eight rows starting at word `at` = row * CP + m) times x.
fn add_t_column(acc: Rows8, at: u32, x: vec4<f32>) -> Rows8 {
    return Rows8(
        acc.r0 + t_inv[at] * x,
        acc.r1 + t_inv[at + CP] * x,
        acc.r2 + t_inv[at + 2u * CP] * x,
        acc.r3 + t_inv[at + 3u * CP] * x,
        acc.r4 + t_inv[at + 4u * CP] * x,
        acc.r5 + t_inv[at + 5u * CP] * x,
        acc.r6 + t_inv[at + 6u * CP] * x,
        acc.r7 + t_inv[at + 7u * CP] * x,
    );
}

// Words c4 of row m of the chunk starting at token `start`: of k times its W coefficient when
// `is_w`, else of v times beta.
fn chunk_row4(is_w: bool, start: u32, m: u32, key_head: u32, head: u32, c4: u32) -> vec4<f32> {
    if is_w {
        return load_row4(1u, start + m, key_head, p.key_heads, p.key_dim, c4) * coef_w[m];
    }
    return load_row4(2u, start + m, head, p.value_heads, p.value_dim, c4) * beta_c[m];
}

// Words of a row of Qd and of Kd.
struct QdKd {
    qd: vec4<f32>,
    kd: vec4<f32>,
}

// Item e (row e / kp4, vec4 column e % kp4) of Qd and Kd: q and k scaled by their row
// coefficients; zeros for rows past the chunk's end and items past the last.
fn scaled_q_and_k(e: u32, items: u32, start: u32, len: u32, key_head: u32, kp4: u32) -> QdKd {
    let i = e / kp4;
    let c4 = e % kp4;
    var out = QdKd(vec4<f32>(0.0), vec4<f32>(0.0));
    if e < items && i < len {
        out.qd = load_row4(0u, start + i, key_head, p.key_heads, p.key_dim, c4) * coef_qd[i];
        out.kd = load_row4(1u, start + i, key_head, p.key_heads, p.key_dim, c4) * coef_kd[i];
    }
    return out;
}

fn store_q_and_k(e: u32, items: u32, base: u32, x: QdKd) {
    if e < items {
        scratch[p.qd_at + base + e] = x.qd;
        scratch[p.kd_at + base + e] = x.kd;
    }
}

// Entry (i, j) of A (beta_i exp(G_i - G_j) k_i . k_j / (|k_i| |k_j|), j < i) and of P
// (scale exp(G_i - G_j) q_i . k_j / (|q_i| |k_j|), j <= i), from the raw dot products.
fn store_a_and_p(i: u32, j: u32, kk: f32, qk: f32) {
    let decay = exp(g_cum[i] - g_cum[j]);
    gram_kk[i * CP + j] = select(0.0, beta_c[i] * decay * kk * inv_k[i] * inv_k[j], j < i);
    gram_qk[i * CP + j] = select(0.0, p.scale * decay * qk * inv_q[i] * inv_k[j], j <= i);
}

// Thread (i0 / 2, j0 / 2)'s 2 x 2 block of K K^T (dkk: (i0, j0), (i0, j0 + 1), (i0 + 1, j0),
// (i0 + 1, j0 + 1)) into gram_kk, and |q|^2 of rows i0, i0 + 1 into q_sq (threads with j0 = 0).
fn store_gram_block(i0: u32, j0: u32, dkk: vec4<f32>, dqq: vec2<f32>) {
    gram_kk[i0 * CP + j0] = dkk.x;
    gram_kk[i0 * CP + j0 + 1u] = dkk.y;
    gram_kk[(i0 + 1u) * CP + j0] = dkk.z;
    gram_kk[(i0 + 1u) * CP + j0 + 1u] = dkk.w;
    if j0 == 0u {
        q_sq[i0] = dqq.x;
        q_sq[i0 + 1u] = dqq.y;
    }
}

// The same block of A (strictly lower) and P (lower, with the diagonal), from the raw dot
// products, once the norms and cumulative gates are known.
fn store_a_and_p_block(i0: u32, j0: u32, dkk: vec4<f32>, dqk: vec4<f32>) {
    store_a_and_p(i0, j0, dkk.x, dqk.x);
    store_a_and_p(i0, j0 + 1u, dkk.y, dqk.y);
    store_a_and_p(i0 + 1u, j0, dkk.z, dqk.z);
    store_a_and_p(i0 + 1u, j0 + 1u, dkk.w, dqk.w);
}

// Chunk n's first token and length, read by thread 0 and made uniform (every thread calls it,
// in uniform control flow).
fn chunk_range_of(tid: u32, n: u32) -> vec2<u32> {
    if tid == 0u {
        chunk_range = vec2<u32>(chunk_info[2u * n], chunk_info[2u * n + 1u]);
    }
    return workgroupUniformLoad(&chunk_range);
}

// Block `block` (8 rows) of W (`is_w`) or U of chunk-head ch, at vec4 column c4, into the
// scratch.
fn store_rows8(is_w: bool, ch: u32, block: u32, c4: u32, acc: Rows8) {
    let dim4 = select(p.vp4, p.kp4, is_w);
    let base = select(p.u_at + ch * CT * p.vp4, p.w_at + ch * CT * p.kp4, is_w);
    let out = base + 8u * block * dim4 + c4;
    scratch[out] = acc.r0;
    scratch[out + dim4] = acc.r1;
    scratch[out + 2u * dim4] = acc.r2;
    scratch[out + 3u * dim4] = acc.r3;
    scratch[out + 4u * dim4] = acc.r4;
    scratch[out + 5u * dim4] = acc.r5;
    scratch[out + 6u * dim4] = acc.r6;
    scratch[out + 7u * dim4] = acc.r7;
}

// g (clamped at RESET_GATE) and beta of the chunk's rows into g_cum and beta_c (zeros past
// its end), by threads 0..CT.
fn load_gates(tid: u32, start: u32, len: u32, h: u32) {
    if tid < CT {
        var gi = 0.0;
        var bi = 0.0;
        if tid < len {
            let at = (start + tid) * p.value_heads + h;
            gi = max(widen(g[word_of(at, p.g_dtype)], at, p.g_dtype), RESET_GATE);
            bi = widen(beta[word_of(at, p.beta_dtype)], at, p.beta_dtype);
        }
        g_cum[tid] = gi;
        beta_c[tid] = bi;
    }
}

// Inverse norms from q_sq and K K^T's diagonal (threads 0..CT) and the cumulative gates
// (thread CT).
fn inverse_norms_and_gate_sums(tid: u32) {
    if tid < CT {
        var iq = 1.0;
        var ik = 1.0;
        if p.l2norm != 0u {
            iq = inverseSqrt(q_sq[tid] + 1e-6);
            ik = inverseSqrt(gram_kk[tid * CP + tid] + 1e-6);
        }
        inv_q[tid] = iq;
        inv_k[tid] = ik;
    } else if tid == CT {
        for (var i = 1u; i < CT; i++) {
            g_cum[i] += g_cum[i - 1u];
        }
    }
}

// Row i's coefficients of K in W, of q in Qd and of k in Kd (zero past the chunk's end).
fn row_coefficients(i: u32, len: u32) {
    let g_last = g_cum[CT - 1u];
    let live = i < len;
    coef_w[i] = select(0.0, beta_c[i] * exp(g_cum[i]) * inv_k[i], live);
    coef_qd[i] = select(0.0, p.scale * exp(g_cum[i]) * inv_q[i], live);
    coef_kd[i] = select(0.0, exp(g_last - g_cum[i]) * inv_k[i], live);
}

// T = (I + A)^-1 by blocks, every thread taking part (called in uniform control flow after
// the barrier that follows A; ends with a barrier): the eight 4 x 4 diagonal blocks by forward
// substitution, a column per thread (threads 0..CT), while the others zero every entry outside
// those blocks; then, for s = 4, 8, 16, the lower-left s x s block of each 2s x 2s diagonal
// block from the two diagonal blocks above it, T21 = -T22 (A21 T11). The longest serial chain
// is then three rows of a 4 x 4 block and two sums of at most 16 terms per level, where a
// substitution over whole 16 x 16 blocks chained up to 120 dependent steps.
fn inverse_blocked(tid: u32) {
    for (var e = tid; e < CT * CT; e += PREPARE_THREADS) {
        let i = e / CT;
        let j = e % CT;
        if i / 4u != j / 4u {
            t_inv[i * CP + j] = 0.0;
        }
    }
    if tid < CT {
        let col = tid;
        let r0 = col & ~3u;
        for (var i = r0; i < r0 + 4u; i++) {
            var x = select(0.0, 1.0, i == col);
            if i > col {
                var acc = 0.0;
                for (var m = col; m < i; m++) {
                    acc += gram_kk[i * CP + m] * t_inv[m * CP + col];
                }
                x = -acc;
            }
            t_inv[i * CP + col] = x;
        }
    }
    workgroupBarrier();
    for (var s = 4u; s < CT; s *= 2u) {
        inverse_lower_blocks(tid, s);
    }
}

// The lower-left s x s block of every 2s x 2s diagonal block of T (16 s entries, one per
// thread): first X = A21 T11 in its place, then -T22 X. Ends with a barrier.
fn inverse_lower_blocks(tid: u32, s: u32) {
    let in_block = tid < 16u * s;
    let r0 = 2u * s * (tid / (s * s));
    let bi = r0 + s + (tid % (s * s)) / s;
    let bj = r0 + tid % s;
    if in_block {
        var x = 0.0;
        for (var m = bj; m < r0 + s; m++) {
            x += gram_kk[bi * CP + m] * t_inv[m * CP + bj];
        }
        t_inv[bi * CP + bj] = x;
    }
    workgroupBarrier();
    var y = 0.0;
    if in_block {
        for (var m = r0 + s; m <= bi; m++) {
            y += t_inv[bi * CP + m] * t_inv[m * CP + bj];
        }
    }
    workgroupBarrier();
    if in_block {
        t_inv[bi * CP + bj] = -y;
    }
    workgroupBarrier();
}

// P (a vec4 of a row per thread) and the chunk's decay exp(G_last) into the scratch.
fn store_p_and_decay(tid: u32, ch: u32) {
    for (var e = tid; e < CT * CT / 4u; e += PREPARE_THREADS) {
        let i = e / (CT / 4u);
        let j0 = 4u * (e % (CT / 4u));
        scratch[p.p_at + ch * CT * CT / 4u + e] = vec4<f32>(
            gram_qk[i * CP + j0],
            gram_qk[i * CP + j0 + 1u],
            gram_qk[i * CP + j0 + 2u],
            gram_qk[i * CP + j0 + 3u],
        );
    }
    if tid == 0u {
        scratch[p.decay_at + ch] = vec4<f32>(exp(g_cum[CT - 1u]), 0.0, 0.0, 0.0);
    }
}

@compute @workgroup_size(PREPARE_THREADS)
fn gdn_chunk_prepare(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let n = wid.z * 32768u + wid.y;
    if n >= p.chunks {
        return;
    }
    let h = wid.x;
    let heads = p.value_heads;
    let kh = h / p.group;
    let kd = p.key_dim;
    let range = chunk_range_of(tid, n);
    let start = range.x;
    let len = range.y;
    load_gates(tid, start, len, h);

    // The Gram matrices over slices of K: thread (a, b) sums the 2 x 2 block of entries
    // (2a + x, 2b + y), as vec4 (x, y) = (0, 0), (0, 1), (1, 0), (1, 1); threads with b = 0
    // also sum |q|^2 of their two rows.
    let a = tid / 16u;
    let b = tid % 16u;
    let i0 = 2u * a;
    let j0 = 2u * b;
    var dkk = vec4<f32>(0.0);
    var dqk = vec4<f32>(0.0);
    var dqq = vec2<f32>(0.0);
    for (var r0 = 0u; r0 < kd; r0 += SLICE) {
        workgroupBarrier();
        for (var e = tid; e < CT * SLICE; e += PREPARE_THREADS) {
            let i = e / SLICE;
            let r = r0 + e % SLICE;
            var kx = 0.0;
            var qx = 0.0;
            if i < len && r < kd {
                let at = ((start + i) * p.key_heads + kh) * kd + r;
                kx = load_elem(1u, at);
                qx = load_elem(0u, at);
            }
            k_slice[i * CP + e % SLICE] = kx;
            q_slice[i * CP + e % SLICE] = qx;
        }
        workgroupBarrier();
        for (var rr = 0u; rr < SLICE; rr++) {
            let k0 = k_slice[i0 * CP + rr];
            let k1 = k_slice[(i0 + 1u) * CP + rr];
            let q0 = q_slice[i0 * CP + rr];
            let q1 = q_slice[(i0 + 1u) * CP + rr];
            let kj = vec4<f32>(k_slice[j0 * CP + rr], k_slice[(j0 + 1u) * CP + rr], 0.0, 0.0).xyxy;
            dkk += vec4<f32>(k0, k0, k1, k1) * kj;
            dqk += vec4<f32>(q0, q0, q1, q1) * kj;
            dqq += vec2<f32>(q0 * q0, q1 * q1);
        }
    }
    store_gram_block(i0, j0, dkk, dqq);
    workgroupBarrier();

    inverse_norms_and_gate_sums(tid);
    workgroupBarrier();
    store_a_and_p_block(i0, j0, dkk, dqk);
    workgroupBarrier();

    // The row coefficients (threads CT..2C) and T = (I + A)^-1 (all).
    if tid >= CT && tid < 2u * CT {
        row_coefficients(tid - CT, len);
    }
    inverse_blocked(tid);

    let ch = n * heads + h;
    let kp4 = p.kp4;
    let vp4 = p.vp4;
    // W and U: item (block of 8 rows, vec4 column); the chunk's rows of k (or v) read once per
    // item, the 8 rows' sums in registers.
    let w_items = 4u * kp4;
    for (var e = tid; e < w_items + 4u * vp4; e += PREPARE_THREADS) {
        let is_w = e < w_items;
        let item = select(e - w_items, e, is_w);
        let dim4 = select(vp4, kp4, is_w);
        let block = item / dim4;
        let c4 = item % dim4;
        // The 8 rows' sums as named values (no function-scope array). Rows of k (or v) four at
        // a time, all four loaded before the first is used, then the chunk's last len % 4 rows
        // one at a time; the sums in the same order either way.
        let tr = 8u * block * CP;
        var acc = Rows8(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0),
            vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
        var m = 0u;
        for (; m + 4u <= len; m += 4u) {
            let x0 = chunk_row4(is_w, start, m, kh, h, c4);
            let x1 = chunk_row4(is_w, start, m + 1u, kh, h, c4);
            let x2 = chunk_row4(is_w, start, m + 2u, kh, h, c4);
            let x3 = chunk_row4(is_w, start, m + 3u, kh, h, c4);
            acc = add_t_column(acc, tr + m, x0);
            acc = add_t_column(acc, tr + m + 1u, x1);
            acc = add_t_column(acc, tr + m + 2u, x2);
            acc = add_t_column(acc, tr + m + 3u, x3);
        }
        for (; m < len; m++) {
            acc = add_t_column(acc, tr + m, chunk_row4(is_w, start, m, kh, h, c4));
        }
        store_rows8(is_w, ch, block, c4, acc);
    }
    // Qd and Kd: item (row, vec4 column), four items per thread and trip, all their loads
    // issued before the first store.
    let qk_items = CT * kp4;
    let qk_base = ch * qk_items;
    for (var e = tid; e < qk_items; e += 4u * PREPARE_THREADS) {
        let r0 = scaled_q_and_k(e, qk_items, start, len, kh, kp4);
        let r1 = scaled_q_and_k(e + PREPARE_THREADS, qk_items, start, len, kh, kp4);
        let r2 = scaled_q_and_k(e + 2u * PREPARE_THREADS, qk_items, start, len, kh, kp4);
        let r3 = scaled_q_and_k(e + 3u * PREPARE_THREADS, qk_items, start, len, kh, kp4);
        store_q_and_k(e, qk_items, qk_base, r0);
        store_q_and_k(e + PREPARE_THREADS, qk_items, qk_base, r1);
        store_q_and_k(e + 2u * PREPARE_THREADS, qk_items, qk_base, r2);
        store_q_and_k(e + 3u * PREPARE_THREADS, qk_items, qk_base, r3);
    }
    store_p_and_decay(tid, ch);
}

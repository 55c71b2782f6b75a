// The prepare pass of `chunks.wgsl` for 16-bit q, k and v (bf16 or f16) with K and V even and
// at most 128: same math, same row coefficients, and every sum over K in the same element
// order as `gdn_chunk_prepare`. The chunk's k and q rows are copied into workgroup memory once,
// as the packed words they are (8 KiB each at K = 128), and every product reads them there:
//
//   load   k and q rows into k_rows / qv_rows, v's words into registers; g and beta
//   gram   K K^T, Q K^T and |q|^2 (thread (a, b): rows 2a, 2a + 1 against 2b, 2b + 1)
//   norms  inverse norms, cumulative gates; then A, P and the row coefficients
//   Qd, Kd from the staged rows; then v's words into qv_rows beside T = (I + A)^-1 by blocks
//   W, U   T diag(coef) K and T diag(beta) V from the staged rows, row block by row block,
//          each row only over the columns where T is not zero (T is lower triangular)
//
// so no product waits on a global load, and k, q and v are each read from memory once.

// Words per row of k and q (K / 2), of v (V / 2), and the 16-bit dtype (DT_BF16 or DT_F16).
override KW: u32 = 64u;
override VW: u32 = 64u;
override HALF_DTYPE: u32 = 2u;
// Row stride of the staged rows, in words: odd, so a walk down a column touches 32 banks.
const RS: u32 = 65u;
// Words per thread of a chunk's 32 rows of at most 64 words.
const ROW_LOADS: u32 = 8u;

var<workgroup> k_rows: array<u32, 2080>;
// q's rows, then (once Qd is written) v's.
var<workgroup> qv_rows: array<u32, 2080>;

// The two elements of a packed word (low half first).
fn unpack_half2(w: u32) -> vec2<f32> {
    if HALF_DTYPE == DT_BF16 {
        return vec2<f32>(bitcast<f32>(w << 16u), bitcast<f32>(w & 0xffff0000u));
    }
    return unpack2x16float(w);
}

// Word w of row `row` of the chunk starting at `start`, for a tensor of `heads` heads and
// `words` words per row (0 past the chunk's end).
fn row_word(which: u32, start: u32, len: u32, row: u32, head: u32, heads: u32, words: u32, w: u32) -> u32 {
    if row >= len {
        return 0u;
    }
    let at = ((start + row) * heads + head) * words + w;
    if which == 0u {
        return q[at];
    }
    if which == 1u {
        return k[at];
    }
    return v[at];
}

// Item i (of ROW_LOADS) of this thread's share of v's staged words.
fn v_item(tid: u32, i: u32, start: u32, len: u32, h: u32) -> u32 {
    let e = tid + i * PREPARE_THREADS;
    if e >= CT * VW {
        return 0u;
    }
    return row_word(2u, start, len, e / VW, h, p.value_heads, VW, e % VW);
}

fn store_v_item(tid: u32, i: u32, word: u32) {
    let e = tid + i * PREPARE_THREADS;
    if e < CT * VW {
        qv_rows[(e / VW) * RS + e % VW] = word;
    }
}

// Elements 4 c4 .. 4 c4 + 3 of staged row m (k_rows when `is_k`, else qv_rows), zeros past
// the row's `words` words (the word read there, inside the row stride, is never written).
fn staged4(is_k: bool, m: u32, c4: u32, words: u32) -> vec4<f32> {
    let w0 = 2u * c4;
    var lo = 0u;
    var hi = 0u;
    if is_k {
        lo = k_rows[m * RS + w0];
        hi = k_rows[m * RS + w0 + 1u];
    } else {
        lo = qv_rows[m * RS + w0];
        hi = qv_rows[m * RS + w0 + 1u];
    }
    hi = select(0u, hi, w0 + 1u < words);
    return vec4<f32>(unpack_half2(lo), unpack_half2(hi));
}

// Row m's coefficient of k in W (`is_w`) or of v in U (beta), reading only the one it needs.
fn row_scale(is_w: bool, m: u32) -> f32 {
    if is_w {
        return coef_w[m];
    }
    return beta_c[m];
}

@compute @workgroup_size(PREPARE_THREADS)
fn gdn_chunk_prepare_staged(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let n = wid.z * 32768u + wid.y;
    if n >= p.chunks {
        return;
    }
    let h = wid.x;
    let kh = h / p.group;
    let range = chunk_range_of(tid, n);
    let start = range.x;
    let len = range.y;

    // Load: v's words first (held until Qd is written), then k and q into workgroup memory.
    let v0 = v_item(tid, 0u, start, len, h);
    let v1 = v_item(tid, 1u, start, len, h);
    let v2 = v_item(tid, 2u, start, len, h);
    let v3 = v_item(tid, 3u, start, len, h);
    let v4 = v_item(tid, 4u, start, len, h);
    let v5 = v_item(tid, 5u, start, len, h);
    let v6 = v_item(tid, 6u, start, len, h);
    let v7 = v_item(tid, 7u, start, len, h);
    for (var i = 0u; i < ROW_LOADS; i++) {
        let e = tid + i * PREPARE_THREADS;
        if e < CT * KW {
            let row = e / KW;
            let w = e % KW;
            k_rows[row * RS + w] = row_word(1u, start, len, row, kh, p.key_heads, KW, w);
            qv_rows[row * RS + w] = row_word(0u, start, len, row, kh, p.key_heads, KW, w);
        }
    }
    load_gates(tid, start, len, h);
    workgroupBarrier();

    // Gram: thread (a, b) sums the 2 x 2 block of entries (2a + x, 2b + y) as in
    // gdn_chunk_prepare, element 2w before element 2w + 1 of each word w.
    let i0 = 2u * (tid / 16u);
    let j0 = 2u * (tid % 16u);
    var dkk = vec4<f32>(0.0);
    var dqk = vec4<f32>(0.0);
    var dqq = vec2<f32>(0.0);
    for (var w = 0u; w < KW; w++) {
        let k0 = unpack_half2(k_rows[i0 * RS + w]);
        let k1 = unpack_half2(k_rows[(i0 + 1u) * RS + w]);
        let q0 = unpack_half2(qv_rows[i0 * RS + w]);
        let q1 = unpack_half2(qv_rows[(i0 + 1u) * RS + w]);
        let kj0 = unpack_half2(k_rows[j0 * RS + w]);
        let kj1 = unpack_half2(k_rows[(j0 + 1u) * RS + w]);
        let lo = vec4<f32>(kj0.x, kj1.x, kj0.x, kj1.x);
        dkk += vec4<f32>(k0.x, k0.x, k1.x, k1.x) * lo;
        dqk += vec4<f32>(q0.x, q0.x, q1.x, q1.x) * lo;
        dqq += vec2<f32>(q0.x * q0.x, q1.x * q1.x);
        let hi = vec4<f32>(kj0.y, kj1.y, kj0.y, kj1.y);
        dkk += vec4<f32>(k0.y, k0.y, k1.y, k1.y) * hi;
        dqk += vec4<f32>(q0.y, q0.y, q1.y, q1.y) * hi;
        dqq += vec2<f32>(q0.y * q0.y, q1.y * q1.y);
    }
    store_gram_block(i0, j0, dkk, dqq);
    workgroupBarrier();

    inverse_norms_and_gate_sums(tid);
    workgroupBarrier();
    store_a_and_p_block(i0, j0, dkk, dqk);
    if tid < CT {
        row_coefficients(tid, len);
    }
    workgroupBarrier();

    // Qd and Kd from the staged q and k rows.
    let ch = n * p.value_heads + h;
    let kp4 = p.kp4;
    let vp4 = p.vp4;
    let items = CT * kp4;
    let base = ch * items;
    for (var e = tid; e < items; e += PREPARE_THREADS) {
        let i = e / kp4;
        let c4 = e % kp4;
        scratch[p.qd_at + base + e] = staged4(false, i, c4, KW) * coef_qd[i];
        scratch[p.kd_at + base + e] = staged4(true, i, c4, KW) * coef_kd[i];
    }
    workgroupBarrier();
    // q's rows are done with: v's words take their place (read after the inverse's barriers),
    // and T = (I + A)^-1.
    store_v_item(tid, 0u, v0);
    store_v_item(tid, 1u, v1);
    store_v_item(tid, 2u, v2);
    store_v_item(tid, 3u, v3);
    store_v_item(tid, 4u, v4);
    store_v_item(tid, 5u, v5);
    store_v_item(tid, 6u, v6);
    store_v_item(tid, 7u, v7);
    inverse_blocked(tid);

    // W and U: item (block of 8 rows, vec4 column), the block's rows summed over the columns
    // m < min(len, 8 (block + 1)) where T can be non-zero, in increasing m as gdn_chunk_prepare.
    let w_items = 4u * kp4;
    for (var e = tid; e < w_items + 4u * vp4; e += PREPARE_THREADS) {
        let is_w = e < w_items;
        let item = select(e - w_items, e, is_w);
        let dim4 = select(vp4, kp4, is_w);
        let words = select(VW, KW, is_w);
        let block = item / dim4;
        let c4 = item % dim4;
        let tr = 8u * block * CP;
        var acc = Rows8(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0),
            vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
        let m_end = min(len, 8u * block + 8u);
        for (var m = 0u; m < m_end; m++) {
            acc = add_t_column(acc, tr + m, staged4(is_w, m, c4, words) * row_scale(is_w, m));
        }
        store_rows8(is_w, ch, block, c4, acc);
    }
    store_p_and_decay(tid, ch);
}

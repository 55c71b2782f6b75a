// The state pass of `chunks.wgsl` for one shape: 32 row groups (ROW_GROUPS = C), so each thread
// owns one chunk row rg for the products and the one 4-row block rg of S (rows 4 rg .. 4 rg + 3,
// so K <= 128), with K a multiple of 16 and 16-column tiles. Same math as `gdn_chunk_state`;
// W S and Qd S are summed as two halves over K (each thread sums rows rg and rg ^ 16 over one
// half, so each load of S serves two rows, then the halves meet through workgroup memory).
// Written without function-scope arrays: the state rows, the
// loaded words and the sums are named values. Every scratch matrix of the walk is read from
// workgroup memory: W, Qd and Kd of the chunk each go through registers into one buffer before
// their use, loaded one or two phases ahead, so no product waits on a scratch load:
//
//   top:  S and W (loaded during the previous chunk's o) stored; barrier
//   A:    W S (halves joined: barrier), V' = U - W S stored; Kd loads issued; barrier
//         Qd (loaded during the previous update) stored; barrier
//   B1:   O = Qd S (halves joined: barrier) + P V' (S still in workgroup memory); the next
//         W's loads issued; barrier
//         Kd stored; barrier
//   B2:   S <- exp(G_last) S + Kd^T V'; the next Qd's loads issued; barrier (next top)
//
// The three matrices take turns in one 16.5 KiB buffer, so the kernel needs 29 KiB of workgroup
// memory (every adapter's 32 KiB holds it), at the price of eight barriers per chunk.

// The tile of S, [K <= 128][8 column pairs]; V' of the chunk, [C][8]; the chunk's W, Qd or Kd.
var<workgroup> block_s: array<vec2<f32>, 1024>;
var<workgroup> block_v_new: array<vec2<f32>, 256>;
var<workgroup> staged: array<vec4<f32>, 1056>;
// The halves of W S and Qd S that a thread sums for another thread's row, [C][8].
var<workgroup> half_sums: array<vec2<f32>, 256>;
// QK_RAW = 1: the scratch holds no Qd and Kd but their row coefficients; the kernel stages
// q's and k's rows (widened from their packed words, read through these vec2 views) in their
// place, multiplies each row of Qd S by its coefficient, and forms Kd^T V' as
// k^T (diag(coef_kd) V'), from a second copy of V' with its rows scaled.
override QK_RAW: u32 = 0u;
@group(0) @binding(10) var<storage, read> q_pairs: array<vec2<u32>>;
@group(0) @binding(11) var<storage, read> k_pairs: array<vec2<u32>>;
var<workgroup> v_new_kd: array<vec2<f32>, 256>;
// The chunk's coefficients: Qd's QK_COEF_WORDS words, then Kd's.
var<workgroup> qk_coefs: array<vec4<f32>, 16>;

// A word of Qd or Kd on its way to `staged`: the scratch's, or (QK_RAW) q's or k's packed word
// pair.
struct QkWord {
    scratch: vec4<f32>,
    raw: vec2<u32>,
}

// Chunk n's first token and length (n clamped to the table).
fn chunk_span(n: u32) -> vec2<u32> {
    let at = 2u * min(n, max(p.chunks, 1u) - 1u);
    return vec2<u32>(chunk_info[at], chunk_info[at + 1u]);
}

// Word e of Qd (`is_q`) or Kd of chunk-head ch, value head h, whose chunk starts and runs as
// `span` says (read a chunk ahead, so these loads wait on nothing). Under QK_RAW, rows past the
// chunk's end read its last row (in bounds), which their zero coefficients cancel.
fn qk_word(is_q: bool, span: vec2<u32>, ch: u32, h: u32, e: u32) -> QkWord {
    var out = QkWord(vec4<f32>(0.0), vec2<u32>(0u));
    if QK_RAW == 0u {
        out.scratch = chunk_word(select(p.kd_at, p.qd_at, is_q), ch, e, STATE_KP4);
        return out;
    }
    let i = min(e, C * STATE_KP4 - 1u);
    let token = span.x + min(i / STATE_KP4, max(span.y, 1u) - 1u);
    let at = (token * p.key_heads + h / p.group) * STATE_KP4 + i % STATE_KP4;
    if is_q {
        out.raw = q_pairs[at];
    } else {
        out.raw = k_pairs[at];
    }
    return out;
}

fn qk_value(x: QkWord) -> vec4<f32> {
    if QK_RAW == 0u {
        return x.scratch;
    }
    return vec4<f32>(unpack_half2(x.raw.x), unpack_half2(x.raw.y));
}

// Word tid (< 2 QK_COEF_WORDS) of chunk-head ch's coefficients (QK_RAW), else zeros.
fn coef_word(ch: u32, tid: u32) -> vec4<f32> {
    if QK_RAW == 0u || tid >= 2u * QK_COEF_WORDS {
        return vec4<f32>(0.0);
    }
    return scratch[p.qd_at + ch * 2u * QK_COEF_WORDS + tid];
}

// Row i's coefficient of Qd (`is_q`) or Kd from the staged words.
fn qk_coef(is_q: bool, i: u32) -> f32 {
    return qk_coefs[select(QK_COEF_WORDS, 0u, is_q) + i / 4u][i % 4u];
}

// vec4 words between the staged matrix's rows beyond a row: one, so the rows that the four
// row groups of a subgroup read at once start in different banks.
const STAGE_PAD: u32 = 1u;

// Word e of a chunk's [C][STATE_KP4] matrix into `staged` (the words past it, loaded again
// by the clamped reads, are dropped).
fn stage_word(e: u32, word: vec4<f32>) {
    if e < C * STATE_KP4 {
        staged[(e / STATE_KP4) * (STATE_KP4 + STAGE_PAD) + e % STATE_KP4] = word;
    }
}

// P V' over the chunk rows 4 j4 .. 4 j4 + 3, for the word pw of P.
fn new_value_products(pw: vec4<f32>, j4: u32, cp: u32) -> vec2<f32> {
    let pairs = VT / 2u;
    return pw.x * block_v_new[(4u * j4) * pairs + cp] + pw.y * block_v_new[(4u * j4 + 1u) * pairs + cp]
        + pw.z * block_v_new[(4u * j4 + 2u) * pairs + cp] + pw.w * block_v_new[(4u * j4 + 3u) * pairs + cp];
}

// Word i of a scratch matrix [C][kp4] of chunk-head ch at region offset `at`, clamped to the
// matrix (the words past it are loaded again and never read).
fn chunk_word(at: u32, ch: u32, i: u32, kp4: u32) -> vec4<f32> {
    let words = C * kp4;
    return scratch[at + ch * words + min(i, words - 1u)];
}

// Chunk rows rg and rg ^ 16 of the staged matrix (W or Qd) times the tile of S at column pair
// cp, each over the half of K that rg / 16 names: (row rg, row rg ^ 16) as (xy, zw). Two rows
// per thread share each load of S.
fn staged_half_products(rg: u32, kp4: u32, cp: u32) -> vec4<f32> {
    let pairs = VT / 2u;
    let half = kp4 / 2u;
    let first = (rg / 16u) * half;
    let own = rg * (kp4 + STAGE_PAD);
    let other = (rg ^ 16u) * (kp4 + STAGE_PAD);
    var a = vec2<f32>(0.0);
    var b = vec2<f32>(0.0);
    for (var r4 = first; r4 < first + half; r4++) {
        let s0 = block_s[(4u * r4) * pairs + cp];
        let s1 = block_s[(4u * r4 + 1u) * pairs + cp];
        let s2 = block_s[(4u * r4 + 2u) * pairs + cp];
        let s3 = block_s[(4u * r4 + 3u) * pairs + cp];
        let wa = staged[own + r4];
        let wb = staged[other + r4];
        a += wa.x * s0 + wa.y * s1 + wa.z * s2 + wa.w * s3;
        b += wb.x * s0 + wb.y * s1 + wb.z * s2 + wb.w * s3;
    }
    return vec4<f32>(a, b);
}

// Row rg's whole product from its two halves: each thread hands the half it summed for row
// rg ^ 16 to that row's thread and adds the half it receives (every thread calls it, in
// uniform control flow; a barrier inside).
fn join_halves(rg: u32, cp: u32, halves: vec4<f32>) -> vec2<f32> {
    let pairs = VT / 2u;
    half_sums[(rg ^ 16u) * pairs + cp] = halves.zw;
    workgroupBarrier();
    return halves.xy + half_sums[rg * pairs + cp];
}

// Row j of the V' that multiplies Kd^T in the update (scaled by Kd's coefficients under
// QK_RAW).
fn update_value(j: u32, cp: u32) -> vec2<f32> {
    if QK_RAW != 0u {
        return v_new_kd[j * (VT / 2u) + cp];
    }
    return block_v_new[j * (VT / 2u) + cp];
}

// Four words per thread of a chunk's [C][kp4] matrix into `staged`.
fn stage_words(threads: u32, tid: u32, a: vec4<f32>, b: vec4<f32>, c: vec4<f32>, d: vec4<f32>) {
    stage_word(tid, a);
    stage_word(tid + threads, b);
    stage_word(tid + 2u * threads, c);
    stage_word(tid + 3u * threads, d);
}

@compute @workgroup_size(C * VT / 2u)
fn gdn_chunk_state_staged(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let pairs = VT / 2u;
    let threads = C * VT / 2u;
    let cp = tid % pairs;
    let rg = tid / pairs;
    let h = wid.y;
    let seq = wid.z;
    let heads = p.value_heads;
    let vd = p.value_dim;
    let kp4 = STATE_KP4;
    let col = wid.x * VT + 2u * cp;
    let col_ok = vec2<bool>(col < vd, col + 1u < vd);
    let chunks = sequence_chunks(tid, seq);

    let slab = (seq * heads + h) * p.key_dim;
    let has_rows = rg < kp4;
    let r = 4u * rg;
    var s0 = state_pair(slab, r, col, col_ok);
    var s1 = state_pair(slab, r + 1u, col, col_ok);
    var s2 = state_pair(slab, r + 2u, col, col_ok);
    var s3 = state_pair(slab, r + 3u, col, col_ok);

    // The first chunk's W and Qd (a sequence without chunks loads words it never uses).
    let first_ch = min(chunks.x, max(p.chunks, 1u) - 1u) * heads + h;
    var w0 = chunk_word(p.w_at, first_ch, tid, kp4);
    var w1 = chunk_word(p.w_at, first_ch, tid + threads, kp4);
    var w2 = chunk_word(p.w_at, first_ch, tid + 2u * threads, kp4);
    var w3 = chunk_word(p.w_at, first_ch, tid + 3u * threads, kp4);
    // Chunk spans one chunk ahead of the loads that use them.
    var span = chunk_span(chunks.x);
    var next_span = chunk_span(min(chunks.x + 1u, max(chunks.y, 1u) - 1u));
    var x0 = qk_word(true, span, first_ch, h, tid);
    var x1 = qk_word(true, span, first_ch, h, tid + threads);
    var x2 = qk_word(true, span, first_ch, h, tid + 2u * threads);
    var x3 = qk_word(true, span, first_ch, h, tid + 3u * threads);
    var coefs = coef_word(first_ch, tid);

    for (var n = chunks.x; n < chunks.y; n++) {
        let ch = n * heads + h;
        let next_ch = min(n + 1u, chunks.y - 1u) * heads + h;
        let later_span = chunk_span(min(n + 2u, chunks.y - 1u));
        // Top: the previous update has read Kd and V'; S and W in.
        workgroupBarrier();
        if has_rows {
            block_s[r * pairs + cp] = s0;
            block_s[(r + 1u) * pairs + cp] = s1;
            block_s[(r + 2u) * pairs + cp] = s2;
            block_s[(r + 3u) * pairs + cp] = s3;
        }
        stage_words(threads, tid, w0, w1, w2, w3);
        if QK_RAW != 0u && tid < 2u * QK_COEF_WORDS {
            qk_coefs[tid] = coefs;
        }
        let u4 = scratch[p.u_at + (ch * C + rg) * p.vp4 + col / 4u];
        workgroupBarrier();

        // A: W S for chunk row rg, then V' = U - W S.
        let ws = join_halves(rg, cp, staged_half_products(rg, kp4, cp));
        let v_new = select(u4.xy, u4.zw, (col & 2u) != 0u) - ws;
        block_v_new[rg * pairs + cp] = v_new;
        if QK_RAW != 0u {
            v_new_kd[rg * pairs + cp] = v_new * qk_coef(false, rg);
        }
        let kd0 = qk_word(false, span, ch, h, tid);
        let kd1 = qk_word(false, span, ch, h, tid + threads);
        let kd2 = qk_word(false, span, ch, h, tid + 2u * threads);
        let kd3 = qk_word(false, span, ch, h, tid + 3u * threads);
        let p_row = p.p_at + (ch * C + rg) * (C / 4u);
        let p0 = scratch[p_row];
        let p1 = scratch[p_row + 1u];
        let p2 = scratch[p_row + 2u];
        let p3 = scratch[p_row + 3u];
        let p4 = scratch[p_row + 4u];
        let p5 = scratch[p_row + 5u];
        let p6 = scratch[p_row + 6u];
        let p7 = scratch[p_row + 7u];
        let decay = scratch[p.decay_at + ch].x;
        workgroupBarrier();
        stage_words(threads, tid, qk_value(x0), qk_value(x1), qk_value(x2), qk_value(x3));
        workgroupBarrier();

        // B1: O = Qd S + P V'; the next chunk's W on its way.
        var qs = join_halves(rg, cp, staged_half_products(rg, kp4, cp));
        if QK_RAW != 0u {
            qs *= qk_coef(true, rg);
        }
        w0 = chunk_word(p.w_at, next_ch, tid, kp4);
        w1 = chunk_word(p.w_at, next_ch, tid + threads, kp4);
        w2 = chunk_word(p.w_at, next_ch, tid + 2u * threads, kp4);
        w3 = chunk_word(p.w_at, next_ch, tid + 3u * threads, kp4);
        qs += new_value_products(p0, 0u, cp);
        qs += new_value_products(p1, 1u, cp);
        qs += new_value_products(p2, 2u, cp);
        qs += new_value_products(p3, 3u, cp);
        qs += new_value_products(p4, 4u, cp);
        qs += new_value_products(p5, 5u, cp);
        qs += new_value_products(p6, 6u, cp);
        qs += new_value_products(p7, 7u, cp);
        let start = span.x;
        let len = span.y;
        if rg < len && col_ok.x {
            store_o(((start + rg) * heads + h) * vd + col, qs, col_ok.y);
        }
        workgroupBarrier();
        stage_words(threads, tid, qk_value(kd0), qk_value(kd1), qk_value(kd2), qk_value(kd3));
        workgroupBarrier();

        // B2: S <- exp(G_last) S + Kd^T V'; the next chunk's Qd on its way.
        x0 = qk_word(true, next_span, next_ch, h, tid);
        x1 = qk_word(true, next_span, next_ch, h, tid + threads);
        x2 = qk_word(true, next_span, next_ch, h, tid + 2u * threads);
        x3 = qk_word(true, next_span, next_ch, h, tid + 3u * threads);
        coefs = coef_word(next_ch, tid);
        s0 *= decay;
        s1 *= decay;
        s2 *= decay;
        s3 *= decay;
        if has_rows {
            for (var j4 = 0u; j4 < C; j4 += 4u) {
                let k0 = staged[j4 * (kp4 + STAGE_PAD) + rg];
                let k1 = staged[(j4 + 1u) * (kp4 + STAGE_PAD) + rg];
                let k2 = staged[(j4 + 2u) * (kp4 + STAGE_PAD) + rg];
                let k3 = staged[(j4 + 3u) * (kp4 + STAGE_PAD) + rg];
                let v0 = update_value(j4, cp);
                let v1 = update_value((j4 + 1u), cp);
                let v2 = update_value((j4 + 2u), cp);
                let v3 = update_value((j4 + 3u), cp);
                s0 += k0.x * v0;
                s1 += k0.y * v0;
                s2 += k0.z * v0;
                s3 += k0.w * v0;
                s0 += k1.x * v1;
                s1 += k1.y * v1;
                s2 += k1.z * v1;
                s3 += k1.w * v1;
                s0 += k2.x * v2;
                s1 += k2.y * v2;
                s2 += k2.z * v2;
                s3 += k2.w * v2;
                s0 += k3.x * v3;
                s1 += k3.y * v3;
                s2 += k3.z * v3;
                s3 += k3.w * v3;
            }
        }
        span = next_span;
        next_span = later_span;
    }

    store_state_pair(slab, r, col, col_ok, s0);
    store_state_pair(slab, r + 1u, col, col_ok, s1);
    store_state_pair(slab, r + 2u, col, col_ok, s2);
    store_state_pair(slab, r + 3u, col, col_ok, s3);
}

// The state pass of `chunks.wgsl` for one shape: 32 row groups (ROW_GROUPS = C), so each thread
// owns one chunk row rg for the products and the one 4-row block rg of S (rows 4 rg .. 4 rg + 3,
// so K <= 128), with K a multiple of 16 and 16-column tiles. Same math as `gdn_chunk_state`;
// W S and Qd S are summed as two halves over K (each thread sums rows rg and rg ^ 16 over one
// half, so each load of S serves two rows, then the halves meet through workgroup memory).
// Written without function-scope arrays: the state rows, the loaded words and the sums are
// named values. Every scratch matrix of the walk is read from workgroup memory: W, Qd and Kd of
// the chunk go through registers into workgroup buffers, loaded one or two phases ahead, so no
// product waits on a scratch load. Two entry points:
//
// `gdn_chunk_state_staged`, the three matrices taking turns in one 16.5 KiB buffer (29 KiB of
// workgroup memory in all: every adapter's 32 KiB holds it), eight barriers per chunk:
//
//   top:  S and W (loaded during the previous chunk's o) stored; barrier
//   A:    W S (halves joined: barrier), V' = U - W S stored; Kd loads issued; barrier
//         Qd (loaded during the previous update) stored; barrier
//   B1:   O = Qd S (halves joined: barrier) + P V' (S still in workgroup memory); the next
//         W's loads issued; barrier
//         Kd stored; barrier
//   B2:   S <- exp(G_last) S + Kd^T V'; the next Qd's loads issued; barrier (next top)
//
// `gdn_chunk_state_two_stages`, for adapters with 47 KiB of workgroup memory: W (then Kd) and
// Qd in two buffers, four barriers per chunk:
//
//   top:  S, W and Qd (both loaded during the previous chunk) stored; barrier
//   A:    the halves of W S and Qd S; Kd and P loads issued; barrier
//   J:    halves joined; V' = U - W S stored; Kd stored where W was; the next W and Qd
//         loads issued; barrier
//   B:    O = Qd S + P V'; S <- exp(G_last) S + Kd^T V'; barrier (next top)

// The tile of S, [K <= 128][8 column pairs]; V' of the chunk, [C][8]; the chunk's W, Qd or Kd
// (and Qd in `staged_b` for the two-stage kernel).
var<workgroup> block_s: array<vec2<f32>, 1024>;
var<workgroup> block_v_new: array<vec2<f32>, 256>;
var<workgroup> staged: array<vec4<f32>, 1056>;
var<workgroup> staged_b: array<vec4<f32>, 1056>;
// The halves of W S (and of Qd S, `half_sums_b`) that a thread sums for another thread's row,
// [C][8].
var<workgroup> half_sums: array<vec2<f32>, 256>;
var<workgroup> half_sums_b: array<vec2<f32>, 256>;
// vec4 words between the staged matrix's rows beyond a row: one, so the rows that the four
// row groups of a subgroup read at once start in different banks.
const STAGE_PAD: u32 = 1u;

// Four words per thread of a chunk's [C][STATE_KP4] matrix, read from the scratch.
struct Words4 {
    a: vec4<f32>,
    b: vec4<f32>,
    c: vec4<f32>,
    d: vec4<f32>,
}

// Word i of a scratch matrix [C][kp4] of chunk-head ch at region offset `at`, clamped to the
// matrix (the words past it are loaded again and never read).
fn chunk_word(at: u32, ch: u32, i: u32, kp4: u32) -> vec4<f32> {
    let words = C * kp4;
    return scratch[at + ch * words + min(i, words - 1u)];
}

fn chunk_words(at: u32, ch: u32, tid: u32) -> Words4 {
    let threads = C * VT / 2u;
    return Words4(
        chunk_word(at, ch, tid, STATE_KP4),
        chunk_word(at, ch, tid + threads, STATE_KP4),
        chunk_word(at, ch, tid + 2u * threads, STATE_KP4),
        chunk_word(at, ch, tid + 3u * threads, STATE_KP4),
    );
}

// Word e of a chunk's matrix into `staged_b` when `b`, else `staged` (the words past the
// matrix, loaded again by the clamped reads, are dropped).
fn stage_word(b: bool, e: u32, word: vec4<f32>) {
    if e < C * STATE_KP4 {
        let at = (e / STATE_KP4) * (STATE_KP4 + STAGE_PAD) + e % STATE_KP4;
        if b {
            staged_b[at] = word;
        } else {
            staged[at] = word;
        }
    }
}

fn stage_words(b: bool, tid: u32, w: Words4) {
    let threads = C * VT / 2u;
    stage_word(b, tid, w.a);
    stage_word(b, tid + threads, w.b);
    stage_word(b, tid + 2u * threads, w.c);
    stage_word(b, tid + 3u * threads, w.d);
}

// Chunk rows rg and rg ^ 16 of the staged matrix (`staged_b` when `b`, else `staged`) times the
// tile of S at column pair cp, each over the half of K that rg / 16 names: (row rg,
// row rg ^ 16) as (xy, zw). Two rows per thread share each load of S.
fn staged_half_products(b: bool, rg: u32, cp: u32) -> vec4<f32> {
    let pairs = VT / 2u;
    let half = STATE_KP4 / 2u;
    let first = (rg / 16u) * half;
    let own = rg * (STATE_KP4 + STAGE_PAD);
    let other = (rg ^ 16u) * (STATE_KP4 + STAGE_PAD);
    var sum_own = vec2<f32>(0.0);
    var sum_other = vec2<f32>(0.0);
    for (var r4 = first; r4 < first + half; r4++) {
        let s0 = block_s[(4u * r4) * pairs + cp];
        let s1 = block_s[(4u * r4 + 1u) * pairs + cp];
        let s2 = block_s[(4u * r4 + 2u) * pairs + cp];
        let s3 = block_s[(4u * r4 + 3u) * pairs + cp];
        var wa: vec4<f32>;
        var wb: vec4<f32>;
        if b {
            wa = staged_b[own + r4];
            wb = staged_b[other + r4];
        } else {
            wa = staged[own + r4];
            wb = staged[other + r4];
        }
        sum_own += wa.x * s0 + wa.y * s1 + wa.z * s2 + wa.w * s3;
        sum_other += wb.x * s0 + wb.y * s1 + wb.z * s2 + wb.w * s3;
    }
    return vec4<f32>(sum_own, sum_other);
}

// Hands the half a thread summed for row rg ^ 16 to that row's thread (`half_sums_b` when `b`);
// a barrier must follow before `joined_half` reads it.
fn hand_over_half(b: bool, rg: u32, cp: u32, halves: vec4<f32>) {
    let at = (rg ^ 16u) * (VT / 2u) + cp;
    if b {
        half_sums_b[at] = halves.zw;
    } else {
        half_sums[at] = halves.zw;
    }
}

// Row rg's whole product: its own half plus the half handed over for it.
fn joined_half(b: bool, rg: u32, cp: u32, halves: vec4<f32>) -> vec2<f32> {
    let at = rg * (VT / 2u) + cp;
    if b {
        return halves.xy + half_sums_b[at];
    }
    return halves.xy + half_sums[at];
}

// P V' over the chunk rows 4 j4 .. 4 j4 + 3, for the word pw of P.
fn new_value_products(pw: vec4<f32>, j4: u32, cp: u32) -> vec2<f32> {
    let pairs = VT / 2u;
    return pw.x * block_v_new[(4u * j4) * pairs + cp] + pw.y * block_v_new[(4u * j4 + 1u) * pairs + cp]
        + pw.z * block_v_new[(4u * j4 + 2u) * pairs + cp] + pw.w * block_v_new[(4u * j4 + 3u) * pairs + cp];
}

// Row rg of P for chunk-head ch, eight vec4 words.
struct PRow {
    p0: vec4<f32>,
    p1: vec4<f32>,
    p2: vec4<f32>,
    p3: vec4<f32>,
    p4: vec4<f32>,
    p5: vec4<f32>,
    p6: vec4<f32>,
    p7: vec4<f32>,
}

fn p_row(ch: u32, rg: u32) -> PRow {
    let at = p.p_at + (ch * C + rg) * (C / 4u);
    return PRow(
        scratch[at],
        scratch[at + 1u],
        scratch[at + 2u],
        scratch[at + 3u],
        scratch[at + 4u],
        scratch[at + 5u],
        scratch[at + 6u],
        scratch[at + 7u],
    );
}

// qs + P V' for row rg at column pair cp (V' complete in workgroup memory).
fn add_new_value_products(qs: vec2<f32>, pr: PRow, cp: u32) -> vec2<f32> {
    var o = qs;
    o += new_value_products(pr.p0, 0u, cp);
    o += new_value_products(pr.p1, 1u, cp);
    o += new_value_products(pr.p2, 2u, cp);
    o += new_value_products(pr.p3, 3u, cp);
    o += new_value_products(pr.p4, 4u, cp);
    o += new_value_products(pr.p5, 5u, cp);
    o += new_value_products(pr.p6, 6u, cp);
    o += new_value_products(pr.p7, 7u, cp);
    return o;
}

// A thread's 4-row block of the tile of S (rows 4 rg .. 4 rg + 3, column pair cp).
struct SRows {
    s0: vec2<f32>,
    s1: vec2<f32>,
    s2: vec2<f32>,
    s3: vec2<f32>,
}

// S <- decay S + Kd^T V' on the thread's rows, Kd staged in `staged`, V' in workgroup memory.
fn update_rows(s: SRows, decay: f32, rg: u32, cp: u32) -> SRows {
    let pairs = VT / 2u;
    let stride = STATE_KP4 + STAGE_PAD;
    var s0 = s.s0 * decay;
    var s1 = s.s1 * decay;
    var s2 = s.s2 * decay;
    var s3 = s.s3 * decay;
    if rg < STATE_KP4 {
        for (var j4 = 0u; j4 < C; j4 += 4u) {
            let k0 = staged[j4 * stride + rg];
            let k1 = staged[(j4 + 1u) * stride + rg];
            let k2 = staged[(j4 + 2u) * stride + rg];
            let k3 = staged[(j4 + 3u) * stride + rg];
            let v0 = block_v_new[j4 * pairs + cp];
            let v1 = block_v_new[(j4 + 1u) * pairs + cp];
            let v2 = block_v_new[(j4 + 2u) * pairs + cp];
            let v3 = block_v_new[(j4 + 3u) * pairs + cp];
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
    return SRows(s0, s1, s2, s3);
}

fn store_rows_to_block(s: SRows, rg: u32, cp: u32) {
    let pairs = VT / 2u;
    if rg < STATE_KP4 {
        let r = 4u * rg;
        block_s[r * pairs + cp] = s.s0;
        block_s[(r + 1u) * pairs + cp] = s.s1;
        block_s[(r + 2u) * pairs + cp] = s.s2;
        block_s[(r + 3u) * pairs + cp] = s.s3;
    }
}

fn load_rows(slab: u32, rg: u32, col: u32, col_ok: vec2<bool>) -> SRows {
    let r = 4u * rg;
    return SRows(
        state_pair(slab, r, col, col_ok),
        state_pair(slab, r + 1u, col, col_ok),
        state_pair(slab, r + 2u, col, col_ok),
        state_pair(slab, r + 3u, col, col_ok),
    );
}

fn store_rows(slab: u32, rg: u32, col: u32, col_ok: vec2<bool>, s: SRows) {
    let r = 4u * rg;
    store_state_pair(slab, r, col, col_ok, s.s0);
    store_state_pair(slab, r + 1u, col, col_ok, s.s1);
    store_state_pair(slab, r + 2u, col, col_ok, s.s2);
    store_state_pair(slab, r + 3u, col, col_ok, s.s3);
}

// Row rg of o (chunk n, value head h) at columns col, col + 1, for rows inside the chunk.
fn store_o_row(n: u32, h: u32, rg: u32, col: u32, col_ok: vec2<bool>, x: vec2<f32>) {
    let start = chunk_info[2u * n];
    let len = chunk_info[2u * n + 1u];
    if rg < len && col_ok.x {
        store_o(((start + rg) * p.value_heads + h) * p.value_dim + col, x, col_ok.y);
    }
}

// U's two columns col, col + 1 of chunk row rg.
fn u_pair(ch: u32, rg: u32, col: u32) -> vec2<f32> {
    let u4 = scratch[p.u_at + (ch * C + rg) * p.vp4 + col / 4u];
    return select(u4.xy, u4.zw, (col & 2u) != 0u);
}

@compute @workgroup_size(C * VT / 2u)
fn gdn_chunk_state_staged(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let pairs = VT / 2u;
    let cp = tid % pairs;
    let rg = tid / pairs;
    let h = wid.y;
    let heads = p.value_heads;
    let col = wid.x * VT + 2u * cp;
    let col_ok = vec2<bool>(col < p.value_dim, col + 1u < p.value_dim);
    let chunks = sequence_chunks(tid, wid.z);
    let slab = (wid.z * heads + h) * p.key_dim;
    var s = load_rows(slab, rg, col, col_ok);

    // The first chunk's W and Qd (a sequence without chunks loads words it never uses).
    let first_ch = min(chunks.x, max(p.chunks, 1u) - 1u) * heads + h;
    var w = chunk_words(p.w_at, first_ch, tid);
    var x = chunk_words(p.qd_at, first_ch, tid);

    for (var n = chunks.x; n < chunks.y; n++) {
        let ch = n * heads + h;
        let next_ch = min(n + 1u, chunks.y - 1u) * heads + h;
        // Top: the previous update has read Kd and V'; S and W in.
        workgroupBarrier();
        store_rows_to_block(s, rg, cp);
        stage_words(false, tid, w);
        let u = u_pair(ch, rg, col);
        workgroupBarrier();

        // A: W S for chunk row rg, then V' = U - W S.
        let ws_halves = staged_half_products(false, rg, cp);
        hand_over_half(false, rg, cp, ws_halves);
        workgroupBarrier();
        block_v_new[rg * pairs + cp] = u - joined_half(false, rg, cp, ws_halves);
        let kd = chunk_words(p.kd_at, ch, tid);
        let pr = p_row(ch, rg);
        let decay = scratch[p.decay_at + ch].x;
        workgroupBarrier();
        stage_words(false, tid, x);
        workgroupBarrier();

        // B1: O = Qd S + P V'; the next chunk's W on its way.
        let qs_halves = staged_half_products(false, rg, cp);
        hand_over_half(false, rg, cp, qs_halves);
        workgroupBarrier();
        let qs = joined_half(false, rg, cp, qs_halves);
        w = chunk_words(p.w_at, next_ch, tid);
        store_o_row(n, h, rg, col, col_ok, add_new_value_products(qs, pr, cp));
        workgroupBarrier();
        stage_words(false, tid, kd);
        workgroupBarrier();

        // B2: S <- exp(G_last) S + Kd^T V'; the next chunk's Qd on its way.
        x = chunk_words(p.qd_at, next_ch, tid);
        s = update_rows(s, decay, rg, cp);
    }
    store_rows(slab, rg, col, col_ok, s);
}

@compute @workgroup_size(C * VT / 2u)
fn gdn_chunk_state_two_stages(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let pairs = VT / 2u;
    let cp = tid % pairs;
    let rg = tid / pairs;
    let h = wid.y;
    let heads = p.value_heads;
    let col = wid.x * VT + 2u * cp;
    let col_ok = vec2<bool>(col < p.value_dim, col + 1u < p.value_dim);
    let chunks = sequence_chunks(tid, wid.z);
    let slab = (wid.z * heads + h) * p.key_dim;
    var s = load_rows(slab, rg, col, col_ok);

    let first_ch = min(chunks.x, max(p.chunks, 1u) - 1u) * heads + h;
    var w = chunk_words(p.w_at, first_ch, tid);
    var x = chunk_words(p.qd_at, first_ch, tid);

    for (var n = chunks.x; n < chunks.y; n++) {
        let ch = n * heads + h;
        let next_ch = min(n + 1u, chunks.y - 1u) * heads + h;
        // Top: the previous chunk's o and update have read S, V' and Kd; S, W and Qd in.
        workgroupBarrier();
        store_rows_to_block(s, rg, cp);
        stage_words(false, tid, w);
        stage_words(true, tid, x);
        let u = u_pair(ch, rg, col);
        workgroupBarrier();

        // A: both products' halves; Kd and P on their way.
        let ws_halves = staged_half_products(false, rg, cp);
        let qs_halves = staged_half_products(true, rg, cp);
        hand_over_half(false, rg, cp, ws_halves);
        hand_over_half(true, rg, cp, qs_halves);
        let kd = chunk_words(p.kd_at, ch, tid);
        let pr = p_row(ch, rg);
        let decay = scratch[p.decay_at + ch].x;
        workgroupBarrier();

        // J: V' = U - W S; Kd where W was (every product has read W); the next W and Qd.
        block_v_new[rg * pairs + cp] = u - joined_half(false, rg, cp, ws_halves);
        let qs = joined_half(true, rg, cp, qs_halves);
        stage_words(false, tid, kd);
        w = chunk_words(p.w_at, next_ch, tid);
        x = chunk_words(p.qd_at, next_ch, tid);
        workgroupBarrier();

        // B: O = Qd S + P V'; S <- exp(G_last) S + Kd^T V'.
        store_o_row(n, h, rg, col, col_ok, add_new_value_products(qs, pr, cp));
        s = update_rows(s, decay, rg, cp);
    }
    store_rows(slab, rg, col, col_ok, s);
}

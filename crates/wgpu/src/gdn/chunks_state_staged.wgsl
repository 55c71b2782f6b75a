// The state pass of `chunks_state.wgsl` (both walks, the same walk units) for one shape: 32 row
// groups (ROW_GROUPS = CT), so each thread owns one chunk row rg for the products and the one
// 4-row block rg of S (rows 4 rg .. 4 rg + 3, so K <= 128), with K a multiple of 16 and 16-column tiles. Same math as `gdn_chunk_state`;
// W S and Qd S are summed as two halves over K (each thread sums rows rg and rg ^ 16 over one
// half, so each load of S serves two rows, then the halves meet through workgroup memory).
// Written without function-scope arrays: the state rows, the loaded words and the sums are
// named values. Every scratch matrix of the walk is read from workgroup memory: W, Qd and Kd of
// the chunk each go through registers into one buffer before their use. Each phase's loads of
// the scratch buffer (words for a later phase, U, the decay, P's row) are issued at its start,
// ahead of its products (the driver places loads itself; this order measured 3% faster on the
// H100 than issuing them after the products):
//
//   top:  S and W (loaded during the previous chunk's o) stored; barrier
//   A:    Kd, the decay and P's row issued; W S (halves joined: barrier), V' = U - W S
//         stored; barrier
//   B1:   the next W issued; Qd (loaded during the previous update) stored; barrier;
//         O = Qd S (halves joined: barrier) + P V' (S still in workgroup memory); barrier
//         Kd stored; barrier
//   B2:   the next Qd and U issued; S <- exp(G_last) S + Kd^T V'; barrier (next top)
//
// The three matrices take turns in one 16.5 KiB buffer, so the kernel needs ~29 KiB of workgroup
// memory (every adapter's 32 KiB holds it), at the price of eight barriers per chunk. The
// transition walk (WALK = 1) leaves out Qd and O, and with them two of the barriers.

// V' of the chunk, [CT][8]; the chunk's W, Qd or Kd. The tile of S (`block_s`, with
// `store_s_rows` and `staged_half_products`) is laid out by columns in staged_s_columns.wgsl
// ([16 columns][K / 4] of vec4, one load per four rows and column).
var<workgroup> block_v_new: array<vec2<f32>, 256>;
var<workgroup> staged: array<vec4<f32>, 1056>;
// The halves of W S and Qd S that a thread sums for another thread's row, [CT][8].
var<workgroup> half_sums: array<vec2<f32>, 256>;
// vec4 words between the staged matrix's rows beyond a row: one, so the rows that the four
// row groups of a subgroup read at once start in different banks.
const STAGE_PAD: u32 = 1u;

// Word e of a chunk's [CT][STATE_KP4] matrix into `staged` (the words past it, loaded again
// by the clamped reads, are dropped).
fn stage_word(e: u32, word: vec4<f32>) {
    if e < CT * STATE_KP4 {
        staged[(e / STATE_KP4) * (STATE_KP4 + STAGE_PAD) + e % STATE_KP4] = word;
    }
}

// P V' over the chunk rows 4 j4 .. 4 j4 + 3, for the word pw of P.
fn new_value_products(pw: vec4<f32>, j4: u32, cp: u32) -> vec2<f32> {
    let pairs = VT / 2u;
    return pw.x * block_v_new[(4u * j4) * pairs + cp] + pw.y * block_v_new[(4u * j4 + 1u) * pairs + cp]
        + pw.z * block_v_new[(4u * j4 + 2u) * pairs + cp] + pw.w * block_v_new[(4u * j4 + 3u) * pairs + cp];
}

// Word i of a scratch matrix [CT][kp4] of chunk-head ch at region offset `at`, clamped to the
// matrix (the words past it are loaded again and never read).
fn chunk_word(at: u32, ch: u32, i: u32, kp4: u32) -> vec4<f32> {
    let words = CT * kp4;
    return scratch[at + ch * words + min(i, words - 1u)];
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

// Four words per thread of a chunk's [CT][kp4] matrix into `staged`.
fn stage_words(threads: u32, tid: u32, a: vec4<f32>, b: vec4<f32>, c: vec4<f32>, d: vec4<f32>) {
    stage_word(tid, a);
    stage_word(tid + threads, b);
    stage_word(tid + 2u * threads, c);
    stage_word(tid + 3u * threads, d);
}

@compute @workgroup_size(CT * VT / 2u)
fn gdn_chunk_state_staged(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let pairs = VT / 2u;
    let threads = CT * VT / 2u;
    let cp = tid % pairs;
    let rg = tid / pairs;
    let h = wid.y;
    let unit = wid.z;
    let heads = p.value_heads;
    let vd = p.value_dim;
    let kp4 = STATE_KP4;
    let col = wid.x * VT + 2u * cp;
    let col_ok = walk_columns(col);
    let identity = identity_tile(wid.x * VT);
    let chunks = unit_chunks(tid, unit);

    let has_rows = rg < kp4;
    let r = 4u * rg;
    var s0 = entry_pair(unit, h, r, col, col_ok);
    var s1 = entry_pair(unit, h, r + 1u, col, col_ok);
    var s2 = entry_pair(unit, h, r + 2u, col, col_ok);
    var s3 = entry_pair(unit, h, r + 3u, col, col_ok);

    // The first chunk's W and Qd (a unit without chunks loads words it never uses).
    let first_ch = min(chunks.x, max(p.chunks, 1u) - 1u) * heads + h;
    var w0 = chunk_word(p.w_at, first_ch, tid, kp4);
    var w1 = chunk_word(p.w_at, first_ch, tid + threads, kp4);
    var w2 = chunk_word(p.w_at, first_ch, tid + 2u * threads, kp4);
    var w3 = chunk_word(p.w_at, first_ch, tid + 3u * threads, kp4);
    var x0 = chunk_word(p.qd_at, first_ch, tid, kp4);
    var x1 = chunk_word(p.qd_at, first_ch, tid + threads, kp4);
    var x2 = chunk_word(p.qd_at, first_ch, tid + 2u * threads, kp4);
    var x3 = chunk_word(p.qd_at, first_ch, tid + 3u * threads, kp4);

    var u_next = u_pair(first_ch, rg, col, identity);

    for (var n = chunks.x; n < chunks.y; n++) {
        let ch = n * heads + h;
        let next_ch = min(n + 1u, chunks.y - 1u) * heads + h;
        // Top: the previous update has read Kd and V'; S and W in.
        workgroupBarrier();
        if has_rows {
            store_s_rows(rg, cp, s0, s1, s2, s3);
        }
        stage_words(threads, tid, w0, w1, w2, w3);
        let u = u_next;
        workgroupBarrier();

        // A: W S for chunk row rg, then V' = U - W S; Kd, the decay and P's row on their way.
        let kd0 = chunk_word(p.kd_at, ch, tid, kp4);
        let kd1 = chunk_word(p.kd_at, ch, tid + threads, kp4);
        let kd2 = chunk_word(p.kd_at, ch, tid + 2u * threads, kp4);
        let kd3 = chunk_word(p.kd_at, ch, tid + 3u * threads, kp4);
        let decay = scratch[p.decay_at + ch].x;
        let p_row = p.p_at + (ch * CT + rg) * (CT / 4u);
        let p0 = scratch[p_row];
        let p1 = scratch[p_row + 1u];
        let p2 = scratch[p_row + 2u];
        let p3 = scratch[p_row + 3u];
        let p4 = scratch[p_row + 4u];
        let p5 = scratch[p_row + 5u];
        let p6 = scratch[p_row + 6u];
        let p7 = scratch[p_row + 7u];
        let ws = join_halves(rg, cp, staged_half_products(rg, kp4, cp));
        block_v_new[rg * pairs + cp] = u - ws;
        workgroupBarrier();

        // B1: O = Qd S + P V' (not in the transition walk); the next chunk's W on its way.
        w0 = chunk_word(p.w_at, next_ch, tid, kp4);
        w1 = chunk_word(p.w_at, next_ch, tid + threads, kp4);
        w2 = chunk_word(p.w_at, next_ch, tid + 2u * threads, kp4);
        w3 = chunk_word(p.w_at, next_ch, tid + 3u * threads, kp4);
        var qs = vec2<f32>(0.0);
        if WALK == 0u {
            stage_words(threads, tid, x0, x1, x2, x3);
            workgroupBarrier();
            qs = join_halves(rg, cp, staged_half_products(rg, kp4, cp));
            qs += new_value_products(p0, 0u, cp);
            qs += new_value_products(p1, 1u, cp);
            qs += new_value_products(p2, 2u, cp);
            qs += new_value_products(p3, 3u, cp);
            qs += new_value_products(p4, 4u, cp);
            qs += new_value_products(p5, 5u, cp);
            qs += new_value_products(p6, 6u, cp);
            qs += new_value_products(p7, 7u, cp);
            let start = chunk_info[2u * n];
            let len = chunk_info[2u * n + 1u];
            if rg < len && col_ok.x {
                store_o(((start + rg) * heads + h) * vd + col, qs, col_ok.y);
            }
        }
        workgroupBarrier();
        stage_words(threads, tid, kd0, kd1, kd2, kd3);
        workgroupBarrier();

        // B2: S <- exp(G_last) S + Kd^T V'; the next chunk's Qd and U on their way.
        x0 = chunk_word(p.qd_at, next_ch, tid, kp4);
        x1 = chunk_word(p.qd_at, next_ch, tid + threads, kp4);
        x2 = chunk_word(p.qd_at, next_ch, tid + 2u * threads, kp4);
        x3 = chunk_word(p.qd_at, next_ch, tid + 3u * threads, kp4);
        u_next = u_pair(next_ch, rg, col, identity);
        s0 *= decay;
        s1 *= decay;
        s2 *= decay;
        s3 *= decay;
        if has_rows {
            for (var j4 = 0u; j4 < CT; j4 += 4u) {
                let k0 = staged[j4 * (kp4 + STAGE_PAD) + rg];
                let k1 = staged[(j4 + 1u) * (kp4 + STAGE_PAD) + rg];
                let k2 = staged[(j4 + 2u) * (kp4 + STAGE_PAD) + rg];
                let k3 = staged[(j4 + 3u) * (kp4 + STAGE_PAD) + rg];
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
        let checkpoint = checkpoint_after(n);
        if checkpoint != NO_CHECKPOINT {
            store_checkpoint_pair(checkpoint, h, r, col, col_ok, s0);
            store_checkpoint_pair(checkpoint, h, r + 1u, col, col_ok, s1);
            store_checkpoint_pair(checkpoint, h, r + 2u, col, col_ok, s2);
            store_checkpoint_pair(checkpoint, h, r + 3u, col, col_ok, s3);
        }
    }

    store_exit_pair(unit, h, r, col, col_ok, s0);
    store_exit_pair(unit, h, r + 1u, col, col_ok, s1);
    store_exit_pair(unit, h, r + 2u, col, col_ok, s2);
    store_exit_pair(unit, h, r + 3u, col, col_ok, s3);
}

// The state pass of `chunks_state.wgsl` (both walks, the same walk units and state I/O) on
// cooperative matrices (tensor cores; `crate::coop`), for K = 64 or 128 and 16-column tiles.
// Every product is f32-accurate from f16 halves, three 16 x 16 x 16 products per step
// (coop_split_step.wgsl; tools/coop-lab/emulate.py: as accurate as the f32 pass).
//
// A workgroup of four subgroups of 32 (the device is opened with cooperative matrices only
// where subgroups are 32 wide) keeps the tile of S in f32 workgroup memory and, per chunk:
//
//   S's halves, W's rows as halves; barrier
//   W S: subgroup g takes rows 16 (g & 1) over half (g >> 1) of K; partial sums stored; barrier
//   V' = U - W S in f32 and halves; Qd's rows as halves; barrier
//   Qd S as W S (outputs walk only); barrier; P's rows as halves; barrier
//   P V': subgroup g takes rows 16 (g & 1) over chunk rows 16 (g >> 1); o = Qd S + P V' stored
//   Kd's rows as halves; barrier
//   S <- exp(G_last) S + Kd^T V': subgroup g updates rows 16 (g + 4 i) of S (Kd^T read by a
//   column-major load of Kd's rows); barrier
//
// Control flow stays uniform: subgroups differ only in the offsets of their loads and stores.
// Workgroup memory: 44 KiB (NVIDIA's 48 KiB holds it). The halves carry f32's precision, not
// its range: an operand beyond f16's (65504) becomes infinite, and the call's result check
// then refuses it. Every phase hands data between plain and cooperative accesses through
// workgroup barriers, so the kernel is exposed to naga's missing memory-model availability
// operations (wgpu issue 8805; see crate::coop).

const CO_THREADS: u32 = 128u;
// Row strides in f16 elements of the staged A rows (K <= 128 columns) and of S's and V''s
// halves (16 columns), 16 bytes past a row so the rows of a tile start in different banks.
const A_STRIDE: u32 = 136u;
const B_STRIDE: u32 = 24u;

// S [K <= 128][16] f32; its halves [128][B_STRIDE].
var<workgroup> co_s: array<f32, 2048>;
var<workgroup> co_s_hi: array<f16, 3072>;
var<workgroup> co_s_lo: array<f16, 3072>;
// The chunk's W, Qd, Kd or P rows as halves, [32][A_STRIDE].
var<workgroup> co_a_hi: array<f16, 4352>;
var<workgroup> co_a_lo: array<f16, 4352>;
// V' as halves, [32][B_STRIDE].
var<workgroup> co_v_hi: array<f16, 768>;
var<workgroup> co_v_lo: array<f16, 768>;
// The two partial sums of a 32 x 16 product, [2][32][16].
var<workgroup> co_part: array<f32, 1024>;

fn co_split_s(at: u32, x: f32) {
    let halves = split_f16(x);
    co_s_hi[at] = halves.x;
    co_s_lo[at] = halves.y;
}

fn co_split_a(at: u32, x: f32) {
    let halves = split_f16(x);
    co_a_hi[at] = halves.x;
    co_a_lo[at] = halves.y;
}

fn co_split_v(at: u32, x: f32) {
    let halves = split_f16(x);
    co_v_hi[at] = halves.x;
    co_v_lo[at] = halves.y;
}

// Rows of a chunk's [CT][STATE_KP4] scratch matrix at region offset `at` (chunk-head ch) into
// co_a_hi / co_a_lo.
fn co_stage_rows(tid: u32, at: u32, ch: u32) {
    let words = CT * STATE_KP4;
    for (var e = tid; e < words; e += CO_THREADS) {
        let w = scratch[at + ch * words + e];
        let base = (e / STATE_KP4) * A_STRIDE + 4u * (e % STATE_KP4);
        co_split_a(base, w.x);
        co_split_a(base + 1u, w.y);
        co_split_a(base + 2u, w.z);
        co_split_a(base + 3u, w.w);
    }
}

// P of chunk-head ch ([CT][CT], eight vec4 words a row) into co_a_hi / co_a_lo.
fn co_stage_p(tid: u32, ch: u32) {
    for (var e = tid; e < CT * CT / 4u; e += CO_THREADS) {
        let w = scratch[p.p_at + ch * CT * CT / 4u + e];
        let base = (e / 8u) * A_STRIDE + 4u * (e % 8u);
        co_split_a(base, w.x);
        co_split_a(base + 1u, w.y);
        co_split_a(base + 2u, w.z);
        co_split_a(base + 3u, w.w);
    }
}

// The staged rows 16 (g & 1) .. + 16 times S over K's half g >> 1, into co_part (every
// subgroup calls it).
fn co_rows_times_s(g: u32) {
    let row0 = (g & 1u) * 16u;
    let half = 2u * STATE_KP4;
    let k_first = (g >> 1u) * half;
    var high = coop_mat16x16<f32, C>();
    var cross = coop_mat16x16<f32, C>();
    for (var step = 0u; step < half; step += 16u) {
        let k0 = k_first + step;
        let a_hi = coopLoadT<coop_mat16x16<f16, A>>(&co_a_hi[row0 * A_STRIDE + k0], A_STRIDE);
        let a_lo = coopLoadT<coop_mat16x16<f16, A>>(&co_a_lo[row0 * A_STRIDE + k0], A_STRIDE);
        let b_hi = coopLoadT<coop_mat16x16<f16, B>>(&co_s_hi[k0 * B_STRIDE], B_STRIDE);
        let b_lo = coopLoadT<coop_mat16x16<f16, B>>(&co_s_lo[k0 * B_STRIDE], B_STRIDE);
        add_split_products(&high, &cross, a_hi, a_lo, b_hi, b_lo);
    }
    coopStoreT(split_sum(high, cross), &co_part[(g >> 1u) * 512u + row0 * 16u], 16u);
}

@compute @workgroup_size(CO_THREADS)
fn gdn_chunk_state_coop(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(subgroup_id) g: u32,
) {
    let h = wid.y;
    let unit = wid.z;
    let heads = p.value_heads;
    let vd = p.value_dim;
    // K (64 or 128: a multiple of 4, so STATE_KP4 fixes it and the loops' trip counts).
    let kd = 4u * STATE_KP4;
    let col0 = wid.x * 16u;
    let identity = identity_tile(col0);
    let chunks = unit_chunks(tid, unit);

    // The entry state, a column pair per item.
    for (var e = tid; e < kd * 8u; e += CO_THREADS) {
        let r = e / 8u;
        let col = col0 + 2u * (e % 8u);
        let x = entry_pair(unit, h, r, col, walk_columns(col));
        co_s[r * 16u + 2u * (e % 8u)] = x.x;
        co_s[r * 16u + 2u * (e % 8u) + 1u] = x.y;
    }
    workgroupBarrier();

    for (var n = chunks.x; n < chunks.y; n++) {
        let ch = n * heads + h;
        let decay = scratch[p.decay_at + ch].x;
        // S's halves and W's rows.
        for (var e = tid; e < kd * 16u; e += CO_THREADS) {
            co_split_s((e / 16u) * B_STRIDE + e % 16u, co_s[e]);
        }
        co_stage_rows(tid, p.w_at, ch);
        workgroupBarrier();

        // W S, then V' = U - W S (the two halves of K summed here).
        co_rows_times_s(g);
        workgroupBarrier();
        for (var e = tid; e < CT * 8u; e += CO_THREADS) {
            let row = e / 8u;
            let cp = e % 8u;
            let at = row * 16u + 2u * cp;
            let ws = vec2<f32>(co_part[at] + co_part[512u + at], co_part[at + 1u] + co_part[513u + at]);
            let v_new = u_pair(ch, row, col0 + 2u * cp, identity) - ws;
            co_split_v(row * B_STRIDE + 2u * cp, v_new.x);
            co_split_v(row * B_STRIDE + 2u * cp + 1u, v_new.y);
        }
        if WALK == 0u {
            co_stage_rows(tid, p.qd_at, ch);
            workgroupBarrier();

            // O = Qd S + P V': each subgroup's half of Qd S, then its share of P V' added.
            co_rows_times_s(g);
            workgroupBarrier();
            co_stage_p(tid, ch);
            workgroupBarrier();
            let row0 = (g & 1u) * 16u;
            let j0 = (g >> 1u) * 16u;
            var high = coopLoadT<coop_mat16x16<f32, C>>(&co_part[(g >> 1u) * 512u + row0 * 16u], 16u);
            var cross = coop_mat16x16<f32, C>();
            let a_hi = coopLoadT<coop_mat16x16<f16, A>>(&co_a_hi[row0 * A_STRIDE + j0], A_STRIDE);
            let a_lo = coopLoadT<coop_mat16x16<f16, A>>(&co_a_lo[row0 * A_STRIDE + j0], A_STRIDE);
            let b_hi = coopLoadT<coop_mat16x16<f16, B>>(&co_v_hi[j0 * B_STRIDE], B_STRIDE);
            let b_lo = coopLoadT<coop_mat16x16<f16, B>>(&co_v_lo[j0 * B_STRIDE], B_STRIDE);
            add_split_products(&high, &cross, a_hi, a_lo, b_hi, b_lo);
            // Each subgroup's partial (its half of K for Qd S, its chunk rows for P V') back
            // in its place; o is the two partials' sum.
            coopStoreT(split_sum(high, cross), &co_part[(g >> 1u) * 512u + row0 * 16u], 16u);
            workgroupBarrier();
            let start = chunk_info[2u * n];
            let len = chunk_info[2u * n + 1u];
            for (var e = tid; e < CT * 8u; e += CO_THREADS) {
                let row = e / 8u;
                let cp = e % 8u;
                let col = col0 + 2u * cp;
                let col_ok = walk_columns(col);
                let at = row * 16u + 2u * cp;
                if row < len && col_ok.x {
                    let o_pair = vec2<f32>(co_part[at] + co_part[512u + at], co_part[at + 1u] + co_part[513u + at]);
                    store_o(((start + row) * heads + h) * vd + col, o_pair, col_ok.y);
                }
            }
        }

        // S <- exp(G_last) S + Kd^T V': Kd^T's rows are Kd's columns (a column-major load of
        // the staged Kd rows).
        workgroupBarrier();
        co_stage_rows(tid, p.kd_at, ch);
        workgroupBarrier();
        for (var i = 0u; i < kd / 64u; i++) {
            let r0 = 16u * (g + 4u * i);
            var high = coopLoadT<coop_mat16x16<f32, C>>(&co_s[r0 * 16u], 16u) * decay;
            var cross = coop_mat16x16<f32, C>();
            for (var j0 = 0u; j0 < CT; j0 += 16u) {
                let a_hi = coopLoad<coop_mat16x16<f16, A>>(&co_a_hi[j0 * A_STRIDE + r0], A_STRIDE);
                let a_lo = coopLoad<coop_mat16x16<f16, A>>(&co_a_lo[j0 * A_STRIDE + r0], A_STRIDE);
                let b_hi = coopLoadT<coop_mat16x16<f16, B>>(&co_v_hi[j0 * B_STRIDE], B_STRIDE);
                let b_lo = coopLoadT<coop_mat16x16<f16, B>>(&co_v_lo[j0 * B_STRIDE], B_STRIDE);
                add_split_products(&high, &cross, a_hi, a_lo, b_hi, b_lo);
            }
            coopStoreT(split_sum(high, cross), &co_s[r0 * 16u], 16u);
        }
        workgroupBarrier();
    }

    for (var e = tid; e < kd * 8u; e += CO_THREADS) {
        let r = e / 8u;
        let col = col0 + 2u * (e % 8u);
        let x = vec2<f32>(co_s[r * 16u + 2u * (e % 8u)], co_s[r * 16u + 2u * (e % 8u) + 1u]);
        store_exit_pair(unit, h, r, col, walk_columns(col), x);
    }
}

// The state pass of the two-pass chunked prefill (the math is at the top of chunks.wgsl):
// `gdn_chunk_state`, and the walk units and state I/O that it, `gdn_chunk_state_staged` and
// `gdn_chunk_combine` share.
//
// Walk units. Each workgroup walks the chunks of one unit: a whole sequence, or, for a sequence
// split into segments (a two-level scan over its chunks), one segment. A segment's walk is
// linear in its entry state: S_exit = M S_entry + D, with M the product of the chunks' maps
// S -> exp(G_last) S - Kd^T W S (K x K) and D the exit state from a zero entry. A split
// sequence takes three dispatches:
//   1. the transition walk (WALK = 1) over V + K columns of every segment but the last (its
//      grid covers every unit; the others walk no chunks): the value columns from a zero state
//      give D, the K identity columns (from value_pad on, U taken as zero) give M, both stored
//      in walk_states; no o;
//   2. `gdn_chunk_combine`: the entry state of every segment, S_0 the initial state and
//      S_{s+1} = M_s S_s + D_s, stored in walk_states;
//   3. the outputs walk (WALK = 0) of every segment at once, from its entry state; the last
//      segment stores the final state.
// A unit that is a whole sequence reads its initial state from `state` and writes its final
// state there in place (one workgroup reads and writes a tile); the segments of a split
// sequence read their entry states from walk_states, so no workgroup reads `state` while another
// writes it.

// Fields of a walk unit's record in chunk_info (after the chunk records): its chunks
// [first, end), its sequence, its index among the sequence's units and their count, and its
// slot in walk_states (the units of split sequences numbered in order; unused for a whole one).
const UNIT_FIRST: u32 = 0u;
const UNIT_END: u32 = 1u;
const UNIT_SEQ: u32 = 2u;
const UNIT_INDEX: u32 = 3u;
const UNIT_COUNT: u32 = 4u;
const UNIT_SLOT: u32 = 5u;
const UNIT_FIELDS: u32 = 6u;

// 0: the outputs walk; 1: the transition walk (no o; the exit state to walk_states).
override WALK: u32 = 0u;
// 1: the outputs walk also stores its state after every chunk that chunk_checkpoint names (the
// state checkpoints of the call); 0: no checkpoint code (every other walk).
override CKPT: u32 = 0u;
const NO_CHECKPOINT: u32 = 0xffffffffu;

// [N, H, K, V] f32: the initial states in, the final states out.
@group(0) @binding(8) var<storage, read_write> state: array<f32>;
// o (binding 9) and its `store_o` come from the file included beside this one: chunks_o.wgsl
// (atomic words, with store_o.wgsl) or, in the cooperative-matrix module, chunks_o_plain.wgsl.
// For a call with a split sequence, by the slots of its units: the transitions
// [slots, H, K, trans_width] (D in columns 0 .. V, M in columns value_pad .. value_pad + K),
// then from entry_at the entry states [slots, H, K, V]; else a placeholder that no walk reads.
@group(0) @binding(10) var<storage, read_write> walk_states: array<f32>;
// [C, H, K, V] f32 state checkpoints, and per chunk of chunk_info the checkpoint row taken after
// it or NO_CHECKPOINT (the general and staged walks; placeholders where CKPT is 0).
@group(0) @binding(11) var<storage, read_write> checkpoints: array<f32>;
@group(0) @binding(12) var<storage, read> chunk_checkpoint: array<u32>;

fn unit_field(unit: u32, field: u32) -> u32 {
    return chunk_info[2u * p.chunks + UNIT_FIELDS * unit + field];
}

// Whether the tile whose first column is col0 holds identity columns (transition walk only).
fn identity_tile(col0: u32) -> bool {
    return WALK == 1u && col0 >= p.value_pad;
}

// Whether the walk's columns col and col + 1 exist: value columns below V, or in an identity
// tile the K columns of the identity.
fn walk_columns(col: u32) -> vec2<bool> {
    if identity_tile(col) {
        let c = col - p.value_pad;
        return vec2<bool>(c < p.key_dim, c + 1u < p.key_dim);
    }
    return vec2<bool>(col < p.value_dim, col + 1u < p.value_dim);
}

// Row r of unit `unit`'s entry state for head h at columns col, col + 1 (zeros past K and the
// columns).
fn entry_pair(unit: u32, h: u32, r: u32, col: u32, col_ok: vec2<bool>) -> vec2<f32> {
    if r >= p.key_dim || !col_ok.x {
        return vec2<f32>(0.0);
    }
    if WALK == 1u {
        if col < p.value_pad {
            return vec2<f32>(0.0);
        }
        let c = col - p.value_pad;
        return vec2<f32>(select(0.0, 1.0, r == c), select(0.0, 1.0, col_ok.y && r == c + 1u));
    }
    let heads = p.value_heads;
    if unit_field(unit, UNIT_COUNT) == 1u {
        return state_pair((unit_field(unit, UNIT_SEQ) * heads + h) * p.key_dim, r, col, col_ok);
    }
    let slot = unit_field(unit, UNIT_SLOT);
    let at = p.entry_at + ((slot * heads + h) * p.key_dim + r) * p.value_dim + col;
    var x = vec2<f32>(walk_states[at], 0.0);
    if col_ok.y {
        x.y = walk_states[at + 1u];
    }
    return x;
}

// Stores row r of unit `unit`'s exit state for head h at columns col, col + 1: the transition
// walk's into walk_states (for a split sequence's units), the outputs walk's into `state` for a
// sequence's last unit.
fn store_exit_pair(unit: u32, h: u32, r: u32, col: u32, col_ok: vec2<bool>, x: vec2<f32>) {
    if r >= p.key_dim || !col_ok.x {
        return;
    }
    let heads = p.value_heads;
    if WALK == 1u {
        if unit_field(unit, UNIT_COUNT) == 1u {
            return;
        }
        let slot = unit_field(unit, UNIT_SLOT);
        let at = ((slot * heads + h) * p.key_dim + r) * p.trans_width + col;
        walk_states[at] = x.x;
        if col_ok.y {
            walk_states[at + 1u] = x.y;
        }
        return;
    }
    if unit_field(unit, UNIT_INDEX) + 1u == unit_field(unit, UNIT_COUNT) {
        store_state_pair((unit_field(unit, UNIT_SEQ) * heads + h) * p.key_dim, r, col, col_ok, x);
    }
}

// The checkpoint row taken after chunk n, or NO_CHECKPOINT (always, unless CKPT is 1).
fn checkpoint_after(n: u32) -> u32 {
    if WALK == 0u && CKPT == 1u {
        return chunk_checkpoint[n];
    }
    return NO_CHECKPOINT;
}

// Stores row r of a state at columns col, col + 1 as checkpoint `row`, head h.
fn store_checkpoint_pair(row: u32, h: u32, r: u32, col: u32, col_ok: vec2<bool>, x: vec2<f32>) {
    if r >= p.key_dim || !col_ok.x {
        return;
    }
    let at = ((row * p.value_heads + h) * p.key_dim + r) * p.value_dim + col;
    checkpoints[at] = x.x;
    if col_ok.y {
        checkpoints[at + 1u] = x.y;
    }
}

// U of chunk-head ch, chunk row `row`, at columns col, col + 1 (zeros in an identity tile).
fn u_pair(ch: u32, row: u32, col: u32, identity: bool) -> vec2<f32> {
    if identity {
        return vec2<f32>(0.0);
    }
    let u4 = scratch[p.u_at + (ch * CT + row) * p.vp4 + col / 4u];
    return select(u4.xy, u4.zw, (col & 2u) != 0u);
}


// ---- gdn_chunk_state ----

// The tile of S, [K rounded up to 4][VT / 2] column pairs.
var<workgroup> s_tile: array<vec2<f32>, 2048>;
// V' of the chunk, [CT][VT / 2].
var<workgroup> v_new: array<vec2<f32>, 512>;
var<workgroup> unit_span: vec2<u32>;

// The chunks [first, end) of walk unit `unit`, read by thread 0 and made uniform for the walk
// (every thread calls it, in uniform control flow). The transition walk of a sequence's last
// unit walks none (its map is not needed).
fn unit_chunks(tid: u32, unit: u32) -> vec2<u32> {
    if tid == 0u {
        let first = unit_field(unit, UNIT_FIRST);
        let last = unit_field(unit, UNIT_INDEX) + 1u == unit_field(unit, UNIT_COUNT);
        unit_span = vec2<u32>(first, select(unit_field(unit, UNIT_END), first, WALK == 1u && last));
    }
    return workgroupUniformLoad(&unit_span);
}

// Row r of the state slab at columns col, col + 1 (zeros past K and V).
fn state_pair(slab: u32, r: u32, col: u32, col_ok: vec2<bool>) -> vec2<f32> {
    var x = vec2<f32>(0.0);
    if r < p.key_dim && col_ok.x {
        let at = (slab + r) * p.value_dim + col;
        x.x = state[at];
        if col_ok.y {
            x.y = state[at + 1u];
        }
    }
    return x;
}

fn store_state_pair(slab: u32, r: u32, col: u32, col_ok: vec2<bool>, x: vec2<f32>) {
    if r < p.key_dim && col_ok.x {
        let at = (slab + r) * p.value_dim + col;
        state[at] = x.x;
        if col_ok.y {
            state[at + 1u] = x.y;
        }
    }
}

// Thread (rg, cp) of ROW_GROUPS * VT / 2 (cp = column pair, rg = 0..ROW_GROUPS): the products
// for chunk rows CHUNK_ROWS rg .. CHUNK_ROWS (rg + 1) - 1 and its two columns; the state rows of
// blocks rg + ROW_GROUPS m (4 rows each).
@compute @workgroup_size(ROW_GROUPS * VT / 2u)
fn gdn_chunk_state(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let pairs = VT / 2u;
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

    var s: array<vec2<f32>, 32>;
    for (var m = 0u; m < ROW_BLOCKS; m++) {
        let b = rg + ROW_GROUPS * m;
        for (var e = 0u; e < 4u; e++) {
            s[4u * m + e] = entry_pair(unit, h, 4u * b + e, col, col_ok);
        }
    }

    for (var n = chunks.x; n < chunks.y; n++) {
        let ch = n * heads + h;
        // The tile of S where every thread reads it.
        for (var m = 0u; m < ROW_BLOCKS; m++) {
            let b = rg + ROW_GROUPS * m;
            if b < kp4 {
                for (var e = 0u; e < 4u; e++) {
                    s_tile[(4u * b + e) * pairs + cp] = s[4u * m + e];
                }
            }
        }
        workgroupBarrier();

        // W S and Qd S for this thread's four rows.
        var ws: array<vec2<f32>, 4>;
        var qs: array<vec2<f32>, 4>;
        let w_row = p.w_at + (ch * CT + CHUNK_ROWS * rg) * kp4;
        let q_row = p.qd_at + (ch * CT + CHUNK_ROWS * rg) * kp4;
        for (var r4 = 0u; r4 < kp4; r4++) {
            let s0 = s_tile[(4u * r4) * pairs + cp];
            let s1 = s_tile[(4u * r4 + 1u) * pairs + cp];
            let s2 = s_tile[(4u * r4 + 2u) * pairs + cp];
            let s3 = s_tile[(4u * r4 + 3u) * pairs + cp];
            for (var i = 0u; i < CHUNK_ROWS; i++) {
                let w = scratch[w_row + i * kp4 + r4];
                let x = scratch[q_row + i * kp4 + r4];
                ws[i] += w.x * s0 + w.y * s1 + w.z * s2 + w.w * s3;
                qs[i] += x.x * s0 + x.y * s1 + x.z * s2 + x.w * s3;
            }
        }
        // V' = U - W S.
        for (var i = 0u; i < CHUNK_ROWS; i++) {
            let row = CHUNK_ROWS * rg + i;
            v_new[row * pairs + cp] = u_pair(ch, row, col, identity) - ws[i];
        }
        workgroupBarrier();

        // O = Qd S + P V' (the transition walk leaves it to the compiler to drop).
        let start = chunk_info[2u * n];
        let len = chunk_info[2u * n + 1u];
        let p_row = p.p_at + (ch * CT + CHUNK_ROWS * rg) * (CT / 4u);
        for (var j4 = 0u; j4 < CT / 4u; j4++) {
            let v0 = v_new[(4u * j4) * pairs + cp];
            let v1 = v_new[(4u * j4 + 1u) * pairs + cp];
            let v2 = v_new[(4u * j4 + 2u) * pairs + cp];
            let v3 = v_new[(4u * j4 + 3u) * pairs + cp];
            for (var i = 0u; i < CHUNK_ROWS; i++) {
                let pw = scratch[p_row + i * (CT / 4u) + j4];
                qs[i] += pw.x * v0 + pw.y * v1 + pw.z * v2 + pw.w * v3;
            }
        }
        for (var i = 0u; i < CHUNK_ROWS; i++) {
            let row = CHUNK_ROWS * rg + i;
            if WALK == 0u && row < len && col_ok.x {
                store_o(((start + row) * heads + h) * vd + col, qs[i], col_ok.y);
            }
        }

        // S <- exp(G_last) S + Kd^T V'.
        let decay = scratch[p.decay_at + ch].x;
        for (var m = 0u; m < ROW_BLOCKS; m++) {
            for (var e = 0u; e < 4u; e++) {
                s[4u * m + e] *= decay;
            }
        }
        let kd_base = p.kd_at + ch * CT * kp4;
        for (var jj = 0u; jj < CT; jj++) {
            let vj = v_new[jj * pairs + cp];
            for (var m = 0u; m < ROW_BLOCKS; m++) {
                let b = rg + ROW_GROUPS * m;
                if b < kp4 {
                    let kv = scratch[kd_base + jj * kp4 + b];
                    s[4u * m] += kv.x * vj;
                    s[4u * m + 1u] += kv.y * vj;
                    s[4u * m + 2u] += kv.z * vj;
                    s[4u * m + 3u] += kv.w * vj;
                }
            }
        }
        let checkpoint = checkpoint_after(n);
        if checkpoint != NO_CHECKPOINT {
            for (var m = 0u; m < ROW_BLOCKS; m++) {
                let b = rg + ROW_GROUPS * m;
                for (var e = 0u; e < 4u; e++) {
                    store_checkpoint_pair(checkpoint, h, 4u * b + e, col, col_ok, s[4u * m + e]);
                }
            }
        }
        // The next chunk writes s_tile and v_new only after its first barrier, which every
        // thread reaches after this chunk's reads.
    }

    for (var m = 0u; m < ROW_BLOCKS; m++) {
        let b = rg + ROW_GROUPS * m;
        for (var e = 0u; e < 4u; e++) {
            store_exit_pair(unit, h, 4u * b + e, col, col_ok, s[4u * m + e]);
        }
    }
}

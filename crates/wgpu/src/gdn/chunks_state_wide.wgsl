// The state pass of `chunks_state.wgsl` (both walks, the same walk units) with 32-column tiles
// and 256 threads: thread (rg, cq) owns rows 4 rg .. 4 rg + 3 of S at the four columns
// 4 cq .. 4 cq + 3 (so K <= 128, a multiple of 16) for the update, and threads 0 .. 127 form
// the products of chunk rows 2 rg and 2 rg + 1 at those columns. Same math as `gdn_chunk_state`.
// The products read workgroup memory, whose load pipe bounds the walk: per 4 x 4 block of W
// (or Qd) and S, 32 floats for 64 multiply-adds, where the 16-column staged kernel reads 16
// floats for 16 (each staged word feeds two chunk rows and four columns here, two and two there).
//
// W, Qd and Kd go through workgroup memory in two pieces each (W and Qd by halves of K, Kd by
// halves of the chunk's rows), one 8.5 KiB buffer in turn, so the kernel fits 32 KiB of
// workgroup memory (the tile of S 16 KiB, V' 4 KiB). Each piece's words are loaded into
// registers while the piece before it is used. Per chunk, with a barrier after each step:
//
//   S stored; W's first half staged      W S over it, U loaded
//   W's second half staged               W S over it; V' = U - W S stored
//   Qd's halves in turn (outputs walk)   O = Qd S + P V' stored
//   Kd's halves in turn                  S <- exp(G_last) S + Kd^T V'
//
// The transition walk (WALK = 1) leaves out Qd and O.

// Pieces per staged matrix (each thread stages two vec4 words of a piece).
const WIDE_PIECES: u32 = 2u;
const WIDE_THREADS: u32 = 256u;
const WIDE_QUADS: u32 = 8u;

// The tile of S by rows: [K][8] vec4 words, word cq holding columns 4 cq .. 4 cq + 3.
var<workgroup> wide_s: array<vec4<f32>, 1024>;
// V' of the chunk, [CT][8] vec4 words.
var<workgroup> wide_v: array<vec4<f32>, 256>;
// One piece of W or Qd ([CT][KP4 / 2 + 1]: rows one word apart beyond their length, so the four
// rows a subgroup reads at once start in different banks) or of Kd ([CT / 2][KP4 + 1]).
var<workgroup> wide_staged: array<vec4<f32>, 544>;

// Matrices of the scratch buffer that the walk stages.
const WIDE_W: u32 = 0u;
const WIDE_QD: u32 = 1u;
const WIDE_KD: u32 = 2u;

// Staged element e of piece `piece` of matrix `which` of chunk-head ch: its word in the scratch
// buffer (clamped to the matrix; elements past the piece are loaded and never stored) and its
// place in `wide_staged`, as (source word, destination, whether it is in the piece).
fn wide_piece_place(which: u32, ch: u32, piece: u32, e: u32) -> vec3<u32> {
    let kp4 = STATE_KP4;
    var at = p.w_at;
    if which == WIDE_QD {
        at = p.qd_at;
    } else if which == WIDE_KD {
        at = p.kd_at;
    }
    let base = at + ch * CT * kp4;
    let count = CT * kp4 / WIDE_PIECES;
    let i = min(e, count - 1u);
    if which == WIDE_KD {
        // Rows piece * CT / 2 .. of the chunk, whole.
        let row = i / kp4;
        let word = i % kp4;
        return vec3<u32>(
            base + (piece * (CT / WIDE_PIECES) + row) * kp4 + word,
            row * (kp4 + 1u) + word,
            u32(e < count),
        );
    }
    // Every row of the chunk, words piece * KP4 / 2 ...
    let half = kp4 / WIDE_PIECES;
    let row = i / half;
    let word = i % half;
    return vec3<u32>(base + row * kp4 + piece * half + word, row * (half + 1u) + word, u32(e < count));
}

fn wide_load(which: u32, ch: u32, piece: u32, e: u32) -> vec4<f32> {
    return scratch[wide_piece_place(which, ch, piece, e).x];
}

fn wide_stage(which: u32, piece: u32, e: u32, word: vec4<f32>) {
    // The destination does not depend on the chunk.
    let place = wide_piece_place(which, 0u, piece, e);
    if place.z == 1u {
        wide_staged[place.y] = word;
    }
}

// Two chunk rows' products at four columns.
struct WideRows {
    a: vec4<f32>,
    b: vec4<f32>,
}

// Chunk rows 2 rp and 2 rp + 1 of the staged piece of W or Qd times the tile of S, at columns
// 4 cq .. 4 cq + 3, added to `sum`: per word of the piece, two loads of W and four of S for 32
// multiply-adds.
fn wide_products(rp: u32, cq: u32, piece: u32, sum: WideRows) -> WideRows {
    let half = STATE_KP4 / WIDE_PIECES;
    let row_a = (2u * rp) * (half + 1u);
    let row_b = row_a + half + 1u;
    var acc = sum;
    for (var w = 0u; w < half; w++) {
        let xa = wide_staged[row_a + w];
        let xb = wide_staged[row_b + w];
        let k = 4u * (piece * half + w);
        let s0 = wide_s[k * WIDE_QUADS + cq];
        let s1 = wide_s[(k + 1u) * WIDE_QUADS + cq];
        let s2 = wide_s[(k + 2u) * WIDE_QUADS + cq];
        let s3 = wide_s[(k + 3u) * WIDE_QUADS + cq];
        acc.a += xa.x * s0 + xa.y * s1 + xa.z * s2 + xa.w * s3;
        acc.b += xb.x * s0 + xb.y * s1 + xb.z * s2 + xb.w * s3;
    }
    return acc;
}

// U of chunk-head ch, chunk row `row`, at columns col .. col + 3 (col a multiple of 4; zeros in
// an identity tile and past V).
fn u_quad(ch: u32, row: u32, col: u32, identity: bool) -> vec4<f32> {
    if identity || col >= p.value_dim {
        return vec4<f32>(0.0);
    }
    return scratch[p.u_at + (ch * CT + row) * p.vp4 + col / 4u];
}

// O's chunk row `row` (of a chunk of `len` rows from token `start`) at columns col .. col + 3.
fn wide_store_o(start: u32, len: u32, row: u32, h: u32, col: u32, ok_a: vec2<bool>, ok_b: vec2<bool>, x: vec4<f32>) {
    if row < len {
        let at = ((start + row) * p.value_heads + h) * p.value_dim + col;
        if ok_a.x {
            store_o(at, x.xy, ok_a.y);
        }
        if ok_b.x {
            store_o(at + 2u, x.zw, ok_b.y);
        }
    }
}

@compute @workgroup_size(256)
fn gdn_chunk_state_wide(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let cq = tid % WIDE_QUADS;
    let rg = tid / WIDE_QUADS;
    let h = wid.y;
    let unit = wid.z;
    let heads = p.value_heads;
    let vd = p.value_dim;
    let col = wid.x * 32u + 4u * cq;
    let ok_a = walk_columns(col);
    let ok_b = walk_columns(col + 2u);
    let identity = identity_tile(wid.x * 32u);
    let chunks = unit_chunks(tid, unit);
    let e0 = tid;
    let e1 = tid + WIDE_THREADS;

    let has_rows = rg < STATE_KP4;
    let products = tid < WIDE_THREADS / 2u;
    let r = 4u * rg;
    var s0 = vec4<f32>(entry_pair(unit, h, r, col, ok_a), entry_pair(unit, h, r, col + 2u, ok_b));
    var s1 = vec4<f32>(entry_pair(unit, h, r + 1u, col, ok_a), entry_pair(unit, h, r + 1u, col + 2u, ok_b));
    var s2 = vec4<f32>(entry_pair(unit, h, r + 2u, col, ok_a), entry_pair(unit, h, r + 2u, col + 2u, ok_b));
    var s3 = vec4<f32>(entry_pair(unit, h, r + 3u, col, ok_a), entry_pair(unit, h, r + 3u, col + 2u, ok_b));

    // The words of the next piece to stage, loaded one step ahead (a unit without chunks loads
    // words it never uses).
    let first_ch = min(chunks.x, max(p.chunks, 1u) - 1u) * heads + h;
    var n0 = wide_load(WIDE_W, first_ch, 0u, e0);
    var n1 = wide_load(WIDE_W, first_ch, 0u, e1);

    for (var n = chunks.x; n < chunks.y; n++) {
        let ch = n * heads + h;
        let next_ch = min(n + 1u, chunks.y - 1u) * heads + h;
        // The previous update has read Kd and V'.
        workgroupBarrier();
        if has_rows {
            wide_s[r * WIDE_QUADS + cq] = s0;
            wide_s[(r + 1u) * WIDE_QUADS + cq] = s1;
            wide_s[(r + 2u) * WIDE_QUADS + cq] = s2;
            wide_s[(r + 3u) * WIDE_QUADS + cq] = s3;
        }
        wide_stage(WIDE_W, 0u, e0, n0);
        wide_stage(WIDE_W, 0u, e1, n1);
        n0 = wide_load(WIDE_W, ch, 1u, e0);
        n1 = wide_load(WIDE_W, ch, 1u, e1);
        // Threads 0 .. 127 (row pair rp = rg) form the products of chunk rows 2 rp, 2 rp + 1.
        let u_a = u_quad(ch, 2u * rg, col, identity);
        let u_b = u_quad(ch, 2u * rg + 1u, col, identity);
        let decay = scratch[p.decay_at + ch].x;
        workgroupBarrier();

        // V' = U - W S.
        var ws = WideRows(vec4<f32>(0.0), vec4<f32>(0.0));
        if products {
            ws = wide_products(rg, cq, 0u, ws);
        }
        workgroupBarrier();
        wide_stage(WIDE_W, 1u, e0, n0);
        wide_stage(WIDE_W, 1u, e1, n1);
        let after_w = select(WIDE_KD, WIDE_QD, WALK == 0u);
        n0 = wide_load(after_w, ch, 0u, e0);
        n1 = wide_load(after_w, ch, 0u, e1);
        workgroupBarrier();
        if products {
            ws = wide_products(rg, cq, 1u, ws);
            wide_v[2u * rg * WIDE_QUADS + cq] = u_a - ws.a;
            wide_v[(2u * rg + 1u) * WIDE_QUADS + cq] = u_b - ws.b;
        }
        workgroupBarrier();

        // O = Qd S + P V' (not in the transition walk).
        if WALK == 0u {
            wide_stage(WIDE_QD, 0u, e0, n0);
            wide_stage(WIDE_QD, 0u, e1, n1);
            n0 = wide_load(WIDE_QD, ch, 1u, e0);
            n1 = wide_load(WIDE_QD, ch, 1u, e1);
            workgroupBarrier();
            var qs = WideRows(vec4<f32>(0.0), vec4<f32>(0.0));
            if products {
                qs = wide_products(rg, cq, 0u, qs);
            }
            workgroupBarrier();
            wide_stage(WIDE_QD, 1u, e0, n0);
            wide_stage(WIDE_QD, 1u, e1, n1);
            n0 = wide_load(WIDE_KD, ch, 0u, e0);
            n1 = wide_load(WIDE_KD, ch, 0u, e1);
            workgroupBarrier();
            if products {
                qs = wide_products(rg, cq, 1u, qs);
                let p_a = p.p_at + (ch * CT + 2u * rg) * (CT / 4u);
                let p_b = p_a + CT / 4u;
                for (var j4 = 0u; j4 < CT / 4u; j4++) {
                    let pa = scratch[p_a + j4];
                    let pb = scratch[p_b + j4];
                    let j = 4u * j4;
                    let v0 = wide_v[j * WIDE_QUADS + cq];
                    let v1 = wide_v[(j + 1u) * WIDE_QUADS + cq];
                    let v2 = wide_v[(j + 2u) * WIDE_QUADS + cq];
                    let v3 = wide_v[(j + 3u) * WIDE_QUADS + cq];
                    qs.a += pa.x * v0 + pa.y * v1 + pa.z * v2 + pa.w * v3;
                    qs.b += pb.x * v0 + pb.y * v1 + pb.z * v2 + pb.w * v3;
                }
                let start = chunk_info[2u * n];
                let len = chunk_info[2u * n + 1u];
                wide_store_o(start, len, 2u * rg, h, col, ok_a, ok_b, qs.a);
                wide_store_o(start, len, 2u * rg + 1u, h, col, ok_a, ok_b, qs.b);
            }
            workgroupBarrier();
        }

        // S <- exp(G_last) S + Kd^T V', over the chunk's rows in two pieces.
        wide_stage(WIDE_KD, 0u, e0, n0);
        wide_stage(WIDE_KD, 0u, e1, n1);
        n0 = wide_load(WIDE_KD, ch, 1u, e0);
        n1 = wide_load(WIDE_KD, ch, 1u, e1);
        workgroupBarrier();
        s0 *= decay;
        s1 *= decay;
        s2 *= decay;
        s3 *= decay;
        for (var piece = 0u; piece < WIDE_PIECES; piece++) {
            if piece > 0u {
                workgroupBarrier();
                wide_stage(WIDE_KD, 1u, e0, n0);
                wide_stage(WIDE_KD, 1u, e1, n1);
                n0 = wide_load(WIDE_W, next_ch, 0u, e0);
                n1 = wide_load(WIDE_W, next_ch, 0u, e1);
                workgroupBarrier();
            }
            if has_rows {
                for (var jr = 0u; jr < CT / WIDE_PIECES; jr++) {
                    let kd = wide_staged[jr * (STATE_KP4 + 1u) + rg];
                    let v = wide_v[(piece * (CT / WIDE_PIECES) + jr) * WIDE_QUADS + cq];
                    s0 += kd.x * v;
                    s1 += kd.y * v;
                    s2 += kd.z * v;
                    s3 += kd.w * v;
                }
            }
        }
    }

    store_exit_pair(unit, h, r, col, ok_a, s0.xy);
    store_exit_pair(unit, h, r, col + 2u, ok_b, s0.zw);
    store_exit_pair(unit, h, r + 1u, col, ok_a, s1.xy);
    store_exit_pair(unit, h, r + 1u, col + 2u, ok_b, s1.zw);
    store_exit_pair(unit, h, r + 2u, col, ok_a, s2.xy);
    store_exit_pair(unit, h, r + 2u, col + 2u, ok_b, s2.zw);
    store_exit_pair(unit, h, r + 3u, col, ok_a, s3.xy);
    store_exit_pair(unit, h, r + 3u, col + 2u, ok_b, s3.zw);
}

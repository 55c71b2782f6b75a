// GDN decode: T = 1..=16 new tokens per row, the state a slot of a pool updated in place (V a
// multiple of 4; `recurrent.wgsl` runs the other shapes).
//
// For row b with slot s = slot_indices[b], state S = pool[s, h] (K x V) and value head h (key
// head h / (H / Hg)), for each of its tokens t in order:
//
//     (optional) q_t <- q_t / sqrt(|q_t|^2 + 1e-6), k_t likewise
//     S   <- exp(g_t) * S                       (g_t < -80 is an exact reset: exp = 0)
//     v'  <- beta_t * (v_t - S^T k_t)
//     S   <- S + k_t v'^T
//     o_t <- scale * S^T q_t
//
// The call moves each addressed state once in and once out, which bounds its time, so the
// kernel reads and writes it in 16-byte accesses of whole sectors and keeps it in registers in
// between.
//
// One workgroup of BANDS x QUADS threads owns one (row, value head, tile of 4 * QUADS columns).
// Thread tid = QUADS * band + quad holds columns 4 quad .. 4 quad + 3 of the tile (one vec4)
// of the contiguous band of rows ROWS * band .. ROWS * band + ROWS - 1. Consecutive threads
// hold consecutive column quads of the same rows, so one state access of a subgroup of 32
// covers whole rows of 512 contiguous bytes (QUADS = 32) or two rows of 256 (QUADS = 16), as
// the CUDA kernel's bands do, and a thread's partial S^T k and S^T q already cover its band's
// rows: no subgroup operations (one source for every adapter). The bands' partials meet in
// workgroup memory, double-buffered by token parity like q and k, so a token costs two
// barriers: q and k published, then the partials.
//
// Per token, with the sums over all K rows: the l2 norm is applied to the sums
// (S^T (k / |k|) = (S^T k) / |k|), v' = beta (v - exp(g) S^T k), the output
// o = scale (exp(g) S^T q + (k . q) v') and S <- exp(g) S + k v'^T.
//
// The launcher writes the loops over a thread's rows out row by row (constant indices into
// `s`), so the state stays in registers whatever the driver's compiler does with loops.
//
// A negative slot writes zeros to o and the intermediate states and touches no slot. A slot at
// or past the pool's slot count (possible only when a prepared launch is replayed over indices
// rewritten on the device: every call checks them on the host) touches no slot either and
// writes NaN, so the row's fault shows in its output instead of in another slot.

// The slot of row `row` (i32 or i64 slot indices); negative skips the row.
fn slot_of(row: u32) -> i32 {
    if p.row_mode == 2u {
        return i64_slot(row_info[2u * row], row_info[2u * row + 1u]);
    }
    return bitcast<i32>(row_info[row]);
}

// o of columns col .. col + 3 (col a multiple of 4, so the pairs are whole words of a 16-bit o).
fn store_o4(at: u32, x: vec4<f32>) {
    store_o(at, x.xy, true);
    store_o(at + 2u, x.zw, true);
}

// Column quads per workgroup (consecutive threads) and bands of ROWS rows: BANDS * QUADS = 256,
// BANDS at most 16.
override QUADS: u32 = 32u;
override BANDS: u32 = 8u;

// The intermediate states [B, T, H, K, V] (f32), four columns per access.
@group(0) @binding(11) var<storage, read_write> intermediate: array<vec4<f32>>;

// q and k of the token, by token parity (zeros past K).
var<workgroup> q_band: array<array<f32, MAX_K>, 2>;
var<workgroup> k_band: array<array<f32, MAX_K>, 2>;
// Each band's partial S^T k and S^T q of each column quad, by token parity.
var<workgroup> sk_bands: array<array<vec4<f32>, 256>, 2>;
var<workgroup> sq_bands: array<array<vec4<f32>, 256>, 2>;
// Each band's partial |q|^2, |k|^2, k . q, by token parity.
var<workgroup> norm_bands: array<array<vec4<f32>, 16>, 2>;

@compute @workgroup_size(BANDS * QUADS)
fn gdn_decode_bands(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let threads = BANDS * QUADS;
    let quad = tid % QUADS;
    let band = tid / QUADS;
    let first_row = band * ROWS;
    let head = wid.y;
    let row = wid.z;
    let kd = p.key_dim;
    let vd = p.value_dim;
    let heads = p.value_heads;
    let key_head = head / p.group;
    let col = (wid.x * QUADS + quad) * 4u;
    let col_ok = col < vd;
    // Read by every invocation at one address; uniform for the barriers below.
    let slot = slot_of(row);

    if slot < 0 || u32(slot) >= p.states {
        // Zeros for a skipped row, NaN past the pool (its bits from a run-time select, so that
        // no constant NaN reaches the shader compiler).
        let fill = bitcast<f32>(select(0x7fc00000u, 0u, slot < 0));
        for (var t = 0u; t < p.tokens; t++) {
            let token = row * p.tokens + t;
            if band == 0u && col_ok {
                store_o4((token * heads + head) * vd + col, vec4<f32>(fill));
            }
            if p.intermediate != 0u && col_ok {
                for (var i = 0u; i < ROWS; i++) {
                    let r = first_row + i;
                    if r < kd {
                        intermediate[(((token * heads + head) * kd + r) * vd + col) >> 2u] =
                            vec4<f32>(fill);
                    }
                }
            }
        }
        return;
    }

    // The thread's rows of the tile, in registers; rows past K stay zero.
    let slab = (u32(slot) * heads + head) * kd;
    var s: array<vec4<f32>, 32>;
    for (var i = 0u; i < ROWS; i++) {
        let r = first_row + i;
        if r < kd && col_ok {
            s[i] = load_state4(((slab + r) * vd + col) >> 2u);
        }
    }

    for (var t = 0u; t < p.tokens; t++) {
        let token = row * p.tokens + t;
        let buf = t & 1u;
        let qk_row = (token * p.key_heads + key_head) * kd;
        for (var j = tid; j < BANDS * ROWS; j += threads) {
            var qj = 0.0;
            var kj = 0.0;
            if j < kd {
                qj = load_act(0u, qk_row + j);
                kj = load_act(1u, qk_row + j);
            }
            q_band[buf][j] = qj;
            k_band[buf][j] = kj;
        }
        let v_at = (token * heads + head) * vd + col;
        var v_cols = vec4<f32>(0.0);
        if col_ok {
            v_cols = vec4<f32>(
                load_act(2u, v_at),
                load_act(2u, v_at + 1u),
                load_act(2u, v_at + 2u),
                load_act(2u, v_at + 3u),
            );
        }
        let gate = gates(token, head);
        workgroupBarrier();

        // The band's partial sums (every thread of a band forms the same norms).
        var sk = vec4<f32>(0.0);
        var sq = vec4<f32>(0.0);
        var n = vec4<f32>(0.0);
        for (var i = 0u; i < ROWS; i++) {
            let kr = k_band[buf][first_row + i];
            let qr = q_band[buf][first_row + i];
            sk += s[i] * kr;
            sq += s[i] * qr;
            n += vec4<f32>(qr * qr, kr * kr, kr * qr, 0.0);
        }
        sk_bands[buf][tid] = sk;
        sq_bands[buf][tid] = sq;
        if quad == 0u {
            norm_bands[buf][band] = n;
        }
        workgroupBarrier();
        var sum_k = vec4<f32>(0.0);
        var sum_q = vec4<f32>(0.0);
        var norms = vec4<f32>(0.0);
        for (var b = 0u; b < BANDS; b++) {
            sum_k += sk_bands[buf][b * QUADS + quad];
            sum_q += sq_bands[buf][b * QUADS + quad];
            norms += norm_bands[buf][b];
        }

        var inv_q = 1.0;
        var inv_k = 1.0;
        if p.l2norm != 0u {
            inv_q = inverseSqrt(norms.x + 1e-6);
            inv_k = inverseSqrt(norms.y + 1e-6);
        }
        let decay = select(exp(gate.x), 0.0, gate.x < RESET_GATE);
        let beta = gate.y;
        let v_new = beta * (v_cols - decay * inv_k * sum_k);
        let out = p.scale * (decay * inv_q * sum_q + (norms.z * inv_q * inv_k) * v_new);
        for (var i = 0u; i < ROWS; i++) {
            s[i] = decay * s[i] + (k_band[buf][first_row + i] * inv_k) * v_new;
        }
        if col_ok {
            if band == 0u {
                store_o4(v_at, out);
            }
            if p.intermediate != 0u {
                for (var i = 0u; i < ROWS; i++) {
                    let r = first_row + i;
                    if r < kd {
                        intermediate[(((token * heads + head) * kd + r) * vd + col) >> 2u] = s[i];
                    }
                }
            }
        }
    }

    for (var i = 0u; i < ROWS; i++) {
        let r = first_row + i;
        if r < kd && col_ok {
            store_state4(((slab + r) * vd + col) >> 2u, s[i]);
        }
    }
}

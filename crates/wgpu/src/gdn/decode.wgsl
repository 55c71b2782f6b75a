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
// between. One workgroup owns one (row, value head, tile of 4 * QUADS columns). Thread
// tid = 8 * quad + lane holds columns 4 quad .. 4 quad + 3 of the tile (one vec4) of rows
// lane, lane + 8, lane + 16, ... (ROWS of them): one load of a subgroup of 32 covers eight
// consecutive rows of 64 contiguous bytes each (32 bytes for a bf16 pool). Per token, each
// thread forms its partial S^T k, S^T q and the norms over its rows, and `lane_sums` (the module
// prepended to this one) adds the eight row lanes' partials: through subgroup shuffles where
// the adapter has subgroups (the eight are neighbouring invocations), else through workgroup
// memory. The l2 norm is applied to the sums (S^T (k / |k|) = (S^T k) / |k|), and the output
// uses S_new^T q = exp(g) S^T q + (k . q) v', so one exchange per token serves everything.
// q and k of a token sit in workgroup memory (zeros past K, so rows past K need no test),
// double-buffered by token parity, so one barrier per token guards them.
//
// The launcher may write the loops over a thread's rows out row by row (`DecodeTile`), so that
// `s` is indexed by constants only.
//
// A negative slot writes zeros to o and the intermediate states and touches no slot.

// Column quads per workgroup: 32 (256 invocations, 128 columns) or 8 (64, 32 columns).
override QUADS: u32 = 32u;

// The intermediate states [B, T, H, K, V] (f32), four columns per access.
@group(0) @binding(11) var<storage, read_write> intermediate: array<vec4<f32>>;

// q and k of the token, by token parity.
var<workgroup> q_shared: array<array<f32, MAX_K>, 2>;
var<workgroup> k_shared: array<array<f32, MAX_K>, 2>;

@compute @workgroup_size(ROW_GROUPS * QUADS)
fn gdn_decode(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let threads = ROW_GROUPS * QUADS;
    let lane = tid % ROW_GROUPS;
    let quad = tid / ROW_GROUPS;
    let head = wid.y;
    let row = wid.z;
    let kd = p.key_dim;
    let vd = p.value_dim;
    let heads = p.value_heads;
    let key_head = head / p.group;
    let col = (wid.x * QUADS + quad) * 4u;
    let col_ok = col < vd;
    // The slot, read by every invocation (one address: a broadcast; a read-only binding at a
    // uniform index, so uniform for the barriers below).
    let slot = slot_of(row);

    if slot < 0 {
        // A skipped row: zero outputs, no state touched.
        for (var t = 0u; t < p.tokens; t++) {
            let token = row * p.tokens + t;
            if lane == 0u && col_ok {
                store_o4((token * heads + head) * vd + col, vec4<f32>(0.0));
            }
            if p.intermediate != 0u && col_ok {
                for (var i = 0u; i < ROWS; i++) {
                    let r = lane + ROW_GROUPS * i;
                    if r < kd {
                        intermediate[(((token * heads + head) * kd + r) * vd + col) >> 2u] =
                            vec4<f32>(0.0);
                    }
                }
            }
        }
        return;
    }

    // The tile of the state, in registers; rows past K stay zero.
    let slab = (u32(slot) * heads + head) * kd;
    var s: array<vec4<f32>, 32>;
    for (var i = 0u; i < ROWS; i++) {
        let r = lane + ROW_GROUPS * i;
        if r < kd && col_ok {
            s[i] = load_state4(((slab + r) * vd + col) >> 2u);
        }
    }

    for (var t = 0u; t < p.tokens; t++) {
        let token = row * p.tokens + t;
        let buf = t & 1u;
        let qk_row = (token * p.key_heads + key_head) * kd;
        for (var j = tid; j < ROW_GROUPS * ROWS; j += threads) {
            var qj = 0.0;
            var kj = 0.0;
            if j < kd {
                qj = load_act(0u, qk_row + j);
                kj = load_act(1u, qk_row + j);
            }
            q_shared[buf][j] = qj;
            k_shared[buf][j] = kj;
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

        var sk = vec4<f32>(0.0);
        var sq = vec4<f32>(0.0);
        var n = vec4<f32>(0.0);
        for (var i = 0u; i < ROWS; i++) {
            let r = lane + ROW_GROUPS * i;
            let kr = k_shared[buf][r];
            let qr = q_shared[buf][r];
            sk += s[i] * kr;
            sq += s[i] * qr;
            n += vec4<f32>(qr * qr, kr * kr, kr * qr, 0.0);
        }
        let sums = lane_sums(tid, sk, sq, n);
        var inv_q = 1.0;
        var inv_k = 1.0;
        if p.l2norm != 0u {
            inv_q = inverseSqrt(sums.norms.x + 1e-6);
            inv_k = inverseSqrt(sums.norms.y + 1e-6);
        }
        let decay = select(exp(gate.x), 0.0, gate.x < RESET_GATE);
        let beta = gate.y;
        let v_new = beta * (v_cols - decay * inv_k * sums.sk);
        let out = p.scale * (decay * inv_q * sums.sq + (sums.norms.z * inv_q * inv_k) * v_new);
        for (var i = 0u; i < ROWS; i++) {
            let r = lane + ROW_GROUPS * i;
            s[i] = decay * s[i] + (k_shared[buf][r] * inv_k) * v_new;
        }
        if col_ok {
            if lane == 0u {
                store_o4(v_at, out);
            }
            if p.intermediate != 0u {
                for (var i = 0u; i < ROWS; i++) {
                    let r = lane + ROW_GROUPS * i;
                    if r < kd {
                        intermediate[(((token * heads + head) * kd + r) * vd + col) >> 2u] = s[i];
                    }
                }
            }
        }
    }

    for (var i = 0u; i < ROWS; i++) {
        let r = lane + ROW_GROUPS * i;
        if r < kd && col_ok {
            store_state4(((slab + r) * vd + col) >> 2u, s[i]);
        }
    }
}

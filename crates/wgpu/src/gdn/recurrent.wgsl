// The gated delta rule, token by token, over states updated in place: GDN decode (T = 1..=16
// tokens per row, the state a slot of a pool) and the recurrent prefill (a whole sequence per
// row, the state [N, H, K, V] seeded with the initial state).
//
// For row b with state S (K x V, f32) and value head h (key head h / (H / Hg)), for each of
// its tokens t in order:
//
//     (optional) q_t <- q_t / sqrt(|q_t|^2 + 1e-6), k_t likewise
//     S   <- exp(g_t) * S                       (g_t < -80 is an exact reset: exp = 0)
//     v'  <- beta_t * (v_t - S^T k_t)
//     S   <- S + k_t v'^T
//     o_t <- scale * S^T q_t
//
// One workgroup owns one (row, value head, tile of 2 * COL_PAIRS columns). Thread (row group
// rg = tid % 8, column pair cp = tid / 8) holds rows rg, rg + 8, rg + 16, ... (ROWS of them)
// of its two columns in registers: the tile's state is read once, kept for every token, and
// written once. Per token, each thread forms its partial S^T k and S^T q over its rows, and
// `row_group_sums` (the module prepended to this one) adds the eight row groups' partials:
// through subgroup shuffles where the adapter has subgroups (the eight are neighbouring
// lanes), else through workgroup memory. The l2 norm is applied to the sums
// (S^T (k / |k|) = (S^T k) / |k|), and the output uses S_new^T q = exp(g) S^T q + (k . q) v',
// so one exchange per token serves everything. q and k of a token sit in workgroup memory,
// double-buffered by token parity, so one barrier per token guards them.
//
// A negative slot (decode) writes zeros to o and the intermediate states and touches no slot.

// q and k of the token, by token parity.
var<workgroup> q_shared: array<array<f32, MAX_K>, 2>;
var<workgroup> k_shared: array<array<f32, MAX_K>, 2>;

// What one token needs besides the state, per thread.
struct TokenInputs {
    q: array<f32, 4>,
    k: array<f32, 4>,
    v: vec2<f32>,
    gate: vec2<f32>,
}

fn load_token(
    token: u32,
    tid: u32,
    threads: u32,
    key_head: u32,
    head: u32,
    col: u32,
    col_ok: vec2<bool>,
) -> TokenInputs {
    var x: TokenInputs;
    let kd = p.key_dim;
    let qk_row = (token * p.key_heads + key_head) * kd;
    for (var e = 0u; e < 4u; e++) {
        let j = tid + e * threads;
        if j < kd {
            x.q[e] = load_act(0u, qk_row + j);
            x.k[e] = load_act(1u, qk_row + j);
        }
    }
    let v_at = (token * p.value_heads + head) * p.value_dim + col;
    if col_ok.x {
        x.v.x = load_act(2u, v_at);
    }
    if col_ok.y {
        x.v.y = load_act(2u, v_at + 1u);
    }
    x.gate = gates(token, head);
    return x;
}

@compute @workgroup_size(ROW_GROUPS * COL_PAIRS)
fn gdn_recurrent(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let threads = ROW_GROUPS * COL_PAIRS;
    let rg = tid % ROW_GROUPS;
    let cp = tid / ROW_GROUPS;
    let head = wid.y;
    let row = wid.z;
    let kd = p.key_dim;
    let vd = p.value_dim;
    let heads = p.value_heads;
    let key_head = head / p.group;
    let col = wid.x * 2u * COL_PAIRS + 2u * cp;
    let col_ok = vec2<bool>(col < vd, col + 1u < vd);

    // The row's tokens and state, read once and made uniform for the loops below.
    if tid == 0u {
        var range = vec2<u32>(row * p.tokens, p.tokens);
        var slot = i32(row);
        if p.row_mode == 1u {
            slot = bitcast<i32>(row_info[row]);
        } else if p.row_mode == 2u {
            slot = i64_slot(row_info[2u * row], row_info[2u * row + 1u]);
        } else if p.row_mode == 3u {
            range = vec2<u32>(row_info[row], row_info[row + 1u] - row_info[row]);
        }
        row_range = range;
        row_slot = slot;
    }
    let range = workgroupUniformLoad(&row_range);
    let slot = workgroupUniformLoad(&row_slot);

    if slot < 0 || u32(slot) >= p.states {
        // A skipped row: zero outputs (NaN for a slot past the pool: a replayed launch over
        // indices rewritten on the device), no state touched.
        let fill = select(0x7fc00000u, 0u, slot < 0);
        for (var t = 0u; t < range.y; t++) {
            let token = range.x + t;
            if rg == 0u && col_ok.x {
                store_o((token * heads + head) * vd + col, vec2<f32>(bitcast<f32>(fill)), col_ok.y);
            }
            if p.intermediate != 0u {
                for (var i = 0u; i < ROWS; i++) {
                    let r = rg + ROW_GROUPS * i;
                    if r < kd && col_ok.x {
                        let at = ((token * heads + head) * kd + r) * vd + col;
                        intermediate[at] = fill;
                        if col_ok.y {
                            intermediate[at + 1u] = fill;
                        }
                    }
                }
            }
        }
        return;
    }

    // The tile of the state, in registers.
    let slab = (u32(slot) * heads + head) * kd;
    var s: array<vec2<f32>, 32>;
    for (var i = 0u; i < ROWS; i++) {
        let r = rg + ROW_GROUPS * i;
        if r < kd && col_ok.x {
            let at = (slab + r) * vd + col;
            if STATE_BF16 {
                let word = state[at >> 1u];
                s[i] = vec2<f32>(bitcast<f32>(word << 16u), bitcast<f32>(word & 0xffff0000u));
            } else {
                s[i].x = bitcast<f32>(state[at]);
                if col_ok.y {
                    s[i].y = bitcast<f32>(state[at + 1u]);
                }
            }
        }
    }

    // Each token's inputs are loaded one token ahead into registers, so their latency overlaps
    // the previous token's arithmetic: q and k elements tid, tid + threads, ... (at most four:
    // K <= 256 and threads >= 64), this thread's v columns, and the gates.
    var next: TokenInputs;
    if range.y > 0u {
        next = load_token(range.x, tid, threads, key_head, head, col, col_ok);
    }
    for (var t = 0u; t < range.y; t++) {
        let token = range.x + t;
        let buf = t & 1u;
        let current = next;
        for (var e = 0u; e < 4u; e++) {
            let j = tid + e * threads;
            if j < kd {
                q_shared[buf][j] = current.q[e];
                k_shared[buf][j] = current.k[e];
            }
        }
        let v_cols = current.v;
        let gate = current.gate;
        let v_at = (token * heads + head) * vd + col;
        if t + 1u < range.y {
            next = load_token(token + 1u, tid, threads, key_head, head, col, col_ok);
        }
        workgroupBarrier();

        var sk = vec2<f32>(0.0);
        var sq = vec2<f32>(0.0);
        var n = vec3<f32>(0.0);
        for (var i = 0u; i < ROWS; i++) {
            let r = rg + ROW_GROUPS * i;
            if r < kd {
                let kr = k_shared[buf][r];
                let qr = q_shared[buf][r];
                sk += s[i] * kr;
                sq += s[i] * qr;
                n += vec3<f32>(qr * qr, kr * kr, kr * qr);
            }
        }
        let total = row_group_sums(tid, vec4<f32>(sk, sq), vec4<f32>(n, 0.0));
        let sums = total.columns;
        let nsum = total.norms;
        var inv_q = 1.0;
        var inv_k = 1.0;
        if p.l2norm != 0u {
            inv_q = inverseSqrt(nsum.x + 1e-6);
            inv_k = inverseSqrt(nsum.y + 1e-6);
        }
        let decay = select(exp(gate.x), 0.0, gate.x < RESET_GATE);
        let beta = gate.y;
        let v_new = beta * (v_cols - decay * inv_k * sums.xy);
        let out = p.scale * (decay * inv_q * sums.zw + (nsum.z * inv_q * inv_k) * v_new);
        for (var i = 0u; i < ROWS; i++) {
            let r = rg + ROW_GROUPS * i;
            s[i] = decay * s[i] + (k_shared[buf][r % MAX_K] * inv_k) * v_new;
        }
        if col_ok.x {
            if rg == 0u {
                store_o(v_at, out, col_ok.y);
            }
            if p.intermediate != 0u {
                for (var i = 0u; i < ROWS; i++) {
                    let r = rg + ROW_GROUPS * i;
                    if r < kd {
                        let at = ((token * heads + head) * kd + r) * vd + col;
                        intermediate[at] = bitcast<u32>(s[i].x);
                        if col_ok.y {
                            intermediate[at + 1u] = bitcast<u32>(s[i].y);
                        }
                    }
                }
            }
        }
    }

    for (var i = 0u; i < ROWS; i++) {
        let r = rg + ROW_GROUPS * i;
        if r < kd && col_ok.x {
            let at = (slab + r) * vd + col;
            if STATE_BF16 {
                state[at >> 1u] = bf16_bits(s[i].x) | (bf16_bits(s[i].y) << 16u);
            } else {
                state[at] = bitcast<u32>(s[i].x);
                if col_ok.y {
                    state[at + 1u] = bitcast<u32>(s[i].y);
                }
            }
        }
    }
}

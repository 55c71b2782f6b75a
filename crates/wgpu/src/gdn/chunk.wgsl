// GDN prefill in chunks of CHUNK_TOKENS tokens: the gated delta rule unrolled over a chunk (the
// WY form of FLA's chunk algorithm, with f32 intermediates), one workgroup per (sequence, value
// head, tile of columns), the tile's state in registers as in `recurrent.wgsl`. For a chunk of
// c tokens, the state S at its start, normalised q_i and k_i, and G_i = g_0 + ... + g_i
// counted from the chunk's start (each g clamped at RESET_GATE: exp(-80) is 1.8e-35, a reset
// to every digit of f32, and the sums stay finite):
//
//     u_i = beta_i (v_i - exp(G_i) S^T k_i - sum_{j<i} exp(G_i - G_j) (k_i . k_j) u_j)
//     o_i = scale (exp(G_i) S^T q_i + sum_{j<=i} exp(G_i - G_j) (q_i . k_j) u_j)
//     S  <- exp(G_last) S + sum_j exp(G_last - G_j) k_j u_j^T
//
// u_i is the v' of the recurrence. The u_i are a triangular solve per column, which every
// thread runs for its own two columns from the chunk's Gram matrices K K^T and Q K^T (built
// once by the workgroup, in workgroup memory); S^T k_i and S^T q_i are summed over the row
// groups like the token loop's. A chunk costs three barriers (plus one per token on adapters
// without subgroups), where the token loop costs one or two per token.

// Tokens per chunk: 16 for K <= 128, 8 above (the chunk's q and k fill 16 KiB either way).
override CHUNK_TOKENS: u32 = 16u;
const MAX_CHUNK: u32 = 16u;
const CHUNK_ELEMS: u32 = 2048u;

// The chunk's q and k, [c, K].
var<workgroup> q_chunk: array<f32, CHUNK_ELEMS>;
var<workgroup> k_chunk: array<f32, CHUNK_ELEMS>;
// (k_i . k_j) for j < i and (q_i . k_j) for j <= i, normalised, [i, j] with rows of MAX_CHUNK.
var<workgroup> kk: array<f32, 256>;
var<workgroup> qk: array<f32, 256>;
// The gates of the chunk's tokens (clamped g, then G), beta, and 1 / |q_i|, 1 / |k_i|.
var<workgroup> g_cum: array<f32, MAX_CHUNK>;
var<workgroup> beta_chunk: array<f32, MAX_CHUNK>;
var<workgroup> inv_q: array<f32, MAX_CHUNK>;
var<workgroup> inv_k: array<f32, MAX_CHUNK>;

@compute @workgroup_size(ROW_GROUPS * COL_PAIRS)
fn gdn_chunk(
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

    // The sequence's tokens (dense or varlen), made uniform for the loops below.
    if tid == 0u {
        var range = vec2<u32>(row * p.tokens, p.tokens);
        if p.row_mode == 3u {
            range = vec2<u32>(row_info[row], row_info[row + 1u] - row_info[row]);
        }
        row_range = range;
    }
    let range = workgroupUniformLoad(&row_range);

    let slab = (row * heads + head) * kd;
    var s: array<vec2<f32>, 32>;
    for (var e = 0u; e < ROWS; e++) {
        let r = rg + ROW_GROUPS * e;
        if r < kd && col_ok.x {
            s[e] = load_state_pair(slab, r, col, col_ok);
        }
    }

    for (var c0 = 0u; c0 < range.y; c0 += CHUNK_TOKENS) {
        let c = min(CHUNK_TOKENS, range.y - c0);
        let t0 = range.x + c0;
        // The chunk's q and k into workgroup memory; gates; this thread's v.
        for (var e = tid; e < c * kd; e += threads) {
            let i = e / kd;
            let at = ((t0 + i) * p.key_heads + key_head) * kd + e % kd;
            q_chunk[e] = load_act(0u, at);
            k_chunk[e] = load_act(1u, at);
        }
        if tid < c {
            let gate = gates(t0 + tid, head);
            g_cum[tid] = max(gate.x, RESET_GATE);
            beta_chunk[tid] = gate.y;
        }
        var v_chunk: array<vec2<f32>, MAX_CHUNK>;
        for (var i = 0u; i < c; i++) {
            let v_at = ((t0 + i) * heads + head) * vd + col;
            if col_ok.x {
                v_chunk[i].x = load_act(2u, v_at);
            }
            if col_ok.y {
                v_chunk[i].y = load_act(2u, v_at + 1u);
            }
        }
        workgroupBarrier();

        // Inverse norms (threads 0..2c) and the cumulative gates (thread 2c).
        if tid < 2u * c {
            let i = tid % c;
            var sum = 0.0;
            if p.l2norm != 0u {
                for (var m = 0u; m < kd; m++) {
                    let x = select(k_chunk[i * kd + m], q_chunk[i * kd + m], tid < c);
                    sum += x * x;
                }
            }
            let inv = select(1.0, inverseSqrt(sum + 1e-6), p.l2norm != 0u);
            if tid < c {
                inv_q[i] = inv;
            } else {
                inv_k[i] = inv;
            }
        } else if tid == 2u * c {
            for (var i = 1u; i < c; i++) {
                g_cum[i] += g_cum[i - 1u];
            }
        }
        workgroupBarrier();

        // The Gram matrices, one entry (i, j <= i) per thread at a time.
        for (var e = tid; e < c * c; e += threads) {
            let i = e / c;
            let j = e % c;
            if j <= i {
                var dkk = 0.0;
                var dqk = 0.0;
                for (var m = 0u; m < kd; m++) {
                    let kj = k_chunk[j * kd + m];
                    dkk += k_chunk[i * kd + m] * kj;
                    dqk += q_chunk[i * kd + m] * kj;
                }
                kk[i * MAX_CHUNK + j] = dkk * inv_k[i] * inv_k[j];
                qk[i * MAX_CHUNK + j] = dqk * inv_q[i] * inv_k[j];
            }
        }
        workgroupBarrier();

        // S^T k_i and S^T q_i of the chunk's starting state, for this thread's columns.
        var sk: array<vec2<f32>, MAX_CHUNK>;
        var sq: array<vec2<f32>, MAX_CHUNK>;
        for (var i = 0u; i < c; i++) {
            var pk = vec2<f32>(0.0);
            var pq = vec2<f32>(0.0);
            for (var e = 0u; e < ROWS; e++) {
                let r = rg + ROW_GROUPS * e;
                if r < kd {
                    pk += s[e] * k_chunk[i * kd + r];
                    pq += s[e] * q_chunk[i * kd + r];
                }
            }
            let total = row_group_sums(tid, vec4<f32>(pk, pq), vec4<f32>(0.0));
            sk[i] = total.columns.xy * inv_k[i];
            sq[i] = total.columns.zw * inv_q[i];
        }

        // The triangular solve for u, and o, for this thread's two columns.
        var u: array<vec2<f32>, MAX_CHUNK>;
        for (var i = 0u; i < c; i++) {
            let gi = g_cum[i];
            let decay = exp(gi);
            var rest = v_chunk[i] - decay * sk[i];
            var out = decay * sq[i];
            for (var j = 0u; j < i; j++) {
                let d = exp(gi - g_cum[j]);
                rest -= (d * kk[i * MAX_CHUNK + j]) * u[j];
                out += (d * qk[i * MAX_CHUNK + j]) * u[j];
            }
            u[i] = beta_chunk[i] * rest;
            out += qk[i * MAX_CHUNK + i] * u[i];
            if rg == 0u && col_ok.x {
                store_o(((t0 + i) * heads + head) * vd + col, p.scale * out, col_ok.y);
            }
        }

        // The state at the chunk's end.
        let g_last = g_cum[c - 1u];
        var weight: array<f32, MAX_CHUNK>;
        for (var j = 0u; j < c; j++) {
            weight[j] = exp(g_last - g_cum[j]) * inv_k[j];
        }
        let decay_last = exp(g_last);
        for (var e = 0u; e < ROWS; e++) {
            let r = rg + ROW_GROUPS * e;
            if r < kd {
                var x = decay_last * s[e];
                for (var j = 0u; j < c; j++) {
                    x += (weight[j] * k_chunk[j * kd + r]) * u[j];
                }
                s[e] = x;
            }
        }
        // The next chunk's loads overwrite what this one read.
        workgroupBarrier();
    }

    for (var e = 0u; e < ROWS; e++) {
        let r = rg + ROW_GROUPS * e;
        if r < kd && col_ok.x {
            store_state_pair(slab, r, col, col_ok, s[e]);
        }
    }
}

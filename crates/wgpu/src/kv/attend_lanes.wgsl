// Flash-decoding pass 1 over the paged compressed KV cache, "lanes" form (`attend.wgsl` is the
// general one; both write the same partials for `merge.wgsl`). For d = 16 LANES (LANES 4, 8 or
// 16) and 2-, 4- or 8-bit codes. Layout: deltakv_contract::kv::paged; math:
// deltakv_contract::kv.
//
// One workgroup of 128 threads per (split, KV head x chunk of four rows, sequence); its four
// query rows are the lanes of a vec4, so each code is decoded once for all of them. LANES
// neighbouring threads share a token, lane j owning dimensions 16 j .. 16 j + 15: its q'
// (four mat4x4, column c of matrix k = q' of dimension 16 j + 4 k + c over the rows) and its
// accumulators live in registers as whole matrices (no arrays indexed at run time, so nothing
// spills to local memory), and its 16 codes are 16 BITS consecutive bits of the row: one, two
// or four words, decoded at constant shifts. Tiles of TILE tokens, each thread taking TPT
// tokens (k G + its group, G = 128 / LANES groups):
//
//   A  each lane loads its key and value words (the values kept in its own workgroup slot for
//      step E), forms its partial <q'_r, c(idx_k)> over its 16 dimensions (four mat4x4 x vec4
//      products) and publishes it (`publish_dot`: subgroup shuffles or workgroup memory);
//      thread t < TILE loads token t's norms
//   B  thread t < TILE: s = norm_k <q', c> (-inf past each row's causal limit)
//   C  eight threads: the maxima of eighths of the tile
//   D  every thread: m' = max(m, tile max), alpha = e^(m - m'); thread t < TILE:
//      p = e^(s - m'), its running l = alpha l + p, w = p norm_v
//   E  each lane: acc = alpha acc + sum_t w_t (x) c(idx_v[t]) over its tokens (outer products)
//
// with a barrier between the steps. At the end the groups' accumulators and the threads' l are
// summed and (m, l, acc) written per (row, split) for the merge.

override BITS_K: u32 = 4u;
override BITS_V: u32 = 2u;
// Threads per token: d / 16.
override LANES: u32 = 8u;
// Tokens per tile: 64 or 128, with TILE x LANES <= 1024 (the workgroup-memory path's partials).
override TILE: u32 = 128u;
// 1: q' in registers; 0: read from workgroup memory at each token (fewer registers).
override Q_REGISTERS: u32 = 1u;

override GROUPS: u32 = 128u / LANES;
override TPT: u32 = TILE / GROUPS;
const NEG_BIG: f32 = -3.4028235e38;

struct AttnParams {
    batch: u32,
    tq: u32,
    hq: u32,
    kv_heads: u32,
    dim: u32,
    dim_pad: u32,
    group: u32,
    rows: u32,          // Tq * group
    row_chunks: u32,    // ceil(rows / 4)
    q_dtype: u32,
    norm_f16: u32,
    hadamard: u32,
    page_tokens: u32,
    max_pages: u32,
    page_words: u32,
    head_words: u32,
    row_words_k: u32,
    row_words_v: u32,
    norm_words: u32,
    splits: u32,
    scale: f32,
    hadamard_norm: f32,
    out_rows: u32,      // B * Tq * Hq
    merge_groups: u32,  // workgroups along x of the merge
}

@group(0) @binding(0) var<uniform> p: AttnParams;
@group(0) @binding(1) var<storage, read> q_in: array<u32>;
@group(0) @binding(2) var<storage, read> pool: array<u32>;
@group(0) @binding(3) var<storage, read> pool4: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read> block_table: array<i32>;
@group(0) @binding(5) var<storage, read> seq_lens: array<i32>;
@group(0) @binding(6) var<storage, read> consts: array<f32>;
// [out_rows, splits, 2]: m and l.
@group(0) @binding(7) var<storage, read_write> part_ml: array<f32>;
// [out_rows, splits, dim_pad]: the un-normalised output in the rotated basis.
@group(0) @binding(8) var<storage, read_write> part_acc: array<f32>;

var<workgroup> qrot: array<vec4<f32>, 256>;
var<workgroup> qin: array<vec4<f32>, 256>;
var<workgroup> lk: array<f32, 256>;
var<workgroup> lv: array<f32, 256>;
// Per tile token: its masked scores (at the end, each thread's l); then its weights p norm_v.
// (Workgroup memory in all: 47.2 KB on the workgroup-memory path, under the 48 KB of
// NVIDIA's Vulkan driver.)
var<workgroup> scores: array<vec4<f32>, 128>;
var<workgroup> weights: array<vec4<f32>, 128>;
// The maxima of the tile's eighths.
var<workgroup> eighth_max: array<vec4<f32>, 8>;
// Each lane's value words of its tile tokens (slot token x LANES + lane; BITS_V / 2 words).
var<workgroup> value_words: array<vec4<u32>, 1024>;
var<workgroup> seq_len: u32;

fn load_q(i: u32) -> f32 {
    return widen(q_in[word_of(i, p.q_dtype)], i, p.q_dtype);
}

fn norm_at(section: u32, slot: u32) -> f32 {
    if p.norm_f16 != 0u {
        let word = pool[section + slot / 2u];
        return unpack2x16float(select(word & 0xffffu, word >> 16u, (slot & 1u) == 1u)).x;
    }
    return bitcast<f32>(pool[section + slot]);
}

// The 16 BITS-bit codes from `first_word` of the pool (BITS / 2 words, in x, y, z, w).
// (8-bit words are one 16-byte load: rows and sections start at multiples of four words.)
fn lane_words(first_word: u32, bits: u32) -> vec4<u32> {
    if bits == 8u {
        return pool4[first_word / 4u];
    }
    var w = vec4<u32>(pool[first_word], 0u, 0u, 0u);
    if bits == 4u {
        w.y = pool[first_word + 1u];
    }
    return w;
}

// Codes 4k .. 4k + 3 of a lane's words (BITS bits each, never straddling a word).
fn codes4(w: vec4<u32>, k: u32, bits: u32) -> vec4<u32> {
    let bit = 4u * k * bits;
    let x = w[bit / 32u] >> (bit % 32u);
    let mask = (1u << bits) - 1u;
    return vec4<u32>(x & mask, (x >> bits) & mask, (x >> (2u * bits)) & mask, (x >> (3u * bits)) & mask);
}

fn key_levels(w: vec4<u32>, k: u32) -> vec4<f32> {
    let c = codes4(w, k, BITS_K);
    return vec4<f32>(lk[c.x], lk[c.y], lk[c.z], lk[c.w]);
}

fn value_levels(w: vec4<u32>, k: u32) -> vec4<f32> {
    let c = codes4(w, k, BITS_V);
    return vec4<f32>(lv[c.x], lv[c.y], lv[c.z], lv[c.w]);
}

// a + w (x) l: column c gains w l_c (the four rows' weights times dimension c's level).
fn add_outer(a: mat4x4<f32>, w: vec4<f32>, l: vec4<f32>) -> mat4x4<f32> {
    return mat4x4<f32>(
        fma(w, vec4<f32>(l.x), a[0]),
        fma(w, vec4<f32>(l.y), a[1]),
        fma(w, vec4<f32>(l.z), a[2]),
        fma(w, vec4<f32>(l.w), a[3]),
    );
}

// Lane j's q' dimensions 16 j + 4 k .. + 3, columns of a mat4x4.
fn q_block(j: u32, k: u32) -> mat4x4<f32> {
    let at = 16u * j + 4u * k;
    return mat4x4<f32>(qrot[at], qrot[at + 1u], qrot[at + 2u], qrot[at + 3u]);
}

// The word offset of (sequence b, token t)'s KV head h section in the pool, and its slot.
fn head_base(b: u32, t: u32, h: u32) -> vec2<u32> {
    let page = u32(max(block_table[b * p.max_pages + t / p.page_tokens], 0));
    return vec2<u32>(page * p.page_words + h * p.head_words, t % p.page_tokens);
}

@compute @workgroup_size(128)
fn kv_attend(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let split = wid.x;
    let h = wid.y / p.row_chunks;
    let chunk = wid.y % p.row_chunks;
    let b = wid.z;
    let d = p.dim;
    let dp = p.dim_pad;
    for (var i = tid; i < 256u; i += 128u) {
        lk[i] = consts[i];
        lv[i] = consts[512u + i];
    }
    if tid == 0u {
        seq_len = u32(seq_lens[b]);
    }
    // q' = Pi (scale q), rows in the lanes of a vec4, zero past d and past the last row.
    let rot = 1024u;
    for (var c = tid; c < 256u; c += 128u) {
        var x = vec4<f32>(0.0);
        if c < d {
            for (var r = 0u; r < 4u; r++) {
                let row = chunk * 4u + r;
                if row < p.rows {
                    let i = row / p.group;
                    let g = row % p.group;
                    let at = ((b * p.tq + i) * p.hq + h * p.group + g) * d + c;
                    x[r] = load_q(at) * p.scale;
                }
            }
            if p.hadamard != 0u {
                x *= consts[rot + c];
            }
        }
        qin[c] = x;
    }
    workgroupBarrier();
    if p.hadamard != 0u {
        for (var hb = 1u; hb < d; hb <<= 1u) {
            if tid < d / 2u {
                let i = (tid / hb) * 2u * hb + tid % hb;
                let a = qin[i];
                let c = qin[i + hb];
                qin[i] = a + c;
                qin[i + hb] = a - c;
            }
            workgroupBarrier();
        }
        for (var c = tid; c < 256u; c += 128u) {
            qrot[c] = qin[c] * p.hadamard_norm;
        }
    } else {
        // y_i = sum_c M[i][c] x_c, M^T stored [c][i] for coalesced reads.
        for (var i = tid; i < 256u; i += 128u) {
            var y = vec4<f32>(0.0);
            if i < d {
                for (var c = 0u; c < d; c++) {
                    y += consts[rot + c * d + i] * qin[c];
                }
            }
            qrot[i] = y;
        }
    }
    let len = workgroupUniformLoad(&seq_len);
    // Causal limits: row r sees tokens below len - Tq + i + 1 (none for a padding row).
    var limit = vec4<u32>(0u);
    for (var r = 0u; r < 4u; r++) {
        let row = chunk * 4u + r;
        if row < p.rows {
            limit[r] = len - p.tq + row / p.group + 1u;
        }
    }
    let reach = max(max(limit.x, limit.y), max(limit.z, limit.w));
    let tiles = (reach + TILE - 1u) / TILE;
    let all_tiles = (len + TILE - 1u) / TILE;
    let per_split = (all_tiles + p.splits - 1u) / p.splits;
    let tile0 = split * per_split;
    let tile1 = min(tile0 + per_split, tiles);
    let group_index = tid / LANES;
    let j = tid % LANES;
    var q0 = mat4x4<f32>();
    var q1 = mat4x4<f32>();
    var q2 = mat4x4<f32>();
    var q3 = mat4x4<f32>();
    if Q_REGISTERS != 0u {
        q0 = q_block(j, 0u);
        q1 = q_block(j, 1u);
        q2 = q_block(j, 2u);
        q3 = q_block(j, 3u);
    }
    var a0 = mat4x4<f32>();
    var a1 = mat4x4<f32>();
    var a2 = mat4x4<f32>();
    var a3 = mat4x4<f32>();
    var l = vec4<f32>(0.0);
    var m = vec4<f32>(NEG_BIG);
    let kcodes = p.page_tokens * p.row_words_k;
    let vcodes = p.page_tokens * p.row_words_v;
    for (var tile = tile0; tile < tile1; tile++) {
        // A: norms of token tid, then each lane's partial dots of its TPT tokens.
        var norm_k = 0.0;
        var norm_v = 0.0;
        let own = tile * TILE + tid;
        if tid < TILE && own < reach {
            let base = head_base(b, own, h);
            let norms = base.x + kcodes + vcodes;
            norm_k = norm_at(norms, base.y);
            norm_v = norm_at(norms + p.norm_words, base.y);
        }
        for (var k = 0u; k < TPT; k++) {
            let tt = k * GROUPS + group_index;
            let t = tile * TILE + tt;
            var dot = vec4<f32>(0.0);
            if t < reach {
                let base = head_base(b, t, h);
                let kw = lane_words(base.x + base.y * p.row_words_k + j * (BITS_K / 2u), BITS_K);
                value_words[tt * LANES + j] =
                    lane_words(base.x + kcodes + base.y * p.row_words_v + j * (BITS_V / 2u), BITS_V);
                if Q_REGISTERS != 0u {
                    dot = q0 * key_levels(kw, 0u) + q1 * key_levels(kw, 1u)
                        + q2 * key_levels(kw, 2u) + q3 * key_levels(kw, 3u);
                } else {
                    dot = q_block(j, 0u) * key_levels(kw, 0u) + q_block(j, 1u) * key_levels(kw, 1u)
                        + q_block(j, 2u) * key_levels(kw, 2u) + q_block(j, 3u) * key_levels(kw, 3u);
                }
            }
            publish_dot(tt, j, dot);
        }
        workgroupBarrier();
        // B: the scores of token tid.
        var s = vec4<f32>(NEG_BIG);
        if tid < TILE {
            let dot = read_dot(tid) * norm_k;
            for (var r = 0u; r < 4u; r++) {
                if own < limit[r] {
                    s[r] = dot[r];
                }
            }
            scores[tid] = s;
        }
        workgroupBarrier();
        // C: the maxima of the tile's eighths.
        if tid < 8u {
            var x = vec4<f32>(NEG_BIG);
            for (var i = 0u; i < TILE / 8u; i++) {
                x = max(x, scores[tid * (TILE / 8u) + i]);
            }
            eighth_max[tid] = x;
        }
        workgroupBarrier();
        // D: the running max, the rescale, the weights.
        var m_new = m;
        for (var i = 0u; i < 8u; i++) {
            m_new = max(m_new, eighth_max[i]);
        }
        var alpha = vec4<f32>(1.0);
        for (var r = 0u; r < 4u; r++) {
            if m[r] != m_new[r] {
                alpha[r] = select(exp(m[r] - m_new[r]), 0.0, m[r] == NEG_BIG);
            }
        }
        m = m_new;
        if tid < TILE {
            var pr = vec4<f32>(0.0);
            for (var r = 0u; r < 4u; r++) {
                if s[r] != NEG_BIG {
                    pr[r] = exp(s[r] - m_new[r]);
                }
            }
            l = alpha * l + pr;
            weights[tid] = pr * norm_v;
        }
        workgroupBarrier();
        // E: the weighted value levels of each lane's tokens.
        if any(alpha != vec4<f32>(1.0)) {
            a0 = mat4x4<f32>(a0[0] * alpha, a0[1] * alpha, a0[2] * alpha, a0[3] * alpha);
            a1 = mat4x4<f32>(a1[0] * alpha, a1[1] * alpha, a1[2] * alpha, a1[3] * alpha);
            a2 = mat4x4<f32>(a2[0] * alpha, a2[1] * alpha, a2[2] * alpha, a2[3] * alpha);
            a3 = mat4x4<f32>(a3[0] * alpha, a3[1] * alpha, a3[2] * alpha, a3[3] * alpha);
        }
        for (var k = 0u; k < TPT; k++) {
            let tt = k * GROUPS + group_index;
            let w = weights[tt];
            if any(w != vec4<f32>(0.0)) {
                let vw = value_words[tt * LANES + j];
                a0 = add_outer(a0, w, value_levels(vw, 0u));
                a1 = add_outer(a1, w, value_levels(vw, 1u));
                a2 = add_outer(a2, w, value_levels(vw, 2u));
                a3 = add_outer(a3, w, value_levels(vw, 3u));
            }
        }
    }
    // Sum the token groups (in order) into qin, the threads' l into scores.
    workgroupBarrier();
    scores[tid] = l;
    for (var g = 0u; g < GROUPS; g++) {
        if group_index == g {
            let at = 16u * j;
            for (var c = 0u; c < 4u; c++) {
                if g == 0u {
                    qin[at + c] = a0[c];
                    qin[at + 4u + c] = a1[c];
                    qin[at + 8u + c] = a2[c];
                    qin[at + 12u + c] = a3[c];
                } else {
                    qin[at + c] += a0[c];
                    qin[at + 4u + c] += a1[c];
                    qin[at + 8u + c] += a2[c];
                    qin[at + 12u + c] += a3[c];
                }
            }
        }
        workgroupBarrier();
    }
    for (var r = 0u; r < 4u; r++) {
        let row = chunk * 4u + r;
        if row >= p.rows {
            continue;
        }
        let i = row / p.group;
        let g = row % p.group;
        let out_row = (b * p.tq + i) * p.hq + h * p.group + g;
        let part = out_row * p.splits + split;
        for (var c = tid; c < dp; c += 128u) {
            var x = 0.0;
            if c < d {
                x = qin[c][r];
            }
            part_acc[part * dp + c] = x;
        }
        if tid == 0u {
            var total = 0.0;
            for (var t = 0u; t < TILE; t++) {
                total += scores[t][r];
            }
            part_ml[2u * part] = m[r];
            part_ml[2u * part + 1u] = total;
        }
    }
}

// Flash-decoding over the paged compressed KV cache, reading the packed codes (never a
// dequantised copy). Layout: deltakv_contract::kv::paged; math: deltakv_contract::kv.
//
// Pass 1 (`kv_attend`), one workgroup of 128 threads per (split, KV head x row chunk,
// sequence). Its four rows are query rows sharing the KV head (a GQA group, times Tq for the
// causal-chunk form), held as the four lanes of a vec4, so every code is decoded once for all
// of them. q' = Pi (scale q) is made once in workgroup memory (the Hadamard butterflies or the
// dense product, on vec4s). The split's tokens go by tiles of 128:
//
//   scores   thread t scores token t of the tile: s = norm_k <q', c(idx_k)> over the whole
//            key row (16-byte loads), masked past each row's causal limit
//   softmax  the tile's max per row (`post_tile_max`, the module prepended to this one: a
//            subgroup max and one workgroup atomic per subgroup where the adapter has
//            subgroups, else one atomic per thread, on order-preserving keys),
//            m' = max(m, max s), alpha = e^(m - m'), p = e^(s - m'), w = p norm_v
//   values   LANES threads share a token (its value row found, and when it has at most 16
//            words loaded into workgroup memory, by the scores step, so those loads are in
//            flight with the key row's), each owning 16 dimensions of it: acc = alpha acc +
//            sum_t w_t c(idx_v[t]); l = alpha l + sum_t p_t (lane 0 of each token group)
//
// then the token groups' accumulators are summed and (m, l, acc) written per (row, split).
// Pass 2 (`merge.wgsl`) merges the splits and rotates back. Sequences of different lengths
// share a dispatch: a workgroup reads its sequence's length and takes its share of the tiles.
// BITS_K, BITS_V and LANES are pipeline constants, and the launcher writes the loops over
// codes, dimensions and rows out copy by copy (`crate::unroll`), so code extraction has
// constant shifts and the per-thread arrays constant indices.

override BITS_K: u32 = 4u;
override BITS_V: u32 = 2u;
// Threads per token in the value pass: a power of two >= ceil(d / 16).
override LANES: u32 = 8u;

const TILE: u32 = 128u;
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
var<workgroup> weights: array<vec4<f32>, 128>;
var<workgroup> probs: array<vec4<f32>, 128>;
// The word offset of each tile token's value row (found once, in the scores step).
var<workgroup> value_rows: array<u32, 128>;
// Each tile token's value row, loaded in the scores step beside its key row (rows of at most
// STAGED_WORDS words; longer rows are read from the pool in the values step).
const STAGED_WORDS: u32 = 16u;
var<workgroup> value_codes: array<vec4<u32>, 512>;
// The tile's max per row as order-preserving keys, by tile parity.
var<workgroup> tile_max: array<atomic<u32>, 8>;
var<workgroup> seq_len: u32;
var<workgroup> lsum: array<vec4<f32>, 1>;

fn load_q(i: u32) -> f32 {
    return widen(q_in[word_of(i, p.q_dtype)], i, p.q_dtype);
}

// f32 -> u32 preserving order (0 stays below every real key).
fn order_key(x: f32) -> u32 {
    let u = bitcast<u32>(x);
    return select(u | 0x80000000u, ~u, (u & 0x80000000u) != 0u);
}

fn from_key(k: u32) -> f32 {
    if k == 0u {
        return NEG_BIG;
    }
    return bitcast<f32>(select(~k, k & 0x7fffffffu, (k & 0x80000000u) != 0u));
}

fn norm_at(section: u32, slot: u32) -> f32 {
    if p.norm_f16 != 0u {
        let word = pool[section + slot / 2u];
        return unpack2x16float(select(word & 0xffffu, word >> 16u, (slot & 1u) == 1u)).x;
    }
    return bitcast<f32>(pool[section + slot]);
}

// The word offset of (sequence b, token t)'s KV head h section in the pool, and its slot.
fn head_base(b: u32, t: u32, h: u32) -> vec2<u32> {
    let page = u32(max(block_table[b * p.max_pages + t / p.page_tokens], 0));
    return vec2<u32>(page * p.page_words + h * p.head_words, t % p.page_tokens);
}

// <q'_r, c(idx)> for the four rows over the key row starting at word `row`.
fn key_dots(row: u32) -> vec4<f32> {
    var s = vec4<f32>(0.0);
    let mask = (1u << BITS_K) - 1u;
    if BITS_K == 3u {
        // 16 codes (48 bits) per step, funnelled from the words they straddle.
        for (var st = 0u; st < (p.dim + 15u) / 16u; st++) {
            let bit0 = st * 48u;
            let w0 = row + bit0 / 32u;
            let sh = bit0 % 32u;
            let a = pool[w0];
            let b = pool[w0 + 1u];
            let c = pool[w0 + 2u];
            let x0 = select(a, (a >> sh) | (b << (32u - sh)), sh != 0u);
            let x1 = select(b, (b >> sh) | (c << (32u - sh)), sh != 0u);
            for (var k = 0u; k < 16u; k++) {
                let bit = 3u * k;
                // The shift amounts masked to 0..31: the same values where each branch is
                // taken, and valid constants in the branches a written-out copy never takes.
                var code: u32;
                if bit + 3u <= 32u {
                    code = (x0 >> (bit & 31u)) & 7u;
                } else if bit >= 32u {
                    code = (x1 >> ((bit - 32u) & 31u)) & 7u;
                } else {
                    code = ((x0 >> (bit & 31u)) | (x1 << ((32u - bit) & 31u))) & 7u;
                }
                s += qrot[16u * st + k] * lk[code];
            }
        }
    } else {
        let per = 128u / BITS_K;
        let vecs = (p.dim * BITS_K + 127u) / 128u;
        for (var qv = 0u; qv < vecs; qv++) {
            let w = pool4[row / 4u + qv];
            for (var k = 0u; k < per; k++) {
                let bit = k * BITS_K;
                let code = (w[bit / 32u] >> (bit % 32u)) & mask;
                s += qrot[qv * per + k] * lk[code];
            }
        }
    }
    return s;
}

// Word `off` of the value row of tile token `tt` (at word `row` of the pool).
fn value_word(row: u32, tt: u32, off: u32) -> u32 {
    if p.row_words_v <= STAGED_WORDS {
        return value_codes[tt * (STAGED_WORDS / 4u) + off / 4u][off % 4u];
    }
    return pool[row + off];
}

// acc[c] += w * level(code c) for the 16 value codes of lane j of tile token tt's value row
// (at word `row` of the pool).
fn add_values(row: u32, tt: u32, j: u32, w: vec4<f32>, acc: ptr<function, array<vec4<f32>, 16>>) {
    let bit0 = j * 16u * BITS_V;
    let w0 = bit0 / 32u;
    let sh = bit0 % 32u;
    let mask = (1u << BITS_V) - 1u;
    var x: array<u32, 4>;
    if BITS_V == 3u {
        let a = value_word(row, tt, w0);
        let b = value_word(row, tt, w0 + 1u);
        let c = value_word(row, tt, w0 + 2u);
        x[0] = select(a, (a >> sh) | (b << (32u - sh)), sh != 0u);
        x[1] = select(b, (b >> sh) | (c << (32u - sh)), sh != 0u);
    } else if BITS_V == 8u && p.row_words_v > STAGED_WORDS {
        let v = pool4[(row + w0) / 4u];
        x[0] = v.x;
        x[1] = v.y;
        x[2] = v.z;
        x[3] = v.w;
    } else {
        for (var k = 0u; k < BITS_V / 2u; k++) {
            x[k] = value_word(row, tt, w0 + k);
        }
    }
    for (var c = 0u; c < 16u; c++) {
        let bit = c * BITS_V;
        var code = (x[bit / 32u] >> (bit % 32u)) & mask;
        if BITS_V == 3u && bit % 32u > 29u {
            code = ((x[0] >> (bit & 31u)) | (x[1] << ((32u - bit) & 31u))) & mask;
        }
        (*acc)[c] += w * lv[code];
    }
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
    if tid < 8u {
        atomicStore(&tile_max[tid], 0u);
    }
    if tid == 0u {
        seq_len = u32(seq_lens[b]);
        lsum[0] = vec4<f32>(0.0);
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
    let groups = 128u / LANES;
    var acc: array<vec4<f32>, 16>;
    for (var c = 0u; c < 16u; c++) {
        acc[c] = vec4<f32>(0.0);
    }
    var l = vec4<f32>(0.0);
    var m = vec4<f32>(NEG_BIG);
    let kcodes = p.page_tokens * p.row_words_k;
    let vcodes = p.page_tokens * p.row_words_v;
    for (var tile = tile0; tile < tile1; tile++) {
        let parity = 4u * (tile & 1u);
        // Scores: one token per thread.
        let t = tile * TILE + tid;
        var s = vec4<f32>(NEG_BIG);
        var norm_v = 0.0;
        if t < reach {
            let base = head_base(b, t, h);
            let value_row = base.x + kcodes + base.y * p.row_words_v;
            value_rows[tid] = value_row;
            if p.row_words_v <= STAGED_WORDS {
                // Rows are whole 16-byte words (the layout pads them).
                for (var e = 0u; e < p.row_words_v / 4u; e++) {
                    value_codes[tid * (STAGED_WORDS / 4u) + e] = pool4[value_row / 4u + e];
                }
            }
            let dots = key_dots(base.x + base.y * p.row_words_k);
            let nk = norm_at(base.x + kcodes + vcodes, base.y);
            norm_v = norm_at(base.x + kcodes + vcodes + p.norm_words, base.y);
            for (var r = 0u; r < 4u; r++) {
                if t < limit[r] {
                    s[r] = dots[r] * nk;
                }
            }
        }
        post_tile_max(tid, parity, s);
        workgroupBarrier();
        // Softmax step (every thread computes the same m', alpha).
        var m_new = m;
        for (var r = 0u; r < 4u; r++) {
            m_new[r] = max(m[r], from_key(atomicLoad(&tile_max[parity + r])));
        }
        var alpha = vec4<f32>(1.0);
        var pr = vec4<f32>(0.0);
        for (var r = 0u; r < 4u; r++) {
            if m[r] != m_new[r] {
                alpha[r] = select(exp(m[r] - m_new[r]), 0.0, m[r] == NEG_BIG);
            }
            if s[r] != NEG_BIG {
                pr[r] = exp(s[r] - m_new[r]);
            }
        }
        m = m_new;
        probs[tid] = pr;
        weights[tid] = pr * norm_v;
        if tid < 4u {
            // The other parity's slots serve the next tile.
            atomicStore(&tile_max[(4u - parity) + tid], 0u);
        }
        workgroupBarrier();
        // Values: LANES threads per token, 16 dimensions each.
        for (var c = 0u; c < 16u; c++) {
            acc[c] *= alpha;
        }
        l *= alpha;
        if j * 16u < d {
            for (var tt = group_index; tt < TILE; tt += groups) {
                let w = weights[tt];
                if any(w != vec4<f32>(0.0)) || any(probs[tt] != vec4<f32>(0.0)) {
                    add_values(value_rows[tt], tt, j, w, &acc);
                    if j == 0u {
                        l += probs[tt];
                    }
                }
            }
        }
        workgroupBarrier();
    }
    // Sum the token groups (in order) into qin, then write this split's partials.
    for (var g = 0u; g < groups; g++) {
        if group_index == g && j * 16u < d {
            for (var c = 0u; c < 16u; c++) {
                let dim = j * 16u + c;
                if g == 0u {
                    qin[dim] = acc[c];
                } else {
                    qin[dim] += acc[c];
                }
            }
        }
        if group_index == g && j == 0u {
            lsum[0] += l;
        }
        workgroupBarrier();
    }
    let total_l = lsum[0];
    for (var r = 0u; r < 4u; r++) {
        let row = chunk * 4u + r;
        if row < p.rows {
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
                part_ml[2u * part] = m[r];
                part_ml[2u * part + 1u] = total_l[r];
            }
        }
    }
}

// Pass 2 of the flash-decoding over the compressed cache (`attend.wgsl` is pass 1): one
// workgroup per output row (sequence b, query i, head), thread c owning dimension c:
//
//   m = max_s m_s,  l = sum_s l_s e^(m_s - m),  o' = sum_s acc_s e^(m_s - m) / l
//   o = Pi^T o'      (Hadamard: butterflies in workgroup memory, then * s / sqrt(d);
//                     dense: o_c = sum_i M[i][c] o'_i)
//
// Splits that saw no token carry m = -FLT_MAX and are skipped.

const NEG_BIG: f32 = -3.4028235e38;

struct AttnParams {
    batch: u32,
    tq: u32,
    hq: u32,
    kv_heads: u32,
    dim: u32,
    dim_pad: u32,
    group: u32,
    rows: u32,
    row_chunks: u32,
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
    out_rows: u32,
    merge_groups: u32,
}

@group(0) @binding(0) var<uniform> p: AttnParams;
@group(0) @binding(1) var<storage, read> consts: array<f32>;
@group(0) @binding(2) var<storage, read> part_ml: array<f32>;
@group(0) @binding(3) var<storage, read> part_acc: array<f32>;
@group(0) @binding(4) var<storage, read_write> o: array<f32>;

var<workgroup> y: array<f32, 256>;

@compute @workgroup_size(256)
fn kv_attend_merge(
    @builtin(local_invocation_index) c: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let row = wid.y * p.merge_groups + wid.x;
    if row >= p.out_rows {
        // Uniform over the workgroup: the whole row is past the end.
        return;
    }
    let d = p.dim;
    let dp = p.dim_pad;
    let ml = row * p.splits * 2u;
    var m = NEG_BIG;
    for (var s = 0u; s < p.splits; s++) {
        m = max(m, part_ml[ml + 2u * s]);
    }
    var l = 0.0;
    var a = 0.0;
    for (var s = 0u; s < p.splits; s++) {
        let ms = part_ml[ml + 2u * s];
        if ms == NEG_BIG {
            continue;
        }
        let e = exp(ms - m);
        l += part_ml[ml + 2u * s + 1u] * e;
        if c < dp {
            a += part_acc[(row * p.splits + s) * dp + c] * e;
        }
    }
    y[c] = select(0.0, a / l, l > 0.0);
    workgroupBarrier();
    let rot = 1024u;
    var out = 0.0;
    if p.hadamard != 0u {
        for (var hb = 1u; hb < d; hb <<= 1u) {
            var mine = 0.0;
            if c < d {
                let other = y[c ^ hb];
                mine = select(y[c] + other, other - y[c], (c & hb) != 0u);
            }
            workgroupBarrier();
            if c < d {
                y[c] = mine;
            }
            workgroupBarrier();
        }
        if c < d {
            out = y[c] * (consts[rot + c] * p.hadamard_norm);
        }
    } else if c < d {
        // M row-major follows its transpose in the constants.
        let matrix = rot + d * d;
        for (var i = 0u; i < d; i++) {
            out += consts[matrix + i * d + c] * y[i];
        }
    }
    if c < d {
        o[row * d + c] = out;
    }
}

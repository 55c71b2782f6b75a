// Encode into the paged compressed KV cache (layout: deltakv_contract::kv::paged; math:
// deltakv_contract::kv::codec). One workgroup of 64 threads encodes one vector x (token t of
// sequence b, KV head h, K or V by the grid's y) per iteration, element i on thread i % 64:
//
//   r = |x|                       f32 sum of squares in the CPU's order (eight partial sums
//                                 over i % 8, added in order, then the tail past d / 8 * 8)
//   y = Pi x                      Hadamard (d a power of two): x * s, butterflies h = 1, 2, ..
//                                 in workgroup memory, * 1/sqrt(d); dense: y_i = M[i] . x with
//                                 sixteen partial sums (the CPU's `dot_lanes`)
//   idx_i = #{boundaries < y_i * (1 / r)}          (nearest level, ties to the lower)
//   words: idx packed LSB-first, `bits` per code; zero words pad the row to row_words
//   norm  = r / |c(idx)|          stored f32, or f16 in its half of a word
//
// The CPU takes r, 1 / r and the stored norm in f64 and rounds the last two to f32; WGSL has no
// f64, so `sqrt_ratio` rounds sqrt(a / b) correctly from exact integer comparisons, which
// equals the CPU's f64 result rounded to f32 except when the exact value lies within 2^-52 of
// a rounding boundary. Products that feed a sum pass through `exact_product` so that no
// compiler fuses them into an fma (the CPU rounds product and sum apart).
// Vectors whose f32 sum of squares leaves [1e-30, inf) (the CPU's f64 fallback) are scaled by
// a power of two instead: accurate, not bit for bit.

struct EncodeParams {
    batch: u32,
    tokens: u32,        // Tn, tokens per sequence in the chunk
    kv_heads: u32,
    dim: u32,
    in_dtype: u32,      // DT_* of k and v
    norm_f16: u32,
    bits_k: u32,
    bits_v: u32,
    words_k: u32,
    words_v: u32,
    page_tokens: u32,
    max_pages: u32,
    page_words: u32,
    head_words: u32,
    row_words_k: u32,
    row_words_v: u32,
    norm_words: u32,
    hadamard: u32,
    hadamard_norm: f32, // 1 / sqrt(d) as the CPU rounds it
    never: u32,         // always 0: an opaque condition (see exact_product)
    groups: u32,        // workgroups along x
    num_pages: u32,     // pages in the pool: a table entry outside [0, num_pages) is refused
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> p: EncodeParams;
@group(0) @binding(1) var<storage, read> k_in: array<u32>;
@group(0) @binding(2) var<storage, read> v_in: array<u32>;
// Written through atomics: f16 norms of two tokens share a word.
@group(0) @binding(3) var<storage, read_write> pool: array<atomic<u32>>;
@group(0) @binding(4) var<storage, read> block_table: array<i32>;
@group(0) @binding(5) var<storage, read> seq_lens: array<i32>;
@group(0) @binding(6) var<storage, read> new_lens: array<i32>;
// Levels K at 0, boundaries K at 256, levels V at 512, boundaries V at 768, rotation at 1024.
@group(0) @binding(7) var<storage, read> consts: array<f32>;
// Bit 0: a non-finite input; bit 1: a norm beyond its storage; bit 2: a token whose page is not
// in the pool (a prepared launch submitted after the tables moved), whose vector is not written.
@group(0) @binding(8) var<storage, read_write> flags: atomic<u32>;

const WG: u32 = 64u;

var<workgroup> xs: array<f32, 256>;
var<workgroup> ys: array<f32, 256>;
var<workgroup> codes: array<u32, 256>;
var<workgroup> levels: array<f32, 256>;
var<workgroup> bounds: array<f32, 256>;
var<workgroup> partial: array<f32, 8>;
// The sum of squares of x, the stored norm, 1 / r.
var<workgroup> scalars: array<f32, 4>;
// The sum of squares, read back as a uniform value (it picks the path, around barriers).
var<workgroup> fast_sum: f32;

// x * y, kept apart from the sum it feeds (a select on a uniform the compiler cannot know).
fn exact_product(x: f32, y: f32) -> f32 {
    let prod = x * y;
    return select(prod, 0.0, p.never != 0u);
}

fn load_in(kv: u32, i: u32) -> f32 {
    let w = word_of(i, p.in_dtype);
    var word: u32;
    if kv == 0u {
        word = k_in[w];
    } else {
        word = v_in[w];
    }
    return widen(word, i, p.in_dtype);
}

fn is_finite(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7f800000u) != 0x7f800000u;
}

// Sum of squares of ys[0..d] in the CPU's order, by thread 0 after the eight partials.
// Every thread calls it (barriers inside).
fn sum_squares_ys(tid: u32) -> f32 {
    let d = p.dim;
    if tid < 8u {
        var acc = 0.0;
        for (var j = 0u; j < d / 8u; j++) {
            let e = ys[8u * j + tid];
            acc = acc + exact_product(e, e);
        }
        partial[tid] = acc;
    }
    workgroupBarrier();
    var total = 0.0;
    if tid == 0u {
        total = partial[0];
        for (var l = 1u; l < 8u; l++) {
            total = total + partial[l];
        }
        var tail = 0.0;
        for (var i = d / 8u * 8u; i < d; i++) {
            tail = tail + exact_product(ys[i], ys[i]);
        }
        total = total + tail;
    }
    return total;
}

// ---- correctly rounded sqrt(a / b) for positive normal f32 a, b, from exact integers ----

// 16-bit limbs, little end first.
struct Wide {
    l: array<u32, 6>,
}

fn normalize(x: Wide) -> Wide {
    var out = x;
    var carry = 0u;
    for (var i = 0u; i < 6u; i++) {
        let t = out.l[i] + carry;
        out.l[i] = t & 0xffffu;
        carry = t >> 16u;
    }
    return out;
}

// x * y for y < 2^32 split in limbs (x normalised, at most 4 limbs in use).
fn mul_small(x: Wide, y: u32) -> Wide {
    let y0 = y & 0xffffu;
    let y1 = y >> 16u;
    var out: Wide;
    for (var i = 0u; i < 6u; i++) {
        out.l[i] = 0u;
    }
    for (var i = 0u; i < 4u; i++) {
        let a = x.l[i] * y0;
        let b = x.l[i] * y1;
        out.l[i] += a & 0xffffu;
        out.l[i + 1u] += (a >> 16u) + (b & 0xffffu);
        out.l[i + 2u] += b >> 16u;
    }
    return normalize(out);
}

// n << shift for n < 2^24 and shift < 72.
fn shifted(n: u32, shift: u32) -> Wide {
    var out: Wide;
    let li = shift / 16u;
    let sh = shift % 16u;
    let lo = (n & 0xffffu) << sh; // < 2^31
    let hi = (n >> 16u) << sh;    // < 2^23
    // Each limb by a constant index (the loop unrolled), so the limbs stay in registers.
    for (var i = 0u; i < 6u; i++) {
        var limb = 0u;
        if i == li {
            limb += lo & 0xffffu;
        }
        if i == li + 1u {
            limb += (lo >> 16u) + (hi & 0xffffu);
        }
        if i == li + 2u {
            limb += hi >> 16u;
        }
        out.l[i] = limb;
    }
    return normalize(out);
}

// -1, 0 or 1 as x <, =, > y.
fn compare(x: Wide, y: Wide) -> i32 {
    for (var i = 6u; i > 0u; i--) {
        if x.l[i - 1u] != y.l[i - 1u] {
            return select(-1, 1, x.l[i - 1u] > y.l[i - 1u]);
        }
    }
    return 0;
}

fn significand(bits: u32) -> u32 {
    return (bits & 0x7fffffu) | 0x800000u;
}

fn exponent(bits: u32) -> i32 {
    return i32((bits >> 23u) & 0xffu) - 150;
}

// The sign of m^2 b - a for m the midpoint between the f32 `lower` (bits) and the next one up.
fn midpoint_side(lower: u32, a: f32, b: f32) -> i32 {
    let m = 2u * significand(lower) + 1u; // m = M 2^(e - 1)
    let em = exponent(lower) - 1;
    let ab = bitcast<u32>(a);
    let bb = bitcast<u32>(b);
    // m^2 b = M^2 B 2^(2 em + eb) against a = A 2^ea.
    let shift = exponent(ab) - 2 * em - exponent(bb);
    if shift < 0 {
        return 1;
    }
    if shift > 70 {
        return -1;
    }
    var mw: Wide;
    for (var i = 0u; i < 6u; i++) {
        mw.l[i] = 0u;
    }
    mw.l[0] = m & 0xffffu;
    mw.l[1] = m >> 16u;
    let x = mul_small(mul_small(mw, m), significand(bb));
    return compare(x, shifted(significand(ab), u32(shift)));
}

// sqrt(a / b) rounded to nearest even, for positive normal a and b whose ratio's root is a
// normal f32.
fn sqrt_ratio(a: f32, b: f32) -> f32 {
    var z = bitcast<u32>(sqrt(a) / sqrt(b));
    for (var i = 0; i < 4; i++) {
        let side = midpoint_side(z, a, b);
        if side < 0 || (side == 0 && (z & 1u) == 1u) {
            z += 1u;
        } else {
            break;
        }
    }
    for (var i = 0; i < 4; i++) {
        let side = midpoint_side(z - 1u, a, b);
        if side > 0 || (side == 0 && (z & 1u) == 1u) {
            z -= 1u;
        } else {
            break;
        }
    }
    return bitcast<f32>(z);
}

// f32 to f16 bits, rounding to nearest even (as `half::f16::from_f32`), for x >= 0.
fn f16_bits(x: f32) -> u32 {
    let u = bitcast<u32>(x);
    let e = i32((u >> 23u) & 0xffu) - 127;
    if e > 15 {
        return select(0x7c00u, 0x7e00u, (u & 0x7fffffffu) > 0x7f800000u);
    }
    if e >= -14 {
        let mant = u & 0x7fffffu;
        var h = (u32(e + 15) << 10u) | (mant >> 13u);
        let rest = mant & 0x1fffu;
        if rest > 0x1000u || (rest == 0x1000u && (h & 1u) == 1u) {
            h += 1u; // may carry into the exponent, up to infinity: as it should
        }
        return h;
    }
    if e < -25 {
        return 0u;
    }
    // Subnormal: units of 2^-24, the significand shifted right by -e - 1.
    let full = (u & 0x7fffffu) | 0x800000u;
    let s = u32(-e - 1);
    let h = full >> s;
    let rest = full & ((1u << s) - 1u);
    let half_ulp = 1u << (s - 1u);
    var out = h;
    if rest > half_ulp || (rest == half_ulp && (h & 1u) == 1u) {
        out += 1u;
    }
    return out;
}

@compute @workgroup_size(64)
fn kv_encode(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let kv = wid.y;
    let d = p.dim;
    let bits = select(p.bits_v, p.bits_k, kv == 0u);
    let words = select(p.words_v, p.words_k, kv == 0u);
    let row_words = select(p.row_words_v, p.row_words_k, kv == 0u);
    for (var i = tid; i < 256u; i += WG) {
        levels[i] = consts[512u * kv + i];
        bounds[i] = consts[512u * kv + 256u + i];
    }
    let total = p.batch * p.tokens * p.kv_heads;
    let rot = 1024u;
    for (var vec = wid.x; vec < total; vec += p.groups) {
        let h = vec % p.kv_heads;
        let bt = vec / p.kv_heads;
        let t = bt % p.tokens;
        let b = bt / p.tokens;
        let valid = i32(t) < new_lens[b];
        workgroupBarrier(); // the previous vector's reads are done
        for (var i = tid; i < d; i += WG) {
            let x = load_in(kv, vec * d + i);
            if valid && !is_finite(x) {
                atomicOr(&flags, 1u);
            }
            xs[i] = x;
            ys[i] = x;
        }
        workgroupBarrier();
        let fast = sum_squares_ys(tid);
        if tid == 0u {
            scalars[0] = fast;
            fast_sum = fast;
        }
        let sum = workgroupUniformLoad(&fast_sum);
        let is_fast = is_finite(sum) && sum >= 1e-30;
        // The slow path's scale: 2^-(exponent of max |x|), exact.
        var scale = 1.0;
        if !is_fast {
            var big = 0.0;
            for (var i = 0u; i < d; i++) {
                big = max(big, abs(xs[i]));
            }
            if big > 0.0 {
                scale = bitcast<f32>((254u - ((bitcast<u32>(big) >> 23u) & 0xffu)) << 23u);
            }
            workgroupBarrier();
            for (var i = tid; i < d; i += WG) {
                ys[i] = xs[i] * scale;
            }
            workgroupBarrier();
            let scaled = sum_squares_ys(tid);
            if tid == 0u {
                scalars[0] = scaled;
            }
            workgroupBarrier();
        }
        let r_sq = scalars[0]; // (r * scale)^2
        if tid == 0u {
            var inv = 0.0;
            if r_sq > 0.0 {
                if is_fast {
                    inv = sqrt_ratio(1.0, r_sq);
                } else {
                    inv = scale / sqrt(r_sq);
                }
            }
            scalars[2] = inv;
        }
        workgroupBarrier();
        let inv = scalars[2];
        // y = Pi x.
        if p.hadamard != 0u {
            for (var i = tid; i < d; i += WG) {
                ys[i] = xs[i] * consts[rot + i];
            }
            workgroupBarrier();
            for (var hb = 1u; hb < d; hb <<= 1u) {
                for (var k = tid; k < d / 2u; k += WG) {
                    let i = (k / hb) * 2u * hb + k % hb;
                    let a = ys[i];
                    let c = ys[i + hb];
                    ys[i] = a + c;
                    ys[i + hb] = a - c;
                }
                workgroupBarrier();
            }
            for (var i = tid; i < d; i += WG) {
                let y = ys[i] * p.hadamard_norm;
                codes[i] = nearest(bits, y * inv);
            }
        } else {
            for (var i = tid; i < d; i += WG) {
                // M^T is stored [c][i] = M[i][c]: thread i reads a coalesced column.
                var lanes: array<f32, 16>;
                for (var l = 0u; l < 16u; l++) {
                    lanes[l] = 0.0;
                }
                for (var j = 0u; j < d / 16u; j++) {
                    for (var l = 0u; l < 16u; l++) {
                        let c = 16u * j + l;
                        lanes[l] = lanes[l] + exact_product(consts[rot + c * d + i], xs[c]);
                    }
                }
                var y = lanes[0];
                for (var l = 1u; l < 16u; l++) {
                    y = y + lanes[l];
                }
                var tail = 0.0;
                for (var c = d / 16u * 16u; c < d; c++) {
                    tail = tail + exact_product(consts[rot + c * d + i], xs[c]);
                }
                y = y + tail;
                codes[i] = nearest(bits, y * inv);
            }
        }
        workgroupBarrier();
        for (var i = tid; i < d; i += WG) {
            ys[i] = levels[codes[i]];
        }
        workgroupBarrier();
        let code_sq_sum = sum_squares_ys(tid);
        if tid == 0u {
            var norm = 0.0;
            if r_sq > 0.0 && code_sq_sum > 0.0 {
                if is_fast {
                    norm = sqrt_ratio(r_sq, code_sq_sum);
                } else {
                    norm = sqrt(r_sq) / scale / sqrt(code_sq_sum);
                }
            }
            scalars[1] = norm;
        }
        workgroupBarrier();
        // Destination row and norm section.
        let at = u32(seq_lens[b]) + t;
        let page_index = at / p.page_tokens;
        var entry = -1;
        if page_index < p.max_pages {
            entry = block_table[b * p.max_pages + page_index];
        }
        let page_ok = entry >= 0 && u32(entry) < p.num_pages;
        if valid && !page_ok && tid == 0u {
            atomicOr(&flags, 4u);
        }
        let store = valid && page_ok;
        let page = select(0u, u32(entry), page_ok);
        let slot = at % p.page_tokens;
        let head = page * p.page_words + h * p.head_words;
        let kcodes = p.page_tokens * p.row_words_k;
        let vcodes = p.page_tokens * p.row_words_v;
        var row = head + slot * p.row_words_k;
        var norms = head + kcodes + vcodes;
        if kv == 1u {
            row = head + kcodes + slot * p.row_words_v;
            norms += p.norm_words;
        }
        for (var w = tid; store && w < row_words; w += WG) {
            // Word w holds bits 32w .. 32w + 31 of the LSB-first stream.
            var word = 0u;
            if w < words {
                let first = 32u * w / bits;
                let last = min((32u * w + 31u) / bits, d - 1u);
                for (var i = first; i <= last; i++) {
                    let shift = i32(i * bits) - i32(32u * w);
                    let c = codes[i];
                    word |= select(c >> u32(max(-shift, 0)), c << u32(max(shift, 0)), shift >= 0);
                }
            }
            atomicStore(&pool[row + w], word);
        }
        if store && tid == 0u {
            let norm = scalars[1];
            if p.norm_f16 != 0u {
                let hbits = f16_bits(norm);
                if (hbits & 0x7c00u) == 0x7c00u {
                    atomicOr(&flags, 2u);
                }
                let word = norms + slot / 2u;
                let shift = 16u * (slot % 2u);
                atomicAnd(&pool[word], ~(0xffffu << shift));
                atomicOr(&pool[word], hbits << shift);
            } else {
                if !is_finite(norm) {
                    atomicOr(&flags, 2u);
                }
                atomicStore(&pool[norms + slot], bitcast<u32>(norm));
            }
        }
    }
}

// The number of boundaries below u (boundaries padded with +inf to 256).
fn nearest(bits: u32, u: f32) -> u32 {
    var idx = 0u;
    for (var step = 1u << (bits - 1u); step > 0u; step >>= 1u) {
        if u > bounds[idx + step - 1u] {
            idx += step;
        }
    }
    return idx;
}

// o's stores, shared by every GDN kernel that writes o: `o` is bound as array<atomic<u32>>
// (two 16-bit outputs share a word, and neighbouring heads' columns may fall in one word, written
// by different workgroups) and `p.out_dtype` names its dtype.

// Stores o element i (two consecutive elements starting at i when `pair`).
fn store_o(i: u32, x: vec2<f32>, pair: bool) {
    let d = p.out_dtype;
    if d == DT_F32 {
        atomicStore(&o[i], bitcast<u32>(x.x));
        if pair {
            atomicStore(&o[i + 1u], bitcast<u32>(x.y));
        }
        return;
    }
    if pair && (i & 1u) == 0u {
        atomicStore(&o[i >> 1u], half_bits(x.x, d) | (half_bits(x.y, d) << 16u));
        return;
    }
    store_o_half(i, half_bits(x.x, d));
    if pair {
        store_o_half(i + 1u, half_bits(x.y, d));
    }
}

// One 16-bit element of o, leaving the other half of its word as it is.
fn store_o_half(i: u32, bits: u32) {
    let shift = (i & 1u) * 16u;
    atomicAnd(&o[i >> 1u], ~(0xffffu << shift));
    atomicOr(&o[i >> 1u], bits << shift);
}

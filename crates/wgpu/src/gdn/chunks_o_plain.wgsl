// The chunked state pass's o for the cooperative-matrix module, written without atomics: naga
// 30 declares the Vulkan memory model for such modules, where its device-scope atomics need a
// capability it does not declare. The launcher runs that module only with an even V, so each
// thread's column pair is one whole word of a 16-bit o (or two f32 words) that no other
// invocation writes.
@group(0) @binding(9) var<storage, read_write> o: array<u32>;

// Stores o element i and i + 1 (`pair`; i even for 16-bit o).
fn store_o(i: u32, x: vec2<f32>, pair: bool) {
    let d = p.out_dtype;
    if d == DT_F32 {
        o[i] = bitcast<u32>(x.x);
        if pair {
            o[i + 1u] = bitcast<u32>(x.y);
        }
        return;
    }
    o[i >> 1u] = half_bits(x.x, d) | (select(0u, half_bits(x.y, d), pair) << 16u);
}

// The bf16 state pool for `decode_bands.wgsl`: four columns (8 bytes, two words) per access, widened
// to f32 and rounded back to nearest even.

@group(0) @binding(9) var<storage, read_write> state: array<vec2<u32>>;

// Columns 4 i .. 4 i + 3 of the pool's elements in row-major order.
fn load_state4(i: u32) -> vec4<f32> {
    let w = state[i];
    return vec4<f32>(
        bitcast<f32>(w.x << 16u),
        bitcast<f32>(w.x & 0xffff0000u),
        bitcast<f32>(w.y << 16u),
        bitcast<f32>(w.y & 0xffff0000u),
    );
}

fn store_state4(i: u32, x: vec4<f32>) {
    state[i] = vec2<u32>(
        bf16_bits(x.x) | (bf16_bits(x.y) << 16u),
        bf16_bits(x.z) | (bf16_bits(x.w) << 16u),
    );
}

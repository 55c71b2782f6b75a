// The f32 state pool for `decode_bands.wgsl`: four columns (16 bytes) per access.

@group(0) @binding(9) var<storage, read_write> state: array<vec4<f32>>;

// Columns 4 i .. 4 i + 3 of the pool's elements in row-major order.
fn load_state4(i: u32) -> vec4<f32> {
    return state[i];
}

fn store_state4(i: u32, x: vec4<f32>) {
    state[i] = x;
}

// The state and the intermediate states as 32-bit words, for the kernels whose threads own
// column pairs (`recurrent.wgsl`, `chunk.wgsl`): an f32 element per word, or a bf16 column
// pair per word.

// Threads per row group; a workgroup covers 2 * COL_PAIRS columns (8 or 32).
override COL_PAIRS: u32 = 32u;
// The state is bf16 (V even: a thread's column pair is one word); else f32.
override STATE_BF16: bool = false;

@group(0) @binding(9) var<storage, read_write> state: array<u32>;
@group(0) @binding(11) var<storage, read_write> intermediate: array<u32>;

// Two state elements (columns col, col + 1 of row r of the slab starting at row `slab`),
// widened to f32; `col_ok` says which exist.
fn load_state_pair(slab: u32, r: u32, col: u32, col_ok: vec2<bool>) -> vec2<f32> {
    var x = vec2<f32>(0.0);
    let at = (slab + r) * p.value_dim + col;
    if STATE_BF16 {
        let word = state[at >> 1u];
        x = vec2<f32>(bitcast<f32>(word << 16u), bitcast<f32>(word & 0xffff0000u));
    } else {
        x.x = bitcast<f32>(state[at]);
        if col_ok.y {
            x.y = bitcast<f32>(state[at + 1u]);
        }
    }
    return x;
}

fn store_state_pair(slab: u32, r: u32, col: u32, col_ok: vec2<bool>, x: vec2<f32>) {
    let at = (slab + r) * p.value_dim + col;
    if STATE_BF16 {
        state[at >> 1u] = bf16_bits(x.x) | (bf16_bits(x.y) << 16u);
    } else {
        state[at] = bitcast<u32>(x.x);
        if col_ok.y {
            state[at + 1u] = bitcast<u32>(x.y);
        }
    }
}

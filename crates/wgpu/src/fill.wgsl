// Fills a buffer with one 32-bit pattern (the poison that makes unwritten outputs show as
// NaN), on the device: a copy from the host would cost a transfer of the whole buffer.

struct FillParams {
    words: u32,
    pattern: u32,
    // Workgroups per row of the grid (x); the grid's rows (y) cover the rest.
    row: u32,
    pad: u32,
}

@group(0) @binding(0) var<uniform> fill_params: FillParams;
@group(0) @binding(1) var<storage, read_write> target_words: array<u32>;

@compute @workgroup_size(256)
fn fill(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let i = (wid.y * fill_params.row + wid.x) * 256u + tid;
    if i < fill_params.words {
        target_words[i] = fill_params.pattern;
    }
}

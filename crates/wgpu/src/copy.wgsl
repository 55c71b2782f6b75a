// A plain device copy for the bandwidth reference of the benchmarks: every thread moves
// COPY_UNROLL vec4<u32> words (its loads issued before its stores), consecutive threads
// consecutive words, so each warp-wide access is a whole run of 16-byte words.

const COPY_UNROLL: u32 = 4u;
const COPY_THREADS: u32 = 256u;

struct CopyParams {
    words: u32,   // vec4 words to copy
    row: u32,     // workgroups per row of the grid (x); rows (y) cover the rest
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> copy_params: CopyParams;
@group(0) @binding(1) var<storage, read> copy_src: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> copy_dst: array<vec4<u32>>;

@compute @workgroup_size(COPY_THREADS)
fn copy_words(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let first = (wid.y * copy_params.row + wid.x) * COPY_THREADS * COPY_UNROLL + tid;
    var x: array<vec4<u32>, COPY_UNROLL>;
    for (var e = 0u; e < COPY_UNROLL; e++) {
        let i = first + e * COPY_THREADS;
        if i < copy_params.words {
            x[e] = copy_src[i];
        }
    }
    for (var e = 0u; e < COPY_UNROLL; e++) {
        let i = first + e * COPY_THREADS;
        if i < copy_params.words {
            copy_dst[i] = x[e];
        }
    }
}

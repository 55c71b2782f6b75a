// `publish_dot` / `read_dot` through workgroup memory, for `attend_lanes.wgsl` on adapters
// without subgroup operations: each lane stores its partial, and after the barrier the reader
// adds a token's LANES partials in lane order.

// [token][lane] partial dots (TILE x LANES <= 1024).
var<workgroup> dot_parts: array<vec4<f32>, 1024>;

fn publish_dot(tt: u32, j: u32, dot: vec4<f32>) {
    dot_parts[tt * LANES + j] = dot;
}

fn read_dot(tt: u32) -> vec4<f32> {
    var x = dot_parts[tt * LANES];
    for (var j = 1u; j < LANES; j++) {
        x += dot_parts[tt * LANES + j];
    }
    return x;
}

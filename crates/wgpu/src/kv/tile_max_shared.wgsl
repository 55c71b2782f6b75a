// `post_tile_max` for adapters without subgroup operations: one workgroup atomic per thread and
// scored row, on order-preserving keys.

fn post_tile_max(tid: u32, parity: u32, s: vec4<f32>) {
    for (var r = 0u; r < 4u; r++) {
        if s[r] != NEG_BIG {
            atomicMax(&tile_max[parity + r], order_key(s[r]));
        }
    }
}

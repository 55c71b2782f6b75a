// `post_tile_max` through subgroup operations: each subgroup's max per row, then one workgroup
// atomic per row from the subgroup's first active invocation. Every invocation calls it, in uniform
// control flow; rows a thread does not score hold NEG_BIG, which leaves the max as it is.

fn post_tile_max(tid: u32, parity: u32, s: vec4<f32>) {
    let m = subgroupMax(s);
    if subgroupBroadcastFirst(tid) == tid {
        atomicMax(&tile_max[parity], order_key(m.x));
        atomicMax(&tile_max[parity + 1u], order_key(m.y));
        atomicMax(&tile_max[parity + 2u], order_key(m.z));
        atomicMax(&tile_max[parity + 3u], order_key(m.w));
    }
}

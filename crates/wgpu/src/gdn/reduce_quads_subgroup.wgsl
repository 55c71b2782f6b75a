// `lane_sums` through subgroup shuffles, for `decode.wgsl`: the eight row lanes of a column quad
// are neighbouring invocations (tid = 8 * quad + lane), which lie in one subgroup when
// subgroups hold a multiple of 8 invocations (the launcher checks the adapter's smallest).
// (naga takes the subgroup builtins without WGSL's `enable subgroups;`.)

struct LaneSums {
    // S^T k and S^T q of the thread's four columns.
    sk: vec4<f32>,
    sq: vec4<f32>,
    // |q|^2, |k|^2, k . q, 0.
    norms: vec4<f32>,
}

// The sums over the eight row lanes of thread `tid`'s column quad. Every invocation of the
// workgroup calls it.
fn lane_sums(tid: u32, sk: vec4<f32>, sq: vec4<f32>, norms: vec4<f32>) -> LaneSums {
    var x = LaneSums(sk, sq, norms);
    for (var lane_mask = 1u; lane_mask < 8u; lane_mask <<= 1u) {
        x.sk += subgroupShuffleXor(x.sk, lane_mask);
        x.sq += subgroupShuffleXor(x.sq, lane_mask);
        x.norms += subgroupShuffleXor(x.norms, lane_mask);
    }
    return x;
}

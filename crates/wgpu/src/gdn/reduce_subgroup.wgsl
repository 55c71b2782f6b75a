// `row_group_sums` through subgroup shuffles: the eight row groups of a column pair are
// neighbouring invocations (tid = 8 * column pair + row group), which lie in one subgroup when
// subgroups hold a multiple of 8 invocations (the launcher checks the adapter's smallest).
// (naga takes the subgroup builtins without WGSL's `enable subgroups;`, which it does not
// parse yet; wgpu allows them on a device created with `Features::SUBGROUP`.)

struct RowGroupSums {
    // S^T k (two columns), S^T q (two columns).
    columns: vec4<f32>,
    // |q|^2, |k|^2, k . q, 0.
    norms: vec4<f32>,
}

// The sums over the eight row groups of the partials of thread `tid`'s column pair.
fn row_group_sums(tid: u32, columns: vec4<f32>, norms: vec4<f32>) -> RowGroupSums {
    var c = columns;
    var n = norms;
    for (var lane_mask = 1u; lane_mask < 8u; lane_mask <<= 1u) {
        c += subgroupShuffleXor(c, lane_mask);
        n += subgroupShuffleXor(n, lane_mask);
    }
    return RowGroupSums(c, n);
}

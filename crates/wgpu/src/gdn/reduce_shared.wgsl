// `row_group_sums` through workgroup memory, for adapters without subgroup operations: each
// thread writes its partials, a barrier, each thread adds its column pair's eight.

struct RowGroupSums {
    // S^T k (two columns), S^T q (two columns).
    columns: vec4<f32>,
    // |q|^2, |k|^2, k . q, 0.
    norms: vec4<f32>,
}

// Per thread (tid = 8 * column pair + row group): partial S^T k and S^T q.
var<workgroup> partials: array<vec4<f32>, 256>;
// Per row group: partial |q|^2, |k|^2, k . q.
var<workgroup> norm_partials: array<vec4<f32>, 8>;

// The sums over the eight row groups of the partials of thread `tid`'s column pair. Every
// thread of the workgroup calls it (it holds barriers: the first keeps this call's writes
// from overtaking the previous call's reads).
fn row_group_sums(tid: u32, columns: vec4<f32>, norms: vec4<f32>) -> RowGroupSums {
    workgroupBarrier();
    partials[tid] = columns;
    if tid < 8u {
        norm_partials[tid] = norms;
    }
    workgroupBarrier();
    var out = RowGroupSums(vec4<f32>(0.0), vec4<f32>(0.0));
    let first = tid & ~7u;
    for (var g = 0u; g < 8u; g++) {
        out.columns += partials[first + g];
        out.norms += norm_partials[g];
    }
    return out;
}

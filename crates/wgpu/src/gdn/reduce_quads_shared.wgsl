// `lane_sums` through workgroup memory, for `decode.wgsl` on adapters without subgroup
// operations: each thread writes its partials, a barrier, each thread adds its quad's eight.

struct LaneSums {
    // S^T k and S^T q of the thread's four columns.
    sk: vec4<f32>,
    sq: vec4<f32>,
    // |q|^2, |k|^2, k . q, 0.
    norms: vec4<f32>,
}

// Per thread (tid = 8 * quad + row lane, at most 256 threads): partial S^T k and S^T q.
var<workgroup> sk_partials: array<vec4<f32>, 256>;
var<workgroup> sq_partials: array<vec4<f32>, 256>;
// Per row lane: partial |q|^2, |k|^2, k . q (every quad has the same).
var<workgroup> norm_partials: array<vec4<f32>, 8>;

// The sums over the eight row lanes of thread `tid`'s column quad. Every invocation of the
// workgroup calls it (it holds barriers: the first keeps this call's writes from overtaking
// the previous call's reads).
fn lane_sums(tid: u32, sk: vec4<f32>, sq: vec4<f32>, norms: vec4<f32>) -> LaneSums {
    workgroupBarrier();
    sk_partials[tid] = sk;
    sq_partials[tid] = sq;
    if tid < 8u {
        norm_partials[tid] = norms;
    }
    workgroupBarrier();
    var x = LaneSums(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    let first = tid & ~7u;
    for (var lane = 0u; lane < 8u; lane++) {
        x.sk += sk_partials[first + lane];
        x.sq += sq_partials[first + lane];
        x.norms += norm_partials[lane];
    }
    return x;
}

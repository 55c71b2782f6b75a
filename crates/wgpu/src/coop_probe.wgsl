// C = A B for a batch of 16 x 16 tiles on cooperative matrices (tensor cores on NVIDIA): A and
// B f16, C accumulated in f32, all row-major, tile t at element 256 t. One subgroup per tile
// (workgroups of 32 invocations; every operand of the cooperative operations is uniform).

@group(0) @binding(0) var<storage, read> a: array<f16>;
@group(0) @binding(1) var<storage, read> b: array<f16>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;

@compute @workgroup_size(32)
fn coop_probe(@builtin(workgroup_id) wid: vec3<u32>) {
    let at = wid.x * 256u;
    let ma = coopLoadT<coop_mat16x16<f16, A>>(&a[at], 16u);
    let mb = coopLoadT<coop_mat16x16<f16, B>>(&b[at], 16u);
    var mc = coop_mat16x16<f32, C>();
    mc = coopMultiplyAdd(ma, mb, mc);
    coopStoreT(mc, &c[at], 16u);
}

// The throughput of the matrix units: each subgroup multiplies the first tiles of a and b into
// four independent accumulators (each loaded from c) PEAK_STEPS times (operands held in
// registers), then stores the sums so that nothing is left out. 2 x 16^3 x 4 x PEAK_STEPS flops per workgroup.
override PEAK_STEPS: u32 = 1024u;

@compute @workgroup_size(32)
fn coop_peak(@builtin(workgroup_id) wid: vec3<u32>) {
    let at = wid.x * 1024u;
    let ma = coopLoadT<coop_mat16x16<f16, A>>(&a[0], 16u);
    let mb = coopLoadT<coop_mat16x16<f16, B>>(&b[0], 16u);
    // Four chains from four loads, so that no compiler may merge them as equal values.
    var c0 = coopLoadT<coop_mat16x16<f32, C>>(&c[at], 16u);
    var c1 = coopLoadT<coop_mat16x16<f32, C>>(&c[at + 256u], 16u);
    var c2 = coopLoadT<coop_mat16x16<f32, C>>(&c[at + 512u], 16u);
    var c3 = coopLoadT<coop_mat16x16<f32, C>>(&c[at + 768u], 16u);
    for (var i = 0u; i < PEAK_STEPS; i++) {
        c0 = coopMultiplyAdd(ma, mb, c0);
        c1 = coopMultiplyAdd(ma, mb, c1);
        c2 = coopMultiplyAdd(ma, mb, c2);
        c3 = coopMultiplyAdd(ma, mb, c3);
    }
    coopStoreT(c0, &c[at], 16u);
    coopStoreT(c1, &c[at + 256u], 16u);
    coopStoreT(c2, &c[at + 512u], 16u);
    coopStoreT(c3, &c[at + 768u], 16u);
}

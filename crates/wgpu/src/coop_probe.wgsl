// C = A B for a batch of 16 x 16 tiles on cooperative matrices (tensor cores on NVIDIA): A and
// B f16, C accumulated in f32, all row-major, tile t at element 256 t. One subgroup per tile
// (workgroups of 32 invocations; every operand of the cooperative operations is uniform).

enable f16;
enable wgpu_cooperative_matrix;

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

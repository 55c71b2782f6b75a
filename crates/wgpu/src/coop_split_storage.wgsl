// `coop_split.wgsl`'s product with the halves split on the host and read from storage (no
// workgroup memory): x_halves [entries][2][32][128] and y_halves [entries][2][128][16], f16,
// the high half then the low half times LO_SCALE of each operand (coop_split_step.wgsl).

@group(0) @binding(0) var<storage, read> x_halves: array<f16>;
@group(0) @binding(1) var<storage, read> y_halves: array<f16>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(32)
fn coop_split_product_storage(@builtin(workgroup_id) wid: vec3<u32>) {
    let entry = wid.x;
    let xs = entry * 8192u;
    let ys = entry * 4096u;
    for (var row0 = 0u; row0 < 32u; row0 += 16u) {
        var high = coop_mat16x16<f32, C>();
        var cross = coop_mat16x16<f32, C>();
        for (var k0 = 0u; k0 < 128u; k0 += 16u) {
            let a_hi = coopLoadT<coop_mat16x16<f16, A>>(&x_halves[xs + row0 * 128u + k0], 128u);
            let a_lo = coopLoadT<coop_mat16x16<f16, A>>(&x_halves[xs + 4096u + row0 * 128u + k0], 128u);
            let b_hi = coopLoadT<coop_mat16x16<f16, B>>(&y_halves[ys + k0 * 16u], 16u);
            let b_lo = coopLoadT<coop_mat16x16<f16, B>>(&y_halves[ys + 2048u + k0 * 16u], 16u);
            add_split_products(&high, &cross, a_hi, a_lo, b_hi, b_lo);
        }
        let result = split_sum(high, cross) * 0.5;
        coopStoreT(result, &out[(entry * 32u + row0) * 16u], 16u);
    }
}

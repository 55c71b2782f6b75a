// `publish_dot` / `read_dot` through subgroup shuffles, for `attend_lanes.wgsl`: the LANES lanes
// of a token are neighbouring invocations (tid = LANES x group + lane), which lie in one
// subgroup when subgroups hold a multiple of LANES invocations (the launcher checks the
// adapter's smallest). The lanes sum their four row dots by a reduce-scatter: the first step
// keeps two rows (lanes with the step's bit set the upper two) and adds the partner's copy of
// them, the second keeps one, then plain butterflies finish the sum over the other lanes; one
// lane per row writes it. (naga takes the subgroup builtins without WGSL's `enable subgroups;`.)

// The tile's dots, [token][row].
var<workgroup> dots: array<f32, 512>;

// Lane j's partial dot (four rows) of tile token tt. Every invocation of the workgroup calls it.
fn publish_dot(tt: u32, j: u32, dot: vec4<f32>) {
    let upper2 = (j & (LANES / 2u)) != 0u;
    let keep2 = select(dot.xy, dot.zw, upper2);
    let send2 = select(dot.zw, dot.xy, upper2);
    let pair = keep2 + subgroupShuffleXor(send2, LANES / 2u);
    let upper1 = (j & (LANES / 4u)) != 0u;
    var x = select(pair.x, pair.y, upper1) + subgroupShuffleXor(select(pair.y, pair.x, upper1), LANES / 4u);
    for (var mask = LANES / 8u; mask > 0u; mask >>= 1u) {
        x += subgroupShuffleXor(x, mask);
    }
    if j % (LANES / 4u) == 0u {
        let row = select(0u, 2u, upper2) + select(0u, 1u, upper1);
        dots[4u * tt + row] = x;
    }
}

// The four row dots of tile token tt (after a barrier).
fn read_dot(tt: u32) -> vec4<f32> {
    return vec4<f32>(dots[4u * tt], dots[4u * tt + 1u], dots[4u * tt + 2u], dots[4u * tt + 3u]);
}

// The staged state kernel's tile of S in rows: [K <= 128][8 column pairs] of vec2 (see
// chunks_state_staged.wgsl). A product step reads four rows of S for its column pair, one load
// per row.

var<workgroup> block_s: array<vec2<f32>, 1024>;

// Rows 4 rg .. 4 rg + 3 of the tile at column pair cp.
fn store_s_rows(rg: u32, cp: u32, s0: vec2<f32>, s1: vec2<f32>, s2: vec2<f32>, s3: vec2<f32>) {
    let pairs = VT / 2u;
    let r = 4u * rg;
    block_s[r * pairs + cp] = s0;
    block_s[(r + 1u) * pairs + cp] = s1;
    block_s[(r + 2u) * pairs + cp] = s2;
    block_s[(r + 3u) * pairs + cp] = s3;
}

// Chunk rows rg and rg ^ 16 of the staged matrix (W or Qd) times the tile of S at column pair
// cp, each over the half of K that rg / 16 names: (row rg, row rg ^ 16) as (xy, zw). Two rows
// per thread share each load of S.
fn staged_half_products(rg: u32, kp4: u32, cp: u32) -> vec4<f32> {
    let pairs = VT / 2u;
    let half = kp4 / 2u;
    let first = (rg / 16u) * half;
    let own = rg * (kp4 + STAGE_PAD);
    let other = (rg ^ 16u) * (kp4 + STAGE_PAD);
    var a = vec2<f32>(0.0);
    var b = vec2<f32>(0.0);
    for (var r4 = first; r4 < first + half; r4++) {
        let s0 = block_s[(4u * r4) * pairs + cp];
        let s1 = block_s[(4u * r4 + 1u) * pairs + cp];
        let s2 = block_s[(4u * r4 + 2u) * pairs + cp];
        let s3 = block_s[(4u * r4 + 3u) * pairs + cp];
        let wa = staged[own + r4];
        let wb = staged[other + r4];
        a += wa.x * s0 + wa.y * s1 + wa.z * s2 + wa.w * s3;
        b += wb.x * s0 + wb.y * s1 + wb.z * s2 + wb.w * s3;
    }
    return vec4<f32>(a, b);
}

// The staged state kernel's tile of S in columns: 16 columns of K / 4 + 1 vec4 words, element
// (k, c) in component k % 4 of word k / 4 of column (c % 2) 8 + c / 2 (see
// chunks_state_staged.wgsl). A product step reads four rows of S for each of its two
// columns in one load per column, so W S and Qd S take two loads of S per 16 multiply-adds
// where a layout by rows would take four. Even columns come first, then odd ones, so that the eight
// columns 2 cp (or 2 cp + 1) a subgroup reads at once lie one column stride apart; the stride,
// one word more than the 32 that K <= 128 needs, puts them in different banks.

// Words per column of the tile. The layout is written for the staged kernel's 16-column tiles
// (8 column pairs; the launcher's staged shape).
const S_COLUMN: u32 = 33u;

var<workgroup> block_s: array<vec4<f32>, 528>;

// Rows 4 rg .. 4 rg + 3 of the tile at column pair cp (columns 2 cp and 2 cp + 1).
fn store_s_rows(rg: u32, cp: u32, s0: vec2<f32>, s1: vec2<f32>, s2: vec2<f32>, s3: vec2<f32>) {
    block_s[cp * S_COLUMN + rg] = vec4<f32>(s0.x, s1.x, s2.x, s3.x);
    block_s[(8u + cp) * S_COLUMN + rg] = vec4<f32>(s0.y, s1.y, s2.y, s3.y);
}

// Chunk rows rg and rg ^ 16 of the staged matrix (W or Qd) times the tile of S at column pair
// cp, each over the half of K that rg / 16 names: (row rg, row rg ^ 16) as (xy, zw). Both rows
// share each load of S, and each load of S holds four of its rows.
fn staged_half_products(rg: u32, kp4: u32, cp: u32) -> vec4<f32> {
    let half = kp4 / 2u;
    let first = (rg / 16u) * half;
    let own = rg * (kp4 + STAGE_PAD);
    let other = (rg ^ 16u) * (kp4 + STAGE_PAD);
    let even = cp * S_COLUMN;
    let odd = (8u + cp) * S_COLUMN;
    var a = vec2<f32>(0.0);
    var b = vec2<f32>(0.0);
    for (var r4 = first; r4 < first + half; r4++) {
        let sa = block_s[even + r4];
        let sb = block_s[odd + r4];
        let wa = staged[own + r4];
        let wb = staged[other + r4];
        a += vec2<f32>(dot(wa, sa), dot(wa, sb));
        b += vec2<f32>(dot(wb, sa), dot(wb, sb));
    }
    return vec4<f32>(a, b);
}

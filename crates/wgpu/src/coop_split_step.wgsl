// The f32-accurate step of the cooperative-matrix kernels. Each operand x is split into f16
// halves, x = hi + lo / LO_SCALE with hi = x rounded to f16's 11 significant bits and
// lo = f16((x - hi) LO_SCALE) (the low half scaled so that it stays a normal f16 number where
// x - hi lies far below f16's normal range), and each 16 x 16 x 16 step takes three products:
// hi hi into one accumulator, hi lo + lo hi into another, joined once at the end
// (tools/coop-lab/emulate.py: as accurate as f32 sums).

const LO_SCALE: f32 = 2048.0;

// x's halves (hi, lo). The high half is x on f16's grid, found by arithmetic a compiler cannot
// undo (not as f32(f16(x)), a round trip NVIDIA's Vulkan compiler takes for x itself, leaving
// lo zero; tuning log row 18): for |x| at or above f16's smallest normal 2^-14, half an f16
// step added to x's bits and the 13 bits f16 drops cleared; below it, x rounded to a multiple of
// 2^-24, f16's subnormal step. Either way f16(hi) is exact, so lo holds all of x - hi.
fn split_f16(x: f32) -> vec2<f16> {
    let normal = bitcast<f32>((bitcast<u32>(x) + 0x1000u) & 0xffffe000u);
    let subnormal = round(x * 16777216.0) * (1.0 / 16777216.0);
    let hi = select(normal, subnormal, abs(x) < (1.0 / 16384.0));
    return vec2<f16>(f16(hi), f16((x - hi) * LO_SCALE));
}

// One step's three products into the accumulators `high` and `cross`.
fn add_split_products(
    high: ptr<function, coop_mat16x16<f32, C>>,
    cross: ptr<function, coop_mat16x16<f32, C>>,
    a_hi: coop_mat16x16<f16, A>,
    a_lo: coop_mat16x16<f16, A>,
    b_hi: coop_mat16x16<f16, B>,
    b_lo: coop_mat16x16<f16, B>,
) {
    *high = coopMultiplyAdd(a_hi, b_hi, *high);
    *cross = coopMultiplyAdd(a_lo, b_hi, coopMultiplyAdd(a_hi, b_lo, *cross));
}

// The product from its two accumulators.
fn split_sum(high: coop_mat16x16<f32, C>, cross: coop_mat16x16<f32, C>) -> coop_mat16x16<f32, C> {
    return high + cross * (1.0 / LO_SCALE);
}

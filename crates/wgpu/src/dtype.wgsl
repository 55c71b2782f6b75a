// Element access shared by deltakv's shaders. Every tensor is bound as `array<u32>`: f32
// elements are whole words, f16 and bf16 elements halves of words (element i is the low half
// of word i / 2 when i is even, the high half when odd), i64 elements word pairs (low first).

// dtype codes, as `dtype_code` on the Rust side.
const DT_F32: u32 = 0u;
const DT_F16: u32 = 1u;
const DT_BF16: u32 = 2u;
const DT_I32: u32 = 3u;
const DT_I64: u32 = 4u;

// The word that holds element `i` of a float tensor of dtype `dtype`.
fn word_of(i: u32, dtype: u32) -> u32 {
    return select(i >> 1u, i, dtype == DT_F32);
}

// Element `i`, held in `word`, of a float tensor of dtype `dtype`, widened to f32.
fn widen(word: u32, i: u32, dtype: u32) -> f32 {
    if dtype == DT_F32 {
        return bitcast<f32>(word);
    }
    let half = select(word & 0xffffu, word >> 16u, (i & 1u) == 1u);
    if dtype == DT_BF16 {
        return bitcast<f32>(half << 16u);
    }
    return unpack2x16float(half).x;
}

// f32 to bf16 bits, rounding to nearest even; NaN stays NaN (quiet bit set).
fn bf16_bits(x: f32) -> u32 {
    let u = bitcast<u32>(x);
    if (u & 0x7fffffffu) > 0x7f800000u {
        return (u >> 16u) | 0x40u;
    }
    return (u + 0x7fffu + ((u >> 16u) & 1u)) >> 16u;
}

// f32 to the 16 bits of an f16 or bf16 element.
fn half_bits(x: f32, dtype: u32) -> u32 {
    if dtype == DT_BF16 {
        return bf16_bits(x);
    }
    return pack2x16float(vec2<f32>(x, 0.0)) & 0xffffu;
}

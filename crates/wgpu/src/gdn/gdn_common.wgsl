// What the GDN kernels share: their parameters, bindings (all but the state and the
// intermediate states, whose element types differ between kernels), input loads, gating and
// output stores. `state_words.wgsl` then `recurrent.wgsl` (token by token) or `chunk.wgsl`
// (chunks of tokens), or a `decode_state_*.wgsl` then `decode_bands.wgsl` (the decode kernel),
// follow it.

const ROW_GROUPS: u32 = 8u;
const MAX_K: u32 = 256u;
const RESET_GATE: f32 = -80.0;

// Rows per thread: ceil(K / 8), rounded up to 4, 8, 16 or 32.
override ROWS: u32 = 16u;

struct Params {
    rows: u32,          // B (decode), or sequences N (prefill)
    tokens: u32,        // T per row (without varlen)
    key_heads: u32,
    value_heads: u32,
    key_dim: u32,
    value_dim: u32,
    group: u32,         // H / Hg
    act_dtype: u32,     // q, k, v
    out_dtype: u32,     // o
    gate_a_dtype: u32,  // g, or a (fused)
    gate_b_dtype: u32,  // beta, or b (fused)
    a_log_dtype: u32,
    dt_bias_dtype: u32,
    row_mode: u32,      // 0: row b is state b, tokens b*T..; 1/2: i32/i64 slot indices; 3: varlen offsets
    fused: u32,
    l2norm: u32,
    intermediate: u32,
    scale: f32,
    states: u32,        // S, the states (slots) of `state`: a slot index at or past it is refused
    pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<u32>;
@group(0) @binding(2) var<storage, read> k: array<u32>;
@group(0) @binding(3) var<storage, read> v: array<u32>;
@group(0) @binding(4) var<storage, read> gate_a: array<u32>;
@group(0) @binding(5) var<storage, read> gate_b: array<u32>;
@group(0) @binding(6) var<storage, read> a_log: array<u32>;
@group(0) @binding(7) var<storage, read> dt_bias: array<u32>;
// Slot indices [B] (i32 or i64), or varlen token offsets [N + 1] (u32).
@group(0) @binding(8) var<storage, read> row_info: array<u32>;
// (binding 9: the state, declared by the kernel's state module)
// Written through atomics: two 16-bit outputs share a word, and neighbouring heads' columns
// may fall in one word (odd V), written by different workgroups.
@group(0) @binding(10) var<storage, read_write> o: array<atomic<u32>>;
// (binding 11: the intermediate states, declared with the state)

var<workgroup> row_range: vec2<u32>;
var<workgroup> row_slot: i32;

fn load_act(which: u32, i: u32) -> f32 {
    let d = p.act_dtype;
    let w = word_of(i, d);
    if which == 0u {
        return widen(q[w], i, d);
    }
    if which == 1u {
        return widen(k[w], i, d);
    }
    return widen(v[w], i, d);
}

// softplus(x) = ln(1 + e^x), = x for x > 20.
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        return x;
    }
    let e = exp(x);
    if e < 1e-4 {
        return e * (1.0 - 0.5 * e);
    }
    return log(1.0 + e);
}

// (g, beta) of one (token, head): given, or Qwen3-Next's fused gating.
fn gates(token: u32, head: u32) -> vec2<f32> {
    let i = token * p.value_heads + head;
    let x = widen(gate_a[word_of(i, p.gate_a_dtype)], i, p.gate_a_dtype);
    let y = widen(gate_b[word_of(i, p.gate_b_dtype)], i, p.gate_b_dtype);
    if p.fused == 0u {
        return vec2<f32>(x, y);
    }
    let rate = -exp(widen(a_log[word_of(head, p.a_log_dtype)], head, p.a_log_dtype));
    let bias = widen(dt_bias[word_of(head, p.dt_bias_dtype)], head, p.dt_bias_dtype);
    return vec2<f32>(rate * softplus(x + bias), 1.0 / (1.0 + exp(-y)));
}

// An i64 slot index from its low and high words, as the kernels compare it: negative (skip
// the row) stays -1, one at or past 2^31 becomes i32's largest (past any pool, so refused),
// any other its value.
fn i64_slot(lo: u32, hi: u32) -> i32 {
    if (hi & 0x80000000u) != 0u {
        return -1;
    }
    if hi != 0u || lo >= 0x80000000u {
        return 0x7fffffff;
    }
    return i32(lo);
}

// The middle step of the two-level scan (see chunks_state.wgsl): for a sequence split into
// segments, the entry state of each segment s from the transition walk's maps,
//
//     S_0 = the initial state,     S_{s+1} = M_s S_s + D_s,
//
// stored in walk_states for the outputs walk. One workgroup per (COMBINE_COLS value columns,
// value head, sequence) keeps its [K][COMBINE_COLS] tile of S in workgroup memory; each thread
// owns up to four (row, 4-column) words of it. A sequence of one unit returns at once.

const COMBINE_THREADS: u32 = 256u;
const COMBINE_COLS: u32 = 16u;
// Words of the tile each thread owns: [K <= 256][4] words over COMBINE_THREADS threads.
const COMBINE_WORDS: u32 = 4u;

var<workgroup> combine_tile: array<vec4<f32>, 1024>;
var<workgroup> combine_units: vec2<u32>;

// Row r of the initial state of `seq` for head h at columns col .. col + 3 (zeros past V).
fn initial_word(seq: u32, h: u32, r: u32, col: u32) -> vec4<f32> {
    let at = ((seq * p.value_heads + h) * p.key_dim + r) * p.value_dim;
    var x = vec4<f32>(0.0);
    for (var e = 0u; e < 4u; e++) {
        if col + e < p.value_dim {
            x[e] = state[at + col + e];
        }
    }
    return x;
}

// Row r of D of walk_states slot `slot`, head h, at columns col .. col + 3 (zeros past V).
fn contribution_word(slot: u32, h: u32, r: u32, col: u32) -> vec4<f32> {
    let at = ((slot * p.value_heads + h) * p.key_dim + r) * p.trans_width;
    var x = vec4<f32>(0.0);
    for (var e = 0u; e < 4u; e++) {
        if col + e < p.value_dim {
            x[e] = walk_states[at + col + e];
        }
    }
    return x;
}

fn store_entry_word(slot: u32, h: u32, r: u32, col: u32, x: vec4<f32>) {
    let at = p.entry_at + ((slot * p.value_heads + h) * p.key_dim + r) * p.value_dim;
    for (var e = 0u; e < 4u; e++) {
        if col + e < p.value_dim {
            walk_states[at + col + e] = x[e];
        }
    }
}

@compute @workgroup_size(COMBINE_THREADS)
fn gdn_chunk_combine(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let h = wid.y;
    let seq = wid.z;
    let kd = p.key_dim;
    let col0 = wid.x * COMBINE_COLS;
    if tid == 0u {
        let firsts = 2u * p.chunks + UNIT_FIELDS * p.units;
        combine_units = vec2<u32>(chunk_info[firsts + seq], chunk_info[firsts + seq + 1u]);
    }
    let units = workgroupUniformLoad(&combine_units);
    if units.y - units.x < 2u {
        return;
    }
    for (var i = 0u; i < COMBINE_WORDS; i++) {
        let e = tid + COMBINE_THREADS * i;
        let r = e / 4u;
        if r < kd {
            combine_tile[e] = initial_word(seq, h, r, col0 + 4u * (e % 4u));
        }
    }
    workgroupBarrier();
    for (var unit = units.x; unit < units.y; unit++) {
        let slot = unit_field(unit, UNIT_SLOT);
        var next: array<vec4<f32>, COMBINE_WORDS>;
        for (var i = 0u; i < COMBINE_WORDS; i++) {
            let e = tid + COMBINE_THREADS * i;
            let r = e / 4u;
            let col = col0 + 4u * (e % 4u);
            if r < kd {
                store_entry_word(slot, h, r, col, combine_tile[e]);
                if unit + 1u < units.y {
                    // M_s S_s + D_s for this word: M's row r is in the columns from value_pad.
                    let m_row = ((slot * p.value_heads + h) * kd + r) * p.trans_width + p.value_pad;
                    var acc = contribution_word(slot, h, r, col);
                    for (var j = 0u; j < kd; j++) {
                        acc += walk_states[m_row + j] * combine_tile[4u * j + e % 4u];
                    }
                    next[i] = acc;
                }
            }
        }
        workgroupBarrier();
        for (var i = 0u; i < COMBINE_WORDS; i++) {
            let e = tid + COMBINE_THREADS * i;
            if e / 4u < kd {
                combine_tile[e] = next[i];
            }
        }
        workgroupBarrier();
    }
}

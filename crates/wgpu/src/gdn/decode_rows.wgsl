// What the decode kernels (`decode.wgsl`, `decode_bands.wgsl`) share besides `gdn_common.wgsl`:
// the slot of a row and the store of four output columns.

// The slot of row `row` (i32 or i64 slot indices); negative skips the row.
fn slot_of(row: u32) -> i32 {
    if p.row_mode == 2u {
        return select(bitcast<i32>(row_info[2u * row]), -1, row_info[2u * row + 1u] != 0u);
    }
    return bitcast<i32>(row_info[row]);
}

// o of columns col .. col + 3 (col a multiple of 4, so the pairs are whole words of a 16-bit o).
fn store_o4(at: u32, x: vec4<f32>) {
    store_o(at, x.xy, true);
    store_o(at + 2u, x.zw, true);
}

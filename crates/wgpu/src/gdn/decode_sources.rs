//! The decode kernel's WGSL as the launcher builds it: `decode_bands.wgsl` (contiguous row
//! bands, sums through workgroup memory) with the loops over a thread's rows written out row
//! by row for the rows per thread of the call's K.
//!
//! The kernel keeps a thread's rows of the state in a function-scope array indexed by the row
//! loops' counter. A driver's compiler that does not unroll those loops keeps the array in
//! local (off-chip) memory, as NVIDIA's Vulkan driver did on the H100 (docs/wgpu.md); written
//! out, the array is indexed by constants only.

use crate::runtime::{ShaderSource, lock};
use deltakv_contract::{Error, Result};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// Declares one bands shader: the dtype helpers, the shared bindings, the state pool's
/// accessors, then the kernel (no subgroup operations).
macro_rules! bands_source {
    ($name:literal, $state:literal) => {
        ShaderSource {
            name: $name,
            text: concat!(
                include_str!("../dtype.wgsl"),
                include_str!("gdn_common.wgsl"),
                include_str!($state),
                include_str!("decode_bands.wgsl")
            ),
            entry_point: "gdn_decode_bands",
        }
    };
}

/// The bands kernel over an f32 pool.
pub const BANDS_F32: ShaderSource = bands_source!("gdn_decode_bands_f32", "decode_state_f32.wgsl");
/// The bands kernel over a bf16 pool.
pub const BANDS_BF16: ShaderSource =
    bands_source!("gdn_decode_bands_bf16", "decode_state_bf16.wgsl");

/// The header of a loop over a thread's rows, as the decode kernels write it.
const ROW_LOOP: &str = "for (var i = 0u; i < ROWS; i++) {";

/// `text` with every loop over a thread's rows (a line `for (var i = 0u; i < ROWS; i++) {`, up
/// to the `}` at its indentation) written out `rows` times, each copy a block that declares
/// `const i`.
pub fn unroll_rows(text: &str, rows: u32) -> Result<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = String::with_capacity(text.len() * 4);
    let mut at = 0;
    while at < lines.len() {
        let line = lines[at];
        at += 1;
        if line.trim() != ROW_LOOP {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let indent = &line[..line.len() - line.trim_start().len()];
        let close = format!("{indent}}}");
        let body_len = lines[at..]
            .iter()
            .position(|l| *l == close)
            .ok_or_else(|| {
                Error::InvalidValue(format!("a row loop without its `}}`: {}", line.trim()))
            })?;
        for i in 0..rows {
            out.push_str(&format!("{indent}{{\n{indent}    const i = {i}u;\n"));
            for body in &lines[at..at + body_len] {
                out.push_str(body);
                out.push('\n');
            }
            out.push_str(&close);
            out.push('\n');
        }
        at += body_len + 1;
    }
    Ok(out)
}

/// `source` with its row loops written out for `rows` rows per thread, built once per
/// (source, rows) and kept for the process (a handful of texts).
pub fn unrolled(source: &ShaderSource, rows: u32) -> Result<ShaderSource> {
    static KEPT: OnceLock<Mutex<HashMap<(&'static str, u32), ShaderSource>>> = OnceLock::new();
    let mut kept = lock(KEPT.get_or_init(Default::default));
    if let Some(made) = kept.get(&(source.name, rows)) {
        return Ok(*made);
    }
    let text = unroll_rows(source.text, rows)?;
    let made = ShaderSource {
        name: Box::leak(format!("{} unrolled {rows}", source.name).into_boxed_str()),
        text: Box::leak(text.into_boxed_str()),
        entry_point: source.entry_point,
    };
    kept.insert((source.name, rows), made);
    Ok(made)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_loops_are_written_out_and_the_rest_is_kept() {
        let text = "fn f() {\n    for (var i = 0u; i < ROWS; i++) {\n        s[i] = 1.0;\n    }\n    x = 2;\n}\n";
        let out = unroll_rows(text, 2).unwrap();
        assert_eq!(
            out,
            "fn f() {\n    {\n        const i = 0u;\n        s[i] = 1.0;\n    }\n    {\n        const i = 1u;\n        s[i] = 1.0;\n    }\n    x = 2;\n}\n"
        );
        let open = "    for (var i = 0u; i < ROWS; i++) {\n        s[i] = 1.0;\n";
        assert!(unroll_rows(open, 2).is_err());
    }
}

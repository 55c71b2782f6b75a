//! Loops of a WGSL text written out copy by copy before the driver sees them.
//!
//! A function-scope array indexed by a loop counter stays in registers only if the driver's
//! compiler unrolls the loop; NVIDIA's Vulkan compiler kept such arrays in off-chip local
//! memory on the H100 (docs/wgpu.md: the decode's state rows, 1149 us with loops, 392.5 us
//! written out). [`unrolled`] writes chosen loops out as blocks that declare the counter as a
//! constant, so every index is one.

use crate::runtime::{ShaderSource, lock};
use deltakv_contract::{Error, Result};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// A loop to write out: its header line exactly as the shader writes it (the line alone, from
/// `for` to `{`), the counter the header declares, and how many times the loop runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Unroll {
    pub header: &'static str,
    pub counter: &'static str,
    pub trips: u32,
}

/// `text` with every loop named in `loops` (a line equal to its header, up to the `}` at that
/// line's indentation) written out `trips` times, each copy a block that declares
/// `const counter`; loops inside a written-out body are written out too. The body must not
/// `break` or `continue` the loop itself.
pub fn unroll_loops(text: &str, loops: &[Unroll]) -> Result<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = String::with_capacity(text.len() * 4);
    let mut at = 0;
    while at < lines.len() {
        let line = lines[at];
        at += 1;
        let Some(spec) = loops.iter().find(|l| line.trim() == l.header) else {
            out.push_str(line);
            out.push('\n');
            continue;
        };
        let indent = &line[..line.len() - line.trim_start().len()];
        let close = format!("{indent}}}");
        let body_len = lines[at..]
            .iter()
            .position(|l| *l == close)
            .ok_or_else(|| {
                Error::InvalidValue(format!("a loop without its `}}`: {}", line.trim()))
            })?;
        let body = unroll_loops(&lines[at..at + body_len].join("\n"), loops)?;
        for trip in 0..spec.trips {
            out.push_str(&format!(
                "{indent}{{\n{indent}    const {} = {trip}u;\n{body}{close}\n",
                spec.counter
            ));
        }
        at += body_len + 1;
    }
    Ok(out)
}

/// `source` with `loops` written out, built once per (source, loops) and kept for the process
/// (a handful of texts).
pub fn unrolled(source: &ShaderSource, loops: &[Unroll]) -> Result<ShaderSource> {
    type Kept = HashMap<(&'static str, Vec<Unroll>), ShaderSource>;
    static KEPT: OnceLock<Mutex<Kept>> = OnceLock::new();
    let mut kept = lock(KEPT.get_or_init(Default::default));
    let key = (source.name, loops.to_vec());
    if let Some(made) = kept.get(&key) {
        return Ok(*made);
    }
    let text = unroll_loops(source.text, loops)?;
    let trips: Vec<String> = loops
        .iter()
        .map(|l| format!("{}{}", l.counter, l.trips))
        .collect();
    let made = ShaderSource {
        name: Box::leak(format!("{} unrolled {}", source.name, trips.join(" ")).into_boxed_str()),
        text: Box::leak(text.into_boxed_str()),
        entry_point: source.entry_point,
    };
    kept.insert(key, made);
    Ok(made)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROWS: Unroll = Unroll {
        header: "for (var i = 0u; i < ROWS; i++) {",
        counter: "i",
        trips: 2,
    };

    #[test]
    fn loops_are_written_out_and_the_rest_is_kept() {
        let text = "fn f() {\n    for (var i = 0u; i < ROWS; i++) {\n        s[i] = 1.0;\n    }\n    x = 2;\n}\n";
        let out = unroll_loops(text, &[ROWS]).unwrap();
        assert_eq!(
            out,
            "fn f() {\n    {\n        const i = 0u;\n        s[i] = 1.0;\n    }\n    {\n        const i = 1u;\n        s[i] = 1.0;\n    }\n    x = 2;\n}\n"
        );
        let open = "    for (var i = 0u; i < ROWS; i++) {\n        s[i] = 1.0;\n";
        assert!(unroll_loops(open, &[ROWS]).is_err());
    }

    #[test]
    fn nested_loops_are_written_out_inside_the_copies() {
        let inner = Unroll {
            header: "for (var c = 0u; c < 2u; c++) {",
            counter: "c",
            trips: 2,
        };
        let text = "for (var i = 0u; i < ROWS; i++) {\n    for (var c = 0u; c < 2u; c++) {\n        a[i][c] = 0.0;\n    }\n}\n";
        let out = unroll_loops(text, &[ROWS, inner]).unwrap();
        assert_eq!(out.matches("a[i][c] = 0.0;").count(), 4);
        assert!(!out.contains("for ("), "{out}");
    }
}

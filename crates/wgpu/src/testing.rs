//! What the wgpu tests share (this crate's own and its integration tests): the device, or one
//! visible "skipped" line where there is none. In CI (`CI=true`) a missing adapter fails the
//! test instead: CI installs lavapipe so that every case runs.

use crate::Wgpu;
use std::io::Write;

/// The wgpu device, or `None` (after printing why) on a machine without an adapter. Panics
/// when `CI=true`, where an adapter must be present.
pub fn device(test: &str) -> Option<&'static Wgpu> {
    match Wgpu::get() {
        Ok(wgpu) => Some(wgpu),
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("{test}: no wgpu adapter in CI (CI=true), where lavapipe must be installed: {e}")
        }
        Err(e) => {
            // Written to stderr directly, past the test harness's capture, so it shows.
            let _ = writeln!(std::io::stderr(), "{test}: skipped (no wgpu adapter): {e}");
            None
        }
    }
}

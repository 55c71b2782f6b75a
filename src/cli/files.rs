//! Checks on the paths and contents of the file-based subcommands, made before any tensor data
//! is read or any work is done, and the warnings about input that will be ignored.

use deltakv::io::TensorFile;
use deltakv::{Error, Result};
use std::path::Path;

/// Refuses an `--output` that is the `--input` file (the same path, another path to it, a
/// symbolic or a hard link: compared by device and inode on unix, by canonical path
/// elsewhere), an output directory that does not exist, and an output that is a directory.
pub fn check_output(input: &Path, output: &Path) -> Result<()> {
    if same_file(input, output) {
        return Err(Error::InvalidValue(format!(
            "--output {} is the same file as --input {}; writing it would destroy the input",
            output.display(),
            input.display()
        )));
    }
    check_creatable("--output", output)
}

/// Refuses a path that names no file, whose directory does not exist or cannot be written
/// in, or which is itself a directory, so that a run fails before its work rather than after.
pub fn check_creatable(flag: &str, path: &Path) -> Result<()> {
    let text = path.as_os_str().to_string_lossy();
    if path.file_name().is_none() || text.ends_with(std::path::MAIN_SEPARATOR) {
        return Err(Error::InvalidValue(format!(
            "{flag} `{text}` names no file"
        )));
    }
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.is_dir() {
        return Err(Error::InvalidValue(format!(
            "{flag} {}: the directory {} does not exist",
            path.display(),
            dir.display()
        )));
    }
    if path.is_dir() {
        return Err(Error::InvalidValue(format!(
            "{flag} {} is a directory",
            path.display()
        )));
    }
    check_writable(flag, path, dir)
}

/// Refuses, before the work, an output whose directory the run could not write into (a
/// temporary file made and removed beside it, as the atomic write will).
fn check_writable(flag: &str, path: &Path, dir: &Path) -> Result<()> {
    deltakv::io::check_writable_beside(path).map_err(|e| {
        Error::InvalidValue(format!(
            "{flag} {}: cannot write in the directory {}: {e}",
            path.display(),
            dir.display()
        ))
    })
}

fn same_file(a: &Path, b: &Path) -> bool {
    let (Ok(meta_a), Ok(meta_b)) = (std::fs::metadata(a), std::fs::metadata(b)) else {
        return false;
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if (meta_a.dev(), meta_a.ino()) == (meta_b.dev(), meta_b.ino()) {
            return true;
        }
    }
    #[cfg(not(unix))]
    let _ = (meta_a, meta_b);
    matches!(
        (std::fs::canonicalize(a), std::fs::canonicalize(b)),
        (Ok(x), Ok(y)) if x == y
    )
}

/// Warns (stderr) about tensors and metadata keys the command ignores, which are usually
/// misspellings (`initial_states` for `initial_state`, `use_qk_l2_norm` for `use_qk_l2norm`).
pub fn warn_ignored(file: &TensorFile, known_metadata: &[&str]) {
    for name in &file.skipped {
        eprintln!("warning: ignoring unexpected tensor `{name}`");
    }
    let mut keys: Vec<&String> = file
        .metadata
        .keys()
        .filter(|k| !known_metadata.contains(&k.as_str()))
        .collect();
    keys.sort();
    for key in keys {
        eprintln!(
            "warning: ignoring unexpected metadata key `{key}` (known: {})",
            known_metadata.join(", ")
        );
    }
}

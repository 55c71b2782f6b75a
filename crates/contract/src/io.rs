//! safetensors interchange: read a file's header first and then only the tensors asked for
//! (so an unrelated multi-GiB tensor costs nothing and a missing one fails at once), plus its
//! `__metadata__` strings; write results atomically through a uniquely named temporary file
//! in the output's directory, renamed into place and removed on every failure path.

use crate::error::{Error, Result};
use crate::tensor::{DType, HostTensor};
use safetensors::tensor::Metadata;
use safetensors::{Dtype, SafeTensors, View};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The largest header accepted (safetensors' own limit).
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// The contents of one safetensors file.
#[derive(Clone, Debug, Default)]
pub struct TensorFile {
    pub tensors: BTreeMap<String, HostTensor>,
    pub metadata: HashMap<String, String>,
    /// Tensors present in the file but not read (see [`TensorFile::load_named`]), sorted.
    pub skipped: Vec<String>,
}

/// The in-memory dtype a stored dtype is read as: f64 is narrowed to f32 (see
/// [`narrow_f64`]); the others are kept.
fn to_dtype(dtype: Dtype, name: &str) -> Result<DType> {
    Ok(match dtype {
        Dtype::F32 | Dtype::F64 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        other => {
            return Err(Error::dtype(
                name,
                format!("{other:?}"),
                "one of f32, f16, bf16, f64 (read as f32), i32, i64",
            ));
        }
    })
}

/// Reads little-endian f64 values as f32. NaN and infinities carry over (validation reports
/// them with the op's rules); a finite value beyond f32's range is an error naming its index.
fn narrow_f64(name: &str, shape: Vec<usize>, bytes: &[u8]) -> Result<HostTensor> {
    let mut values = Vec::with_capacity(bytes.len() / 8);
    for (i, chunk) in bytes.chunks_exact(8).enumerate() {
        let x = f64::from_le_bytes(chunk.try_into().expect("chunks of 8 bytes"));
        if x.is_finite() && x.abs() > f64::from(f32::MAX) {
            return Err(Error::InvalidValue(format!(
                "tensor `{name}` (f64, read as f32) holds {x:e} at flat index {i}, beyond f32's range"
            )));
        }
        values.push(x as f32);
    }
    HostTensor::from_f32(shape, values)
}

/// One tensor from its stored dtype, shape and little-endian bytes.
fn tensor_from_bytes(
    name: &str,
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: &[u8],
) -> Result<HostTensor> {
    if dtype == Dtype::F64 {
        return narrow_f64(name, shape, bytes);
    }
    HostTensor::from_le_bytes(shape, to_dtype(dtype, name)?, bytes)
}

fn from_dtype(dtype: DType) -> Dtype {
    match dtype {
        DType::F32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
    }
}

struct Bytes<'a> {
    dtype: Dtype,
    shape: &'a [usize],
    bytes: Vec<u8>,
}

impl View for Bytes<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

/// An open safetensors file whose header has been parsed and checked against the file size.
struct OpenFile {
    file: File,
    header: Metadata,
    /// Byte offset of the data section.
    data_start: u64,
}

impl OpenFile {
    fn open(path: &Path) -> Result<Self> {
        let io_err = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let format_err = |message: String| Error::Format {
            path: path.to_path_buf(),
            message,
        };
        let mut file = File::open(path).map_err(io_err)?;
        let metadata = file.metadata().map_err(io_err)?;
        if metadata.is_dir() {
            return Err(io_err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "is a directory, not a safetensors file",
            )));
        }
        let file_len = metadata.len();
        let mut prefix = [0u8; 8];
        file.read_exact(&mut prefix).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => {
                format_err("shorter than the 8-byte header length".into())
            }
            _ => io_err(e),
        })?;
        let header_len = u64::from_le_bytes(prefix);
        if header_len > MAX_HEADER_BYTES || 8 + header_len > file_len {
            return Err(format_err(format!(
                "header length {header_len} does not fit a file of {file_len} bytes"
            )));
        }
        let mut text = vec![0u8; header_len as usize];
        file.read_exact(&mut text).map_err(io_err)?;
        let text = std::str::from_utf8(&text)
            .map_err(|e| format_err(format!("header is not UTF-8: {e}")))?;
        let header: Metadata =
            serde_json::from_str(text).map_err(|e| format_err(format!("header: {e}")))?;
        let data_start = 8 + header_len;
        let expected = data_start + header.data_len() as u64;
        if expected != file_len {
            return Err(format_err(format!(
                "the header describes {expected} bytes but the file holds {file_len}"
            )));
        }
        Ok(Self {
            file,
            header,
            data_start,
        })
    }

    /// Reads tensor `name` (present in the header).
    fn read(&mut self, name: &str, path: &Path) -> Result<HostTensor> {
        let info = self
            .header
            .info(name)
            .ok_or_else(|| Error::MissingTensor(name.to_string()))?;
        let (start, end) = info.data_offsets;
        let (dtype, shape) = (info.dtype, info.shape.clone());
        let mut bytes = vec![0u8; end - start];
        let io_err = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        self.file
            .seek(SeekFrom::Start(self.data_start + start as u64))
            .map_err(io_err)?;
        self.file.read_exact(&mut bytes).map_err(io_err)?;
        tensor_from_bytes(name, dtype, shape, &bytes)
    }
}

impl TensorFile {
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads every tensor of a safetensors file.
    pub fn load(path: &Path) -> Result<Self> {
        let open = OpenFile::open(path)?;
        let names = open.header.offset_keys();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        Self::read_selected(open, path, &[], &names)
    }

    /// Reads the header of a safetensors file, then only the tensors named in `required` and
    /// `optional`. A tensor of `required` absent from the header is a "missing tensor" error
    /// (the first in `required`'s order), and an unsupported dtype of a wanted tensor is an
    /// error, both before any tensor data is read. Other tensors are listed in `skipped`.
    pub fn load_named(path: &Path, required: &[&str], optional: &[&str]) -> Result<Self> {
        let open = OpenFile::open(path)?;
        Self::read_selected(open, path, required, optional)
    }

    fn read_selected(
        mut open: OpenFile,
        path: &Path,
        required: &[&str],
        optional: &[&str],
    ) -> Result<Self> {
        if let Some(missing) = required.iter().find(|n| open.header.info(n).is_none()) {
            return Err(Error::MissingTensor(missing.to_string()));
        }
        let wanted: Vec<&str> = required
            .iter()
            .chain(optional)
            .copied()
            .filter(|n| open.header.info(n).is_some())
            .collect();
        for name in &wanted {
            to_dtype(open.header.info(name).expect("present").dtype, name)?;
        }
        let mut tensors = BTreeMap::new();
        for name in &wanted {
            tensors.insert(name.to_string(), open.read(name, path)?);
        }
        let mut skipped: Vec<String> = open
            .header
            .offset_keys()
            .into_iter()
            .filter(|n| !wanted.contains(&n.as_str()))
            .collect();
        skipped.sort();
        let metadata = open.header.metadata().clone().unwrap_or_default();
        Ok(Self {
            tensors,
            metadata,
            skipped,
        })
    }

    /// Parses safetensors bytes; `path` is only used in error messages.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Self> {
        let format_err = |message: String| Error::Format {
            path: path.to_path_buf(),
            message,
        };
        let (_, header) =
            SafeTensors::read_metadata(bytes).map_err(|e| format_err(e.to_string()))?;
        let file = SafeTensors::deserialize(bytes).map_err(|e| format_err(e.to_string()))?;
        let mut tensors = BTreeMap::new();
        for (name, view) in file.tensors() {
            let tensor =
                tensor_from_bytes(&name, view.dtype(), view.shape().to_vec(), view.data())?;
            tensors.insert(name, tensor);
        }
        let metadata = header.metadata().clone().unwrap_or_default();
        Ok(Self {
            tensors,
            metadata,
            skipped: Vec::new(),
        })
    }

    /// Serialises to safetensors bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let views: Vec<(&str, Bytes<'_>)> = self
            .tensors
            .iter()
            .map(|(name, t)| {
                (
                    name.as_str(),
                    Bytes {
                        dtype: from_dtype(t.dtype()),
                        shape: t.shape(),
                        bytes: t.to_le_bytes(),
                    },
                )
            })
            .collect();
        let metadata = (!self.metadata.is_empty()).then(|| self.metadata.clone());
        safetensors::serialize(views, metadata).map_err(|e| Error::Format {
            path: PathBuf::from("<output>"),
            message: e.to_string(),
        })
    }

    /// Writes the file atomically: into a new, uniquely named temporary file in `path`'s
    /// directory (`.NAME.PID.N.tmp`, never an existing file), then renamed over `path`. On any
    /// failure the temporary file is removed and `path` is untouched.
    pub fn save(&self, path: &Path) -> Result<()> {
        write_atomically(path, &self.to_bytes()?)
    }

    pub fn insert(&mut self, name: &str, tensor: HostTensor) {
        self.tensors.insert(name.to_string(), tensor);
    }

    pub fn get(&self, name: &str) -> Option<&HostTensor> {
        self.tensors.get(name)
    }

    /// The tensor called `name`, or a "missing tensor" error.
    pub fn require(&self, name: &str) -> Result<&HostTensor> {
        self.get(name)
            .ok_or_else(|| Error::MissingTensor(name.to_string()))
    }

    /// Metadata value `key` parsed as a float, if present.
    pub fn metadata_f32(&self, key: &str) -> Result<Option<f32>> {
        match self.metadata.get(key) {
            None => Ok(None),
            Some(text) => match text.trim().parse::<f32>() {
                Ok(v) if v.is_finite() => Ok(Some(v)),
                _ => Err(Error::InvalidValue(format!(
                    "metadata `{key}` = {text:?} is not a finite number"
                ))),
            },
        }
    }

    /// Metadata value `key` parsed as `true` / `false`, if present.
    pub fn metadata_bool(&self, key: &str) -> Result<Option<bool>> {
        match self
            .metadata
            .get(key)
            .map(|s| s.trim().to_ascii_lowercase())
        {
            None => Ok(None),
            Some(text) => match text.as_str() {
                "true" | "1" => Ok(Some(true)),
                "false" | "0" => Ok(Some(false)),
                _ => Err(Error::InvalidValue(format!(
                    "metadata `{key}` = {text:?} is not `true` or `false`"
                ))),
            },
        }
    }
}

/// Writes `bytes` to `path` atomically: into a new, uniquely named temporary file in `path`'s
/// directory, then renamed over `path`. On any failure the temporary file is removed and
/// `path` is untouched (an existing file keeps its contents).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut temp = TempFile::create_beside(path)?;
    let io_err = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    temp.file.write_all(bytes).map_err(io_err)?;
    temp.file.flush().map_err(io_err)?;
    temp.persist(path)
}

/// Creates and removes a temporary file beside `target` (never opening an existing file), so
/// that an output whose directory cannot be written in is refused before the work.
pub fn check_writable_beside(target: &Path) -> Result<()> {
    TempFile::create_beside(target).map(drop)
}

/// A temporary file beside an output, removed on drop unless persisted.
struct TempFile {
    path: PathBuf,
    file: File,
    persisted: bool,
}

impl TempFile {
    /// Creates `.NAME.PID.N.tmp` in `target`'s directory with `create_new`, so an existing
    /// file is never opened, let alone overwritten.
    fn create_beside(target: &Path) -> Result<Self> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let io_err = |source| Error::Io {
            path: target.to_path_buf(),
            source,
        };
        let name = target.file_name().ok_or_else(|| {
            io_err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the output path names no file",
            ))
        })?;
        let dir = target.parent().unwrap_or(Path::new(""));
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        for _ in 0..100 {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let mut temp_name = std::ffi::OsString::from(".");
            temp_name.push(name);
            temp_name.push(format!(".{}.{nanos:x}{n}.tmp", std::process::id()));
            let path = dir.join(temp_name);
            match File::options().write(true).create_new(true).open(&path) {
                Ok(file) => {
                    return Ok(Self {
                        path,
                        file,
                        persisted: false,
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_err(e)),
            }
        }
        Err(io_err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            "no free temporary file name after 100 tries",
        )))
    }

    /// Renames the temporary file over `target`.
    fn persist(mut self, target: &Path) -> Result<()> {
        std::fs::rename(&self.path, target).map_err(|source| Error::Io {
            path: target.to_path_buf(),
            source,
        })?;
        self.persisted = true;
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.persisted {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_keeps_tensors_and_metadata() {
        let mut file = TensorFile::new();
        file.insert(
            "q",
            HostTensor::from_f32_as(vec![2, 2], &[1.0, -2.0, 0.5, 4.0], DType::BF16).unwrap(),
        );
        file.insert(
            "idx",
            HostTensor::from_i32(vec![3], vec![0, -1, 5]).unwrap(),
        );
        file.metadata.insert("scale".into(), "0.25".into());
        file.metadata.insert("use_qk_l2norm".into(), "true".into());
        let bytes = file.to_bytes().unwrap();
        let back = TensorFile::from_bytes(&bytes, Path::new("mem")).unwrap();
        assert_eq!(back.tensors, file.tensors);
        assert_eq!(back.metadata_f32("scale").unwrap(), Some(0.25));
        assert_eq!(back.metadata_bool("use_qk_l2norm").unwrap(), Some(true));
        assert_eq!(back.metadata_bool("absent").unwrap(), None);
    }

    #[test]
    fn a_directory_as_input_says_so() {
        let dir = std::env::temp_dir();
        let err = TensorFile::load(&dir).unwrap_err();
        assert!(err.to_string().contains("is a directory"), "{err}");
    }

    #[test]
    fn garbage_is_a_format_error() {
        let err = TensorFile::from_bytes(b"not a file", Path::new("x.safetensors")).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("x.safetensors: not a valid safetensors"),
            "{err}"
        );
        let mut file = TensorFile::new();
        file.metadata.insert("scale".into(), "abc".into());
        assert!(
            file.metadata_f32("scale")
                .unwrap_err()
                .to_string()
                .contains("scale")
        );
    }

    fn scratch(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("deltakv-io-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn load_named_reads_only_the_wanted_tensors() {
        let dir = scratch("named");
        let path = dir.join("in.safetensors");
        let mut file = TensorFile::new();
        file.insert("q", HostTensor::from_f32(vec![2], vec![1.0, 2.0]).unwrap());
        file.insert("huge", HostTensor::from_f32(vec![4], vec![0.0; 4]).unwrap());
        file.insert("zz", HostTensor::from_i32(vec![1], vec![3]).unwrap());
        file.save(&path).unwrap();
        let back = TensorFile::load_named(&path, &["q"], &["k"]).unwrap();
        assert_eq!(back.tensors.keys().collect::<Vec<_>>(), ["q"]);
        assert_eq!(back.skipped, ["huge", "zz"]);
        let err = TensorFile::load_named(&path, &["k", "q"], &[]).unwrap_err();
        assert_eq!(err.to_string(), "missing tensor `k`");
        // A file cut short is refused from its header alone.
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 4]).unwrap();
        let err = TensorFile::load_named(&path, &["q"], &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("not a valid safetensors file: the header describes"),
            "{err}"
        );
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn f64_tensors_are_read_as_f32_within_range() {
        let encode = |values: &[f64]| -> Vec<u8> {
            let bytes: Vec<u8> = values.iter().flat_map(|x| x.to_le_bytes()).collect();
            let shape = [values.len()];
            let view = Bytes {
                dtype: Dtype::F64,
                shape: &shape,
                bytes,
            };
            safetensors::serialize([("g", view)], None).unwrap()
        };
        let file = TensorFile::from_bytes(&encode(&[-0.5, -2.0]), Path::new("m")).unwrap();
        assert_eq!(file.require("g").unwrap().as_f32().unwrap(), [-0.5, -2.0]);
        let err = TensorFile::from_bytes(&encode(&[-0.5, 1e300]), Path::new("m")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "tensor `g` (f64, read as f32) holds 1e300 at flat index 1, beyond f32's range"
        );
    }

    #[test]
    fn save_uses_a_fresh_temporary_name_and_cleans_up_on_failure() {
        let dir = scratch("save");
        let path = dir.join("out.safetensors");
        let user_file = dir.join("out.safetensors.tmp");
        std::fs::write(&user_file, b"the user's own file").unwrap();
        let mut file = TensorFile::new();
        file.insert("o", HostTensor::from_f32(vec![1], vec![1.0]).unwrap());
        file.save(&path).unwrap();
        assert_eq!(std::fs::read(&user_file).unwrap(), b"the user's own file");
        assert_eq!(entries(&dir), ["out.safetensors", "out.safetensors.tmp"]);
        // Renaming over a directory fails: the temporary file goes, the directory stays.
        let blocked = dir.join("blocked");
        std::fs::create_dir(&blocked).unwrap();
        assert!(file.save(&blocked).is_err());
        assert_eq!(
            entries(&dir),
            ["blocked", "out.safetensors", "out.safetensors.tmp"]
        );
        std::fs::remove_dir_all(dir).ok();
    }
}

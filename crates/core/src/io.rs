//! safetensors interchange: load a whole file into [`HostTensor`]s plus its `__metadata__`
//! strings, and write results atomically (a temporary file renamed into place), so a failed
//! run never leaves a partial output behind.

use crate::error::{Error, Result};
use crate::tensor::{DType, HostTensor};
use safetensors::{Dtype, SafeTensors, View};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// The contents of one safetensors file.
#[derive(Clone, Debug, Default)]
pub struct TensorFile {
    pub tensors: BTreeMap<String, HostTensor>,
    pub metadata: HashMap<String, String>,
}

fn to_dtype(dtype: Dtype, name: &str) -> Result<DType> {
    Ok(match dtype {
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        other => {
            return Err(Error::dtype(
                name,
                format!("{other:?}"),
                "one of f32, f16, bf16, i32, i64",
            ));
        }
    })
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

impl TensorFile {
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads and parses a safetensors file.
    pub fn load(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_bytes(&bytes, path)
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
            let dtype = to_dtype(view.dtype(), &name)?;
            let tensor = HostTensor::from_le_bytes(view.shape().to_vec(), dtype, view.data())?;
            tensors.insert(name, tensor);
        }
        let metadata = header.metadata().clone().unwrap_or_default();
        Ok(Self { tensors, metadata })
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

    /// Writes the file atomically: to `path.tmp` first, then renamed over `path`.
    pub fn save(&self, path: &Path) -> Result<()> {
        let bytes = self.to_bytes()?;
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let io_err = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        std::fs::write(&tmp, &bytes).map_err(io_err)?;
        std::fs::rename(&tmp, path).map_err(|source| {
            let _ = std::fs::remove_file(&tmp);
            Error::Io {
                path: path.to_path_buf(),
                source,
            }
        })
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
}

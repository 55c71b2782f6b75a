//! The one error type of deltakv. Every public function returns [`Result`]; messages are
//! single lines meant to be shown to a user as they are.

use std::path::PathBuf;

/// Everything that can go wrong in deltakv.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A required tensor is absent from the input.
    #[error("missing tensor `{0}`")]
    MissingTensor(String),
    /// A tensor has the wrong number of dimensions or a size that disagrees with another.
    #[error("tensor `{name}`: {message}")]
    Shape { name: String, message: String },
    /// A tensor has a dtype the op does not accept.
    #[error("tensor `{name}` has dtype {found}, expected {expected}")]
    DType {
        name: String,
        found: String,
        expected: String,
    },
    /// A value is out of its allowed range (NaN in a gate, a bad index, ...).
    #[error("{0}")]
    InvalidValue(String),
    /// A parameter combination deltakv does not support (yet).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The requested device was not built in or is not present on this machine.
    #[error("device `{device}` is not available: {reason}")]
    DeviceUnavailable { device: String, reason: String },
    /// A tensor of a call is on another device than the call runs on (ops run where their
    /// tensors are, and copy nothing behind the caller's back).
    #[error(
        "tensor `{name}` is on {found}, but the call runs on {expected} (the device of `{anchor}`); copy it there first"
    )]
    WrongDevice {
        name: String,
        found: String,
        expected: String,
        anchor: String,
    },
    /// A GPU backend call failed (kernel compile, launch, copy, allocation).
    #[error("{device}: {message}")]
    Backend { device: String, message: String },
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A file is not valid safetensors, or its metadata is malformed.
    #[error("{path}: not a valid safetensors file: {message}")]
    Format { path: PathBuf, message: String },
}

/// `Result` with deltakv's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// A [`Error::Shape`] for tensor `name`.
    pub fn shape(name: &str, message: impl Into<String>) -> Self {
        Error::Shape {
            name: name.to_string(),
            message: message.into(),
        }
    }

    /// A [`Error::DType`] for tensor `name`, which has `found` where `expected` is accepted.
    pub fn dtype(name: &str, found: impl std::fmt::Display, expected: &str) -> Self {
        Error::DType {
            name: name.to_string(),
            found: found.to_string(),
            expected: expected.to_string(),
        }
    }
}

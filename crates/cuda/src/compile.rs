//! Run-time compilation of the `.cu` kernels with NVRTC, straight to a CUBIN for the device's
//! architecture (`sm_90a` on Hopper), so the driver loads machine code and never JITs PTX.
//!
//! The kernels include no CUDA headers (half-precision conversions are written in
//! `kernels/common.cuh`), so NVRTC's library is the only run-time file they need.

use deltakv_contract::{Error, Result};
use std::ffi::{CStr, CString, c_char};

/// One kernel source: a name for messages and the text of the `.cu` file with the shared
/// helpers prepended.
#[derive(Clone, Copy, Debug)]
pub struct KernelSource {
    pub name: &'static str,
    pub text: &'static str,
}

const COMMON: &str = include_str!("../kernels/common.cuh");

/// Every kernel source of the CUDA backend (CI compiles each one for `sm_90a`).
pub const SOURCES: &[KernelSource] = &[
    crate::gdn::decode::SOURCE,
    crate::gdn::prefill::SOURCE,
    crate::gdn::prefill::SOURCE_PREPARE_MMA,
    crate::kv::SOURCE_ENCODE,
    crate::kv::SOURCE_ATTEND,
    crate::kv::SOURCES_ATTEND_MMA[0],
    crate::kv::SOURCES_ATTEND_MMA[1],
    crate::kv::SOURCES_ATTEND_MMA[2],
    crate::kv::SOURCES_ATTEND_MMA[3],
    crate::kv::SOURCES_ATTEND_MMA[4],
    crate::kv::SOURCES_ATTEND_MMA[5],
    crate::kv::SOURCES_ATTEND_MMA[6],
    crate::kv::SOURCES_ATTEND_MMA[7],
    crate::kv::SOURCES_ATTEND_MMA[8],
];

/// A compiled kernel image and what the compiler reported (ptxas register and spill lines).
#[derive(Clone, Debug)]
pub struct Compiled {
    pub cubin: Vec<u8>,
    pub log: String,
}

/// What ptxas reported for one kernel of an image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelResources {
    pub name: String,
    pub registers: usize,
    /// Bytes of spill stores plus spill loads.
    pub spill_bytes: usize,
    /// Bytes of the per-thread stack frame (local arrays, spills).
    pub stack_bytes: usize,
}

impl Compiled {
    /// Registers and spills of each kernel, from ptxas's report in the log.
    pub fn kernels(&self) -> Vec<KernelResources> {
        let number_before = |line: &str, word: &str| -> Option<usize> {
            let words: Vec<&str> = line.split_whitespace().collect();
            let at = words.iter().position(|w| w.trim_end_matches(',') == word)?;
            words.get(at.checked_sub(1)?)?.parse().ok()
        };
        let mut kernels: Vec<KernelResources> = Vec::new();
        for line in self.log.lines() {
            if let Some(rest) = line.split("Function properties for ").nth(1) {
                kernels.push(KernelResources {
                    name: rest.trim().to_string(),
                    registers: 0,
                    spill_bytes: 0,
                    stack_bytes: 0,
                });
            } else if let Some(k) = kernels.last_mut() {
                // "N bytes stack frame, S bytes spill stores, L bytes spill loads"
                if line.contains("bytes stack frame") {
                    k.stack_bytes = line
                        .split_whitespace()
                        .next()
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(0);
                }
                if line.contains("spill stores") {
                    k.spill_bytes = line
                        .split(',')
                        .filter(|part| part.contains("spill"))
                        .filter_map(|part| part.split_whitespace().next()?.parse::<usize>().ok())
                        .sum();
                } else if let Some(n) = number_before(line, "registers") {
                    k.registers = n;
                }
            }
        }
        kernels
    }

    /// The names of the kernels in the image: the `.text.NAME` sections of the CUBIN (an ELF
    /// file), which are there whatever the compiler's log holds.
    pub fn kernel_names(&self) -> Vec<String> {
        const PREFIX: &[u8] = b".text.";
        let mut names = Vec::new();
        let mut at = 0;
        while let Some(offset) = self.cubin[at..]
            .windows(PREFIX.len())
            .position(|w| w == PREFIX)
        {
            let start = at + offset + PREFIX.len();
            let len = self.cubin[start..]
                .iter()
                .take_while(|b| b.is_ascii_alphanumeric() || **b == b'_')
                .count();
            if len > 0 {
                let name = String::from_utf8_lossy(&self.cubin[start..start + len]).into_owned();
                if !names.contains(&name) {
                    names.push(name);
                }
            }
            at = start + len;
        }
        names
    }

    /// Bytes of spill stores and loads over every kernel in the image.
    pub fn spill_bytes(&self) -> usize {
        self.kernels().iter().map(|k| k.spill_bytes).sum()
    }
}

/// The message for a machine without NVRTC.
pub fn nvrtc_missing() -> String {
    "NVRTC (libnvrtc.so.13) not found: install the CUDA 13 toolkit, or `pip install \
     nvidia-cuda-nvrtc==13.0.88` and add its `nvidia/cu13/lib` folder to LD_LIBRARY_PATH"
        .to_string()
}

/// True when NVRTC's library can be loaded (always when it was linked at build time, feature
/// `dynamic-linking`).
pub fn nvrtc_present() -> bool {
    #[cfg(not(feature = "dynamic-linking"))]
    // SAFETY: only tries to open the library by its usual names.
    return unsafe { cudarc::nvrtc::sys::is_culib_present() };
    #[cfg(feature = "dynamic-linking")]
    return true;
}

fn nvrtc_error(what: &str, source: &KernelSource, e: impl std::fmt::Debug) -> Error {
    Error::Backend {
        device: "cuda".to_string(),
        message: format!("NVRTC {what} of kernel `{}` failed: {e:?}", source.name),
    }
}

/// `DELTAKV_CUDA_DEFINES`: macro definitions (`NAME` or `NAME=VALUE`, separated by spaces or
/// commas) passed to NVRTC as `-D` options for every kernel source. For timing trials of kernel
/// variants only (e.g. `PF_TRIAL`, whose variants compute wrong results on purpose; see the
/// kernel log): a serving process leaves it unset.
fn trial_defines() -> Result<Vec<String>> {
    match deltakv_contract::env::text("DELTAKV_CUDA_DEFINES")? {
        Some(text) => parse_defines(&text),
        None => Ok(Vec::new()),
    }
}

/// The `-D` options of a `DELTAKV_CUDA_DEFINES` value, each checked to be an identifier with an
/// optional `=` and a value of letters, digits, `_`, `.` or `-`.
fn parse_defines(text: &str) -> Result<Vec<String>> {
    let word = |w: &str| {
        !w.is_empty()
            && w.chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
    };
    text.split([' ', ','])
        .filter(|d| !d.is_empty())
        .map(|define| {
            let (name, value) = define.split_once('=').unwrap_or((define, "1"));
            let identifier = name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if identifier && word(value) {
                Ok(format!("-D{name}={value}"))
            } else {
                Err(Error::InvalidValue(format!(
                    "DELTAKV_CUDA_DEFINES: `{define}` is not NAME or NAME=VALUE (letters, digits, \
                     `_`, `.`, `-`)"
                )))
            }
        })
        .collect()
}

/// Compiles `source` for `arch` (e.g. `sm_90a`) into a CUBIN, with ptxas's resource report in
/// the log. A compile error comes back as `Err` holding NVRTC's log.
pub fn compile(source: &KernelSource, arch: &str) -> Result<Compiled> {
    use cudarc::nvrtc::{result, sys};
    if !nvrtc_present() {
        return Err(Error::DeviceUnavailable {
            device: "cuda".to_string(),
            reason: nvrtc_missing(),
        });
    }
    let text = format!("{COMMON}\n{}", source.text);
    let src = CString::new(text).map_err(|e| nvrtc_error("input", source, e))?;
    let name = CString::new(source.name).map_err(|e| nvrtc_error("input", source, e))?;
    let prog =
        result::create_program(&src, Some(&name)).map_err(|e| nvrtc_error("setup", source, e))?;
    let mut options = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        "--ptxas-options=-v".to_string(),
        "-lineinfo".to_string(),
    ];
    options.extend(trial_defines()?);
    // SAFETY: `prog` was created above and is destroyed once, at the end.
    let outcome = unsafe {
        let compiled = result::compile_program(prog, &options);
        let log = result::get_program_log(prog)
            .map(|raw| CStr::from_ptr(raw.as_ptr()).to_string_lossy().into_owned())
            .unwrap_or_default();
        match compiled {
            Err(e) => Err(Error::Backend {
                device: "cuda".to_string(),
                message: format!(
                    "NVRTC could not compile kernel `{}` for {arch} ({e:?}): {}",
                    source.name,
                    log.trim()
                ),
            }),
            Ok(()) => {
                let mut size = 0usize;
                let mut cubin = Vec::new();
                let status = sys::nvrtcGetCUBINSize(prog, &mut size)
                    .result()
                    .and_then(|()| {
                        cubin.resize(size, 0u8);
                        sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut c_char).result()
                    });
                status
                    .map(|()| Compiled { cubin, log })
                    .map_err(|e| nvrtc_error("CUBIN read", source, e))
            }
        }
    };
    // SAFETY: `prog` is live and destroyed exactly once.
    let _ = unsafe { result::destroy_program(prog) };
    outcome
}

#[cfg(test)]
mod tests {
    use super::parse_defines;

    #[test]
    fn trial_defines_become_d_options_and_bad_ones_are_refused() {
        assert_eq!(
            parse_defines("PF_TRIAL=6, LAB").unwrap(),
            vec!["-DPF_TRIAL=6".to_string(), "-DLAB=1".to_string()]
        );
        assert!(parse_defines("").unwrap().is_empty());
        for bad in ["9X=1", "A=b;c", "A=", "-O3", "A B=$(x)"] {
            let err = parse_defines(bad).unwrap_err().to_string();
            assert!(err.contains("DELTAKV_CUDA_DEFINES"), "{bad}: {err}");
        }
    }
}

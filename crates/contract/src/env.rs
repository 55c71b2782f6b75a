//! The backends' switches (`DELTAKV_*` environment variables, for experiments and
//! comparisons), read the same way everywhere: surrounding spaces ignored, an empty value the
//! same as an unset one, and a value a switch does not take an error that names the values it
//! takes, never ignored.

use crate::error::{Error, Result};
use std::env::VarError;
use std::str::FromStr;

/// The value of `name` as the switches read it: trimmed, `None` when unset or empty; a value
/// that is not UTF-8 is an error.
pub fn text(name: &str) -> Result<Option<String>> {
    match std::env::var(name) {
        Ok(text) => Ok(normalized(Some(&text))),
        Err(VarError::NotPresent) => Ok(None),
        Err(VarError::NotUnicode(raw)) => Err(Error::InvalidValue(format!(
            "{name}={}: not UTF-8",
            raw.to_string_lossy()
        ))),
    }
}

/// A raw value trimmed, `None` when absent or empty.
fn normalized(raw: Option<&str>) -> Option<String> {
    raw.map(str::trim)
        .filter(|text| !text.is_empty())
        .map(String::from)
}

/// What `name` selects among `choices` (each a value's text and what it selects); unset:
/// `unset`. Any other value is an error listing the choices.
pub fn choice<T: Copy>(name: &str, choices: &[(&str, T)], unset: T) -> Result<T> {
    choice_in(name, text(name)?, choices, unset)
}

/// The number `name` holds, where `accept` takes it (`expected` says what it takes, for the
/// error); unset: `None`.
pub fn number<T: FromStr>(
    name: &str,
    accept: impl Fn(&T) -> bool,
    expected: &str,
) -> Result<Option<T>> {
    number_in(name, text(name)?, accept, expected)
}

/// [`choice`] of a value already read.
fn choice_in<T: Copy>(
    name: &str,
    text: Option<String>,
    choices: &[(&str, T)],
    unset: T,
) -> Result<T> {
    let Some(text) = text else {
        return Ok(unset);
    };
    match choices.iter().find(|(choice, _)| *choice == text) {
        Some(&(_, selected)) => Ok(selected),
        None => {
            let names: Vec<String> = choices.iter().map(|(c, _)| format!("`{c}`")).collect();
            Err(Error::InvalidValue(format!(
                "{name}={text}: expected {}",
                names.join(", ")
            )))
        }
    }
}

/// [`number`] of a value already read.
fn number_in<T: FromStr>(
    name: &str,
    text: Option<String>,
    accept: impl Fn(&T) -> bool,
    expected: &str,
) -> Result<Option<T>> {
    let Some(text) = text else {
        return Ok(None);
    };
    match text.parse::<T>() {
        Ok(value) if accept(&value) => Ok(Some(value)),
        _ => Err(Error::InvalidValue(format!(
            "{name}={text}: expected {expected}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_choice_is_its_value_the_default_when_unset_and_an_error_otherwise() {
        let choices = [("on", 1), ("off", 0)];
        let pick = |raw: Option<&str>| choice_in("SWITCH", normalized(raw), &choices, 7);
        assert_eq!(pick(None).unwrap(), 7);
        assert_eq!(pick(Some("")).unwrap(), 7, "empty is unset");
        assert_eq!(pick(Some("off")).unwrap(), 0);
        assert_eq!(pick(Some(" off ")).unwrap(), 0, "spaces around the value");
        let err = pick(Some("of")).unwrap_err().to_string();
        assert!(err.contains("SWITCH=of: expected `on`, `off`"), "{err}");
    }

    #[test]
    fn a_number_outside_its_range_is_an_error() {
        let positive = |n: &usize| *n > 0;
        let read = |raw: Option<&str>| number_in("COUNT", normalized(raw), positive, "a count");
        assert_eq!(read(None).unwrap(), None);
        assert_eq!(read(Some(" 12 ")).unwrap(), Some(12));
        for bad in ["0", "-3", "twelve"] {
            let err = read(Some(bad)).unwrap_err().to_string();
            assert!(
                err.ends_with(&format!("COUNT={bad}: expected a count")),
                "{err}"
            );
        }
    }

    #[test]
    fn an_unset_variable_reads_as_unset() {
        let name = "DELTAKV_TEST_SWITCH_NEVER_SET";
        assert_eq!(choice(name, &[("a", 1)], 2).unwrap(), 2);
        assert_eq!(number::<u32>(name, |_| true, "any").unwrap(), None);
    }
}

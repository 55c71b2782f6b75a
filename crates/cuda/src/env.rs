//! deltakv's CUDA switches (`DELTAKV_*` environment variables, for experiments and
//! comparisons): each is read in one place, and a value a switch does not know is an error that
//! names the values it takes, never ignored.

use deltakv_contract::{Error, Result};
use std::env::VarError;
use std::str::FromStr;

/// The text of `name`, or `None` when it is unset; a value that is not UTF-8 is an error.
fn text_of(name: &str) -> Result<Option<String>> {
    match std::env::var(name) {
        Ok(text) => Ok(Some(text)),
        Err(VarError::NotPresent) => Ok(None),
        Err(VarError::NotUnicode(raw)) => Err(Error::InvalidValue(format!(
            "{name}={}: not UTF-8",
            raw.to_string_lossy()
        ))),
    }
}

/// What `name` selects among `choices` (each a value's text and what it selects); unset:
/// `unset`. Any other value is an error listing the choices.
pub(crate) fn choice<T: Copy>(name: &str, choices: &[(&str, T)], unset: T) -> Result<T> {
    let Some(text) = text_of(name)? else {
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

/// The number `name` holds, where `accept` takes it (`expected` says what it takes, for the
/// error); unset: `None`.
pub(crate) fn number<T: FromStr>(
    name: &str,
    accept: impl Fn(&T) -> bool,
    expected: &str,
) -> Result<Option<T>> {
    let Some(text) = text_of(name)? else {
        return Ok(None);
    };
    match text.trim().parse::<T>() {
        Ok(value) if accept(&value) => Ok(Some(value)),
        _ => Err(Error::InvalidValue(format!(
            "{name}={text}: expected {expected}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sets (or with `None` removes) a variable only the calling test uses.
    fn set(name: &str, value: Option<&str>) {
        // SAFETY: each test reads and writes a variable of its own, so no other thread of the
        // test binary reads it meanwhile.
        unsafe {
            match value {
                Some(value) => std::env::set_var(name, value),
                None => std::env::remove_var(name),
            }
        }
    }

    #[test]
    fn a_choice_is_its_value_the_default_when_unset_and_an_error_otherwise() {
        let name = "DELTAKV_TEST_ENV_CHOICE";
        let choices = [("on", 1), ("off", 0)];
        set(name, None);
        assert_eq!(choice(name, &choices, 7).unwrap(), 7);
        set(name, Some("off"));
        assert_eq!(choice(name, &choices, 7).unwrap(), 0);
        set(name, Some("of"));
        let err = choice(name, &choices, 7).unwrap_err().to_string();
        assert!(
            err.contains("DELTAKV_TEST_ENV_CHOICE=of: expected `on`, `off`"),
            "{err}"
        );
        set(name, None);
    }

    #[test]
    fn a_number_outside_its_range_is_an_error() {
        let name = "DELTAKV_TEST_ENV_NUMBER";
        let positive = |n: &usize| *n > 0;
        set(name, None);
        assert_eq!(number(name, positive, "a count").unwrap(), None);
        set(name, Some(" 12 "));
        assert_eq!(number(name, positive, "a count").unwrap(), Some(12));
        for bad in ["0", "-3", "twelve"] {
            set(name, Some(bad));
            let err = number(name, positive, "a count").unwrap_err().to_string();
            assert!(err.ends_with("expected a count"), "{bad}: {err}");
        }
        set(name, None);
    }
}

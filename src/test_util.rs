//! Assertion helpers shared by the crate's unit tests (built only for `cargo test`).

use std::fmt::{Debug, Display};
use std::path::PathBuf;

use datafusion::arrow::datatypes::{DataType, Field, Fields};

use crate::error::Error;
use crate::options::RawOptions;

/// The error of `result`, as its message; panics, showing the value, when `result` is `Ok`.
#[track_caller]
pub(crate) fn error_text<T: Debug, E: Display>(result: Result<T, E>) -> String {
    match result {
        Ok(value) => panic!("expected an error, got Ok({value:?})"),
        Err(err) => err.to_string(),
    }
}

/// Asserts that `text` contains each of `parts`, naming the missing part and showing the whole
/// text when one is not there.
#[track_caller]
pub(crate) fn assert_contains_all(text: &str, parts: &[&str]) {
    for part in parts {
        assert!(text.contains(part), "{part:?} is not in: {text}");
    }
}

/// The options of `pairs` (names and values as a statement gives them); panics on a duplicate.
pub(crate) fn raw_options(pairs: &[(&str, &str)]) -> RawOptions {
    RawOptions::from_pairs(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string()))).unwrap()
}

/// A nullable column `name` of a struct of `fields` (a Bigtable column family, for one).
pub(crate) fn struct_field(name: &str, fields: Vec<Field>) -> Field {
    Field::new(name, DataType::Struct(Fields::from(fields)), true)
}

/// The endpoint and the message of the [`Error::Connect`] `result` holds; panics, showing what
/// it holds, on anything else.
#[track_caller]
pub(crate) fn connect_error<T>(result: crate::Result<T>) -> (String, String) {
    match result {
        Err(Error::Connect { endpoint, message }) => (endpoint, message),
        Err(other) => panic!("expected a connect error, got {other:?}"),
        Ok(_) => panic!("expected a connect error, got Ok"),
    }
}

/// A path where no file is, in a new temporary folder (returned with it: the folder goes when
/// it is dropped).
pub(crate) fn absent_file(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    (dir, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_text_is_the_message_of_the_error() {
        assert_eq!(error_text(Err::<(), _>("no such queue")), "no such queue");
    }

    #[test]
    #[should_panic(expected = "expected an error, got Ok(3)")]
    fn error_text_of_an_ok_fails() {
        error_text(Ok::<_, String>(3));
    }

    #[test]
    fn connect_error_is_the_endpoint_and_the_message() {
        let result: crate::Result<()> = Err(Error::Connect {
            endpoint: "https://pubsub.googleapis.com".into(),
            message: "refused".into(),
        });
        assert_eq!(
            connect_error(result),
            ("https://pubsub.googleapis.com".into(), "refused".into())
        );
    }

    #[test]
    #[should_panic(expected = "expected a connect error, got Ok")]
    fn connect_error_of_an_ok_fails() {
        connect_error(Ok(()));
    }

    #[test]
    #[should_panic(expected = "\"queue\" is not in: no such topic")]
    fn a_missing_part_fails_naming_it() {
        assert_contains_all("no such topic", &["no such", "queue"]);
    }
}

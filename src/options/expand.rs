//! `${VAR}` in option values: a pipeline file keeps its secrets (and anything else that differs
//! between machines) in the environment, and the declaration names them.
//!
//! - `${NAME}` is replaced by the value of environment variable `NAME` (`NAME`: a letter or
//!   `_`, then letters, digits or `_`). A variable set to the empty string expands to it.
//! - `$${` is a literal `${` (so `$${HOME}` stays `${HOME}`); any other `$` is itself.
//! - An unset variable is an error naming the variable and the option, never a value; so is a
//!   `${` without a closing `}` or with no valid name inside.
//!
//! What a declaration keeps for display (`\d NAME`; DataFusion's `SHOW CREATE TABLE` has no
//! definition of ours to show) is what was written, `${NAME}` and all: only the connector's options see the values, and an
//! error about an option whose value came from the environment names the variable in place of
//! the value ([`Expanded::scrub`]).

use crate::error::{Error, Result};

use super::EnvLookup;

/// One option whose value named variables: the option, the value as written, and each
/// variable substituted with its value.
type Substituted = (String, String, Vec<(String, String)>);

/// The options of a declaration after expansion, and what came from the environment (to keep
/// it out of errors).
#[derive(Debug, Clone, Default)]
pub struct Expanded {
    /// Per option whose value named a variable: the option, the value as written and the
    /// values substituted (with their variable).
    substituted: Vec<Substituted>,
}

impl Expanded {
    /// Whether any option value named a variable.
    pub fn is_empty(&self) -> bool {
        self.substituted.is_empty()
    }

    /// `error` without any value that came from the environment: an [`Error::InvalidOption`]
    /// of an expanded option shows the value as written (`${NAME}`); any other error whose
    /// text holds a substituted value has it replaced by `${NAME}` (and becomes an
    /// [`Error::Unsupported`] carrying that text).
    pub fn scrub(&self, error: Error) -> Error {
        if self.is_empty() {
            return error;
        }
        if let Error::InvalidOption {
            option,
            value: _,
            rule,
        } = &error
            && let Some((_, written, _)) = self.substituted.iter().find(|(o, _, _)| o == option)
            && !self.leaks(rule)
        {
            return Error::InvalidOption {
                option: option.clone(),
                value: format!("{written} (from the environment)"),
                rule: rule.clone(),
            };
        }
        let text = error.to_string();
        if !self.leaks(&text) {
            return error;
        }
        let mut text = text;
        for (_, _, values) in &self.substituted {
            for (name, value) in values {
                if !value.is_empty() {
                    text = text.replace(value.as_str(), &format!("${{{name}}}"));
                }
            }
        }
        Error::Unsupported(text)
    }

    /// Whether `text` holds a substituted value (an empty one cannot leak).
    fn leaks(&self, text: &str) -> bool {
        self.substituted
            .iter()
            .flat_map(|(_, _, values)| values)
            .any(|(_, value)| !value.is_empty() && text.contains(value.as_str()))
    }
}

/// Expands `${NAME}` in every value of `pairs` (option name, value) through `env`; see the
/// module docs. Returns the expanded pairs and what was substituted.
pub fn expand_options(
    pairs: Vec<(String, String)>,
    env: EnvLookup<'_>,
) -> Result<(Vec<(String, String)>, Expanded)> {
    let mut expanded = Expanded::default();
    let mut out = Vec::with_capacity(pairs.len());
    for (option, value) in pairs {
        let (text, values) = expand_value(&option, &value, env)?;
        if !values.is_empty() {
            expanded
                .substituted
                .push((option.clone(), value.clone(), values));
        }
        out.push((option, text));
    }
    Ok((out, expanded))
}

/// Expands one value of `option`: the text, and each variable substituted with its value.
pub fn expand_value(
    option: &str,
    value: &str,
    env: EnvLookup<'_>,
) -> Result<(String, Vec<(String, String)>)> {
    if !value.contains('$') {
        return Ok((value.to_string(), Vec::new()));
    }
    let mut out = String::with_capacity(value.len());
    let mut values = Vec::new();
    let mut rest = value;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        if let Some(tail) = after.strip_prefix("$${") {
            out.push_str("${");
            rest = tail;
        } else if let Some(tail) = after.strip_prefix("${") {
            let Some(end) = tail.find('}') else {
                return Err(Error::invalid(
                    option,
                    value,
                    "'${' opens an environment variable that is never closed: write ${NAME}, \
                     or $${ for a literal '${'",
                ));
            };
            let name = &tail[..end];
            if !is_variable_name(name) {
                return Err(Error::invalid(
                    option,
                    value,
                    format!(
                        "'${{{name}}}' does not name an environment variable (a letter or '_', \
                         then letters, digits or '_'); write $${{ for a literal '${{'"
                    ),
                ));
            }
            let Some(found) = env(name) else {
                return Err(Error::UnsetVariable {
                    variable: name.to_string(),
                    option: option.to_string(),
                });
            };
            out.push_str(&found);
            values.push((name.to_string(), found));
            rest = &tail[end + 1..];
        } else {
            out.push('$');
            rest = &after[1..];
        }
    }
    out.push_str(rest);
    Ok((out, values))
}

fn is_variable_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "TOKEN" => Some("s3cr3t-token".into()),
            "PROJECT" => Some("demo".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn a_set_variable_is_replaced_by_its_value() {
        let (text, values) = expand_value("topic", "projects/${PROJECT}/topics/t", &env).unwrap();
        assert_eq!(text, "projects/demo/topics/t");
        assert_eq!(values, vec![("PROJECT".to_string(), "demo".to_string())]);
        let (text, _) = expand_value("headers", "A: ${TOKEN}; B: ${EMPTY}x", &env).unwrap();
        assert_eq!(text, "A: s3cr3t-token; B: x");
    }

    #[test]
    fn an_unset_variable_names_itself_and_the_option_not_a_value() {
        let error = expand_value("headers", "Authorization: ${NOPE}", &env).unwrap_err();
        let text = error.to_string();
        assert!(
            text.contains("NOPE") && text.contains("'headers'"),
            "{text}"
        );
        assert!(matches!(error, Error::UnsetVariable { .. }), "{error:?}");
    }

    #[test]
    fn a_doubled_dollar_is_a_literal_and_a_lone_dollar_stays() {
        let (text, values) = expand_value("x", "$${TOKEN} costs $5 ${PROJECT}$", &env).unwrap();
        assert_eq!(text, "${TOKEN} costs $5 demo$");
        assert_eq!(values.len(), 1);
    }

    #[test]
    fn a_malformed_reference_is_an_error_naming_the_option() {
        for bad in ["${TOKEN", "${}", "${1X}", "${A-B}"] {
            let text = expand_value("url", bad, &env).unwrap_err().to_string();
            assert!(text.contains("url"), "{bad}: {text}");
            assert!(!text.contains("s3cr3t"), "{bad}: {text}");
        }
    }

    #[test]
    fn errors_about_an_expanded_value_name_the_variable_not_the_value() {
        let (_, expanded) = expand_options(
            vec![
                ("headers".into(), "Authorization: ${TOKEN}".into()),
                ("topic".into(), "t".into()),
            ],
            &env,
        )
        .unwrap();
        let invalid = expanded.scrub(Error::invalid(
            "headers",
            "Authorization: s3cr3t-token",
            "a header needs a name",
        ));
        let text = invalid.to_string();
        assert!(!text.contains("s3cr3t"), "{text}");
        assert!(
            text.contains("${TOKEN}") && text.contains("headers"),
            "{text}"
        );
        let other = expanded.scrub(Error::Failed("connecting with s3cr3t-token failed".into()));
        let text = other.to_string();
        assert!(!text.contains("s3cr3t"), "{text}");
        assert!(text.contains("${TOKEN}"), "{text}");
        // An error that holds no expanded value is kept as it is.
        let kept = expanded.scrub(Error::Failed("unrelated".into()));
        assert!(matches!(kept, Error::Failed(_)), "{kept:?}");
    }
}

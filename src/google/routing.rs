//! The `x-goog-request-params` routing header (AIP-4222).

use tonic::metadata::{AsciiMetadataValue, MetadataValue};

/// The metadata key of the routing header Google front ends use to send a call to the backend
/// that owns its resource (AIP-4222).
pub const ROUTING_HEADER: &str = "x-goog-request-params";

/// The value of an [`ROUTING_HEADER`] header: `key=value` pairs joined by `&`, each value
/// percent-encoded (every byte except ASCII letters, digits and `-_.~`). Keys are written as
/// they are.
///
/// # Example
///
/// ```
/// use gcp_sql::google::routing_value;
///
/// let value = routing_value(&[("topic", "projects/p/topics/t")]).unwrap();
/// assert_eq!(value.to_str().unwrap(), "topic=projects%2Fp%2Ftopics%2Ft");
/// ```
pub fn routing_value(pairs: &[(&str, &str)]) -> std::result::Result<AsciiMetadataValue, String> {
    let mut value =
        String::with_capacity(pairs.iter().map(|(key, v)| key.len() + v.len() + 16).sum());
    for (n, (key, v)) in pairs.iter().enumerate() {
        if n > 0 {
            value.push('&');
        }
        value.push_str(key);
        value.push('=');
        for b in v.bytes() {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                value.push(b as char);
            } else {
                value.push_str(&format!("%{b:02X}"));
            }
        }
    }
    MetadataValue::try_from(value).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_value_percent_encodes_reserved_bytes_of_a_value() {
        let value = routing_value(&[("topic", "projects/p/topics/a+b%c")]).unwrap();
        assert_eq!(
            value.to_str().unwrap(),
            "topic=projects%2Fp%2Ftopics%2Fa%2Bb%25c"
        );
    }

    #[test]
    fn routing_value_joins_pairs_with_an_ampersand() {
        let value = routing_value(&[
            ("table_name", "projects/p/instances/i/tables/t"),
            ("app_profile_id", "batch"),
        ])
        .unwrap();
        assert_eq!(
            value.to_str().unwrap(),
            "table_name=projects%2Fp%2Finstances%2Fi%2Ftables%2Ft&app_profile_id=batch"
        );
    }

    #[test]
    fn routing_value_percent_encodes_non_ascii_and_separator_bytes() {
        let value = routing_value(&[("name", "é &=x y")]).unwrap();
        assert_eq!(value.to_str().unwrap(), "name=%C3%A9%20%26%3Dx%20y");
    }

    #[test]
    fn routing_value_of_no_pairs_is_empty() {
        assert_eq!(routing_value(&[]).unwrap().to_str().unwrap(), "");
    }
}

//! Typed options declared once.
//!
//! A connector's writer options are declared with [`writer_options!`]: one row per option names
//! the field, its Rust type and its [`OptionSpec`] (declared in the row, or a shared spec). The
//! row drives the typed field, its default (read from the spec, so the builder, the parser and
//! the reference share one value), the getter, the builder setter, the bound check the builder
//! runs and the reading from [`ParsedOptions`]. What ties a Rust type to a spec is
//! [`OptionField`].

use std::time::Duration;

use crate::error::Result;

use super::ParsedOptions;
use super::spec::{DefaultValue, OptionSpec};

/// A Rust type that holds one option: how a builder value is checked against the option's
/// spec, how it is read from parsed SQL options, and how the spec's default becomes a value.
pub trait OptionField: Sized + Clone + PartialEq + std::fmt::Debug {
    /// The type the builder setter takes (the field type, or `T` for an `Option<T>` field).
    type Input: Copy;

    /// The field value for a value given to the builder.
    fn from_input(v: Self::Input) -> Self;

    /// The field value of a spec default; `None` when the default does not fit the type.
    fn from_default(d: &DefaultValue) -> Option<Self>;

    /// Checks a builder value against the spec's value-level bound.
    fn check(spec: &OptionSpec, v: Self::Input) -> Result<()>;

    /// The value the statement gives for the option, if any.
    fn read(p: &ParsedOptions, spec: &OptionSpec) -> Result<Option<Self::Input>>;
}

/// The default a spec declares, without the note on where it comes from.
fn plain(d: &DefaultValue) -> &DefaultValue {
    match d {
        DefaultValue::JavaSdk(inner) => plain(inner),
        other => other,
    }
}

/// Implements [`OptionField`] for a type the builder takes as it is: the spec default that fits
/// it (a pattern binding `v`), how a builder value is checked against the spec (a function of
/// the spec and the value) and the [`ParsedOptions`] getter that reads it.
macro_rules! plain_option_field {
    ($ty:ty, $default:pat => $value:expr, $check:expr, $read:ident) => {
        impl OptionField for $ty {
            type Input = $ty;
            fn from_input(v: $ty) -> Self {
                v
            }
            fn from_default(d: &DefaultValue) -> Option<Self> {
                match plain(d) {
                    $default => Some($value),
                    _ => None,
                }
            }
            fn check(spec: &OptionSpec, v: $ty) -> Result<()> {
                ($check)(spec, v)
            }
            fn read(p: &ParsedOptions, spec: &OptionSpec) -> Result<Option<$ty>> {
                p.$read(spec)
            }
        }
    };
}

plain_option_field!(i64, DefaultValue::Int(v) | DefaultValue::Bytes(v) => *v, OptionSpec::check_int, int);
plain_option_field!(f64, DefaultValue::Float(v) => *v, OptionSpec::check_float, float);
plain_option_field!(Duration, DefaultValue::Duration(v) => *v, OptionSpec::check_duration, duration);
plain_option_field!(bool, DefaultValue::Bool(v) => *v, |_, _| Ok(()), bool);

impl OptionField for i32 {
    type Input = i32;
    fn from_input(v: i32) -> Self {
        v
    }
    fn from_default(d: &DefaultValue) -> Option<Self> {
        i64::from_default(d).and_then(|v| i32::try_from(v).ok())
    }
    fn check(spec: &OptionSpec, v: i32) -> Result<()> {
        spec.check_int(v.into())
    }
    fn read(p: &ParsedOptions, spec: &OptionSpec) -> Result<Option<i32>> {
        p.int32(spec)
    }
}

/// An option that may be left unset: the spec's default is [`DefaultValue::None`] or
/// [`DefaultValue::Unset`], and the setter takes the inner value.
impl<T: OptionField<Input = T> + Copy> OptionField for Option<T> {
    type Input = T;
    fn from_input(v: T) -> Self {
        Some(v)
    }
    fn from_default(d: &DefaultValue) -> Option<Self> {
        match plain(d) {
            DefaultValue::None | DefaultValue::Unset(_) => Some(None),
            other => T::from_default(other).map(Some),
        }
    }
    fn check(spec: &OptionSpec, v: T) -> Result<()> {
        T::check(spec, v)
    }
    fn read(p: &ParsedOptions, spec: &OptionSpec) -> Result<Option<T>> {
        T::read(p, spec)
    }
}

/// The typed default of `spec`, as the field type `T` holds it.
///
/// # Panics
///
/// When the spec's default does not fit `T` (a declaration error, which every connector's
/// `builder_defaults_equal_documented_defaults` test would show at once).
pub fn default_of<T: OptionField>(spec: &OptionSpec) -> T {
    T::from_default(&spec.default).unwrap_or_else(|| {
        panic!(
            "the default of option '{}' ({:?}) does not fit its field type",
            spec.name, spec.default
        )
    })
}

/// Declares a set of writer options and its builder from one row per option.
///
/// ```text
/// writer_options! {
///     /// The Acme writer options.
///     pub struct AcmeWriterOptions / builder AcmeWriterOptionsBuilder {
///         /// Records per request before it is sent.
///         batch_size: i64 => BATCH_SIZE {
///             kind: OptionKind::Int,
///             default: DefaultValue::Int(100),
///             bound: Bound::Positive,
///             cross_rule: "",
///             example: "500",
///             description: "Records gathered into one request.",
///         };
///         /// Whether per-destination counters are registered (a shared spec: no body).
///         per_destination_metrics: bool => PER_DESTINATION_METRICS;
///     }
///     extra { warnings: Vec<String> = Vec::new() }
/// }
/// ```
///
/// A row with a body declares `pub static BATCH_SIZE: OptionSpec` (its `name` is the field
/// name, its group [`OptionGroup::Writer`](crate::options::OptionGroup::Writer)); a row
/// without one uses a spec in scope. The macro generates the options struct (its
/// [`Default`] reads each spec's default), `specs()` (the specs in row order), one getter per
/// row, the builder with one setter per row, the builder's private `checked()` (every given
/// value against its spec's bound, in row order) and `from_parsed()` (every option the statement
/// gives). The hand-written `build()` calls `checked()` and adds the cross-option rules. The
/// optional `extra` fields are not options (state computed by `build()`).
macro_rules! writer_options {
    (
        $(#[$smeta:meta])*
        $svis:vis struct $Struct:ident / builder $Builder:ident {
            $(
                $(#[doc = $doc:literal])*
                $field:ident : $ty:ty => $SPEC:ident $({ $($body:tt)* })? ;
            )*
        }
        $(extra { $( $xfield:ident : $xty:ty = $xdefault:expr ),* $(,)? })?
    ) => {
        $(
            $(
                #[doc = concat!("The `", stringify!($field), "` option of [`", stringify!($Struct), "`].")]
                pub static $SPEC: $crate::options::OptionSpec = $crate::options::OptionSpec {
                    name: stringify!($field),
                    group: $crate::options::OptionGroup::Writer,
                    // Writer options are sizes, counts and durations: none carries a secret.
                    redact: $crate::options::Redact::None,
                    $($body)*
                };
            )?
        )*

        $(#[$smeta])*
        #[derive(Debug, Clone, PartialEq)]
        $svis struct $Struct {
            $( $field: $ty, )*
            $($( $xfield: $xty, )*)?
        }

        impl Default for $Struct {
            fn default() -> Self {
                $Struct {
                    $( $field: $crate::options::default_of::<$ty>(&$SPEC), )*
                    $($( $xfield: $xdefault, )*)?
                }
            }
        }

        impl $Struct {
            /// A builder with every option at its default.
            pub fn builder() -> $Builder {
                $Builder::default()
            }

            /// The specs of these options, in declaration order.
            pub fn specs() -> &'static [&'static $crate::options::OptionSpec] {
                static SPECS: &[&$crate::options::OptionSpec] = &[$( &$SPEC, )*];
                SPECS
            }

            $(
                $(#[doc = $doc])*
                pub fn $field(&self) -> $ty {
                    self.$field
                }
            )*
        }

        #[doc = concat!("Builder of [`", stringify!($Struct), "`]; every value is checked in [`build`](Self::build).")]
        #[derive(Debug, Clone, Default)]
        #[must_use]
        $svis struct $Builder {
            $( $field: Option<<$ty as $crate::options::OptionField>::Input>, )*
        }

        impl $Builder {
            $(
                #[doc = concat!(
                    "Sets `", stringify!($field), "` (see [`", stringify!($Struct), "::", stringify!($field),
                    "`]); [`build`](Self::build) checks it against [`", stringify!($SPEC),
                    "`], which holds its default and bounds."
                )]
                pub fn $field(mut self, v: <$ty as $crate::options::OptionField>::Input) -> Self {
                    self.$field = Some(v);
                    self
                }
            )*

            /// Every given value checked against its spec's bound, in declaration order, over
            /// the defaults. The cross-option rules are `build()`'s.
            fn checked(&self) -> $crate::Result<$Struct> {
                #[allow(unused_mut)]
                let mut o = $Struct::default();
                $(
                    if let Some(v) = self.$field {
                        <$ty as $crate::options::OptionField>::check(&$SPEC, v)?;
                        o.$field = <$ty as $crate::options::OptionField>::from_input(v);
                    }
                )*
                Ok(o)
            }

            /// A builder holding every one of these options that `p` gives (unchecked until
            /// [`build`](Self::build)).
            pub fn from_parsed(p: &$crate::options::ParsedOptions) -> $crate::Result<Self> {
                #[allow(unused_mut)]
                let mut b = Self::default();
                $(
                    if let Some(v) = <$ty as $crate::options::OptionField>::read(p, &$SPEC)? {
                        b.$field = Some(v);
                    }
                )*
                Ok(b)
            }
        }
    };
}

pub(crate) use writer_options;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::error::Error;
    use crate::options::common::PER_DESTINATION_METRICS;
    use crate::options::{Bound, OptionKind};
    use crate::test_util::raw_options;

    writer_options! {
        /// A made-up connector's writer options.
        pub struct AcmeWriterOptions / builder AcmeWriterOptionsBuilder {
            /// Records per request.
            batch_size: i64 => BATCH_SIZE {
                kind: OptionKind::Int,
                default: DefaultValue::JavaSdk(&DefaultValue::Int(100)),
                bound: Bound::Positive,
                cross_rule: "",
                example: "500",
                description: "Records gathered into one request.",
            };
            /// Attempt deadline.
            deadline: Duration => DEADLINE {
                kind: OptionKind::Duration,
                default: DefaultValue::Duration(Duration::from_secs(5)),
                bound: Bound::AtLeastMillis,
                cross_rule: "",
                example: "1s",
                description: "How long one request may take.",
            };
            /// Channels, unset by default.
            channels: Option<i32> => CHANNELS {
                kind: OptionKind::Int,
                default: DefaultValue::Unset("one"),
                bound: Bound::Positive,
                cross_rule: "",
                example: "2",
                description: "Channels to spread requests over.",
            };
            /// Per-destination counters.
            per_destination_metrics: bool => PER_DESTINATION_METRICS;
        }
        extra { notes: Vec<String> = Vec::new() }
    }

    impl AcmeWriterOptionsBuilder {
        fn build(self) -> crate::Result<AcmeWriterOptions> {
            self.checked()
        }
    }

    #[test]
    fn defaults_come_from_the_specs() {
        let o = AcmeWriterOptions::default();
        assert_eq!(o.batch_size(), 100);
        assert_eq!(o.deadline(), Duration::from_secs(5));
        assert_eq!(o.channels(), None);
        assert!(!o.per_destination_metrics());
        assert!(o.notes.is_empty());
        assert_eq!(AcmeWriterOptions::builder().build().unwrap(), o);
        let names: Vec<&str> = AcmeWriterOptions::specs().iter().map(|s| s.name).collect();
        assert_eq!(
            names,
            [
                "batch_size",
                "deadline",
                "channels",
                "per_destination_metrics"
            ]
        );
    }

    #[test]
    fn setters_are_checked_against_the_bounds() {
        let o = AcmeWriterOptions::builder()
            .batch_size(1)
            .channels(3)
            .per_destination_metrics(true)
            .build()
            .unwrap();
        assert_eq!((o.batch_size(), o.channels()), (1, Some(3)));
        assert!(o.per_destination_metrics());
        let err = AcmeWriterOptions::builder()
            .batch_size(0)
            .build()
            .unwrap_err();
        assert!(
            matches!(err, Error::InvalidOption { ref option, .. } if option == "batch_size"),
            "{err}"
        );
        let err = AcmeWriterOptions::builder()
            .deadline(Duration::from_micros(10))
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("at least 1ms"), "{err}");
    }

    #[test]
    fn reads_the_options_a_statement_gives() {
        let raw = raw_options(&[("deadline", "2s"), ("per_destination_metrics", "true")]);
        let p = ParsedOptions::parse("acme", AcmeWriterOptions::specs(), &raw).unwrap();
        let o = AcmeWriterOptionsBuilder::from_parsed(&p)
            .unwrap()
            .build()
            .unwrap();
        assert_eq!(o.deadline(), Duration::from_secs(2));
        assert!(o.per_destination_metrics());
        assert_eq!(o.batch_size(), 100);
    }
}

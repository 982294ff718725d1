//! What the crate's DataFusion plan pieces share, below the connectors and the SQL layer: the
//! helpers every plan node writes alike ([`node`]) and the one design of the inspection table
//! functions ([`inspect`]: the lazy table, the argument checks, the emulator channel).
//!
//! It imports neither [`crate::connectors`] nor [`crate::sql`]: the connectors build their scan
//! nodes and inspection functions on it, and the SQL layer registers what they build.

pub mod inspect;
pub(crate) mod node;

//! The package's own tokio runtime.
//!
//! This extension links its own copy of tokio, separate from datafusion-python's: the sinks'
//! gRPC clients, timers and writer tasks need a runtime of this copy. It is handed to DataFusion's
//! FFI with every provider and factory, which enters it whenever the host calls into them.

use std::sync::OnceLock;

use tokio::runtime::{Builder, Handle, Runtime};

/// The runtime every sink of this process runs on (started on first use).
pub fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        Builder::new_multi_thread()
            .enable_all()
            .thread_name("gcp-sql")
            .build()
            .expect("cannot start the gcp_sql tokio runtime")
    })
}

/// A handle on [`runtime`].
pub fn handle() -> Handle {
    runtime().handle().clone()
}

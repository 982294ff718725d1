//! `gcp-sql`: a SQL shell on Apache DataFusion with Google Cloud Pub/Sub, Cloud Tasks and
//! Bigtable as table sinks. See [`gcp_sql::cli`] for the options.

fn main() -> std::process::ExitCode {
    gcp_sql::cli::main()
}

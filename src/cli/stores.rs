//! An object store registry that builds stores on first use from the URL scheme, so that
//! `SELECT * FROM 'gs://bucket/events.parquet'` and `CREATE EXTERNAL TABLE ... LOCATION
//! 's3://bucket/prefix/'` work without registering anything first.
//!
//! | scheme | store | configured from |
//! |---|---|---|
//! | `file` (or a plain path) | local file system | — |
//! | `gs` | Google Cloud Storage | `GOOGLE_SERVICE_ACCOUNT`, `GOOGLE_APPLICATION_CREDENTIALS`, ... or Application Default Credentials |
//! | `s3`, `s3a` | Amazon S3 (or a compatible store) | `AWS_ACCESS_KEY_ID`, `AWS_REGION`, `AWS_ENDPOINT`, ... |
//! | `http`, `https` | HTTP(S) server (plain GET, or WebDAV for listing) | — |
//!
//! One store is built per scheme and host (bucket) and then kept.

use std::sync::Arc;

use datafusion::error::{DataFusionError, Result};
use datafusion::execution::object_store::{DefaultObjectStoreRegistry, ObjectStoreRegistry};
use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::http::HttpBuilder;
use url::Url;

/// The URL schemes [`LazyObjectStoreRegistry`] can build a store for (besides `file`).
pub const LAZY_SCHEMES: [&str; 5] = ["gs", "s3", "s3a", "http", "https"];

/// An [`ObjectStoreRegistry`] that builds a store the first time a `gs://`, `s3://`, `http://`
/// or `https://` URL is used, from the scheme and the environment, and keeps it.
///
/// ```
/// use std::sync::Arc;
/// use datafusion::execution::runtime_env::RuntimeEnvBuilder;
/// use gcp_sql::cli::LazyObjectStoreRegistry;
///
/// let runtime = RuntimeEnvBuilder::new()
///     .with_object_store_registry(Arc::new(LazyObjectStoreRegistry::new()))
///     .build_arc()
///     .unwrap();
/// # drop(runtime);
/// ```
#[derive(Debug, Default)]
pub struct LazyObjectStoreRegistry {
    stores: DefaultObjectStoreRegistry,
}

impl LazyObjectStoreRegistry {
    /// A registry with the local file system registered and every other store built on demand.
    pub fn new() -> Self {
        Self::default()
    }
}

impl ObjectStoreRegistry for LazyObjectStoreRegistry {
    fn register_store(
        &self,
        url: &Url,
        store: Arc<dyn ObjectStore>,
    ) -> Option<Arc<dyn ObjectStore>> {
        self.stores.register_store(url, store)
    }

    fn deregister_store(&self, url: &Url) -> Result<Arc<dyn ObjectStore>> {
        self.stores.deregister_store(url)
    }

    fn get_store(&self, url: &Url) -> Result<Arc<dyn ObjectStore>> {
        if let Ok(store) = self.stores.get_store(url) {
            return Ok(store);
        }
        // Two queries may build the same store at once; the second registration simply wins.
        let store = build_store(url)?;
        self.stores.register_store(url, Arc::clone(&store));
        Ok(store)
    }
}

/// Builds the store that serves `url`, from its scheme and the process environment. It does
/// not touch the network: credentials are fetched on the first request.
///
/// Errors name the URL and say what is wrong (an unsupported scheme, a missing bucket, a bad
/// setting in the environment).
pub fn build_store(url: &Url) -> Result<Arc<dyn ObjectStore>> {
    let scheme = url.scheme();
    let bucket = || {
        url.host_str().filter(|h| !h.is_empty()).ok_or_else(|| {
            DataFusionError::Configuration(format!(
                "'{url}' names no bucket: write it as {scheme}://BUCKET/PATH"
            ))
        })
    };
    let built = match scheme {
        "gs" => GoogleCloudStorageBuilder::from_env()
            .with_bucket_name(bucket()?)
            .build()
            .map(store_arc),
        "s3" | "s3a" => AmazonS3Builder::from_env()
            .with_bucket_name(bucket()?)
            .build()
            .map(store_arc),
        "http" | "https" => {
            let origin = format!(
                "{scheme}://{}",
                &url[url::Position::BeforeHost..url::Position::AfterPort]
            );
            HttpBuilder::new().with_url(origin).build().map(store_arc)
        }
        other => {
            return Err(DataFusionError::Configuration(format!(
                "no object store for '{url}': the scheme '{other}' is not supported (supported: file, {})",
                LAZY_SCHEMES.join(", ")
            )));
        }
    };
    built.map_err(|e| {
        DataFusionError::Configuration(format!("cannot set up the object store for '{url}': {e}"))
    })
}

fn store_arc<S: ObjectStore>(store: S) -> Arc<dyn ObjectStore> {
    Arc::new(store)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{assert_contains_all, error_text};

    fn store_for(url: &str) -> Result<Arc<dyn ObjectStore>> {
        LazyObjectStoreRegistry::new().get_store(&Url::parse(url).unwrap())
    }

    #[test]
    fn gs_s3_and_https_urls_get_their_scheme_s_store_for_the_bucket() {
        for (url, store) in [
            (
                "gs://my-bucket/events/part-0.parquet",
                "GoogleCloudStorage(my-bucket)",
            ),
            ("s3://logs/2024/", "AmazonS3(logs)"),
            ("https://example.com/data/clicks.csv", "HttpStore"),
        ] {
            assert_eq!(store_for(url).unwrap().to_string(), store, "{url}");
        }
    }

    #[test]
    fn file_url_gets_the_local_file_system() {
        let store = store_for("file:///tmp/clicks.csv").unwrap();
        assert!(store.to_string().starts_with("LocalFileSystem"), "{store}");
    }

    #[test]
    fn store_is_built_once_per_bucket() {
        let registry = LazyObjectStoreRegistry::new();
        let first = registry
            .get_store(&Url::parse("gs://bucket-a/x.parquet").unwrap())
            .unwrap();
        let again = registry
            .get_store(&Url::parse("gs://bucket-a/other/y.parquet").unwrap())
            .unwrap();
        let other = registry
            .get_store(&Url::parse("gs://bucket-b/x.parquet").unwrap())
            .unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        assert!(!Arc::ptr_eq(&first, &other));
        assert_eq!(other.to_string(), "GoogleCloudStorage(bucket-b)");
    }

    #[test]
    fn registered_store_is_not_replaced() {
        let registry = LazyObjectStoreRegistry::new();
        let url = Url::parse("s3://mine/").unwrap();
        let mine: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        registry.register_store(&url, Arc::clone(&mine));
        assert!(Arc::ptr_eq(&registry.get_store(&url).unwrap(), &mine));
    }

    #[test]
    fn unsupported_scheme_is_a_clear_error() {
        let err = error_text(store_for("ftp://example.com/clicks.csv"));
        assert_contains_all(&err, &["scheme 'ftp' is not supported", "gs, s3"]);
    }

    #[test]
    fn url_without_bucket_is_a_clear_error() {
        let err = store_for("gs:///events.parquet").unwrap_err().to_string();
        assert!(err.contains("names no bucket"), "{err}");
    }
}

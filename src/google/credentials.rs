//! Credentials read from a `credentials_file`.

use std::path::Path;

use gcloud_sdk::google_cloud_auth::credentials::{
    Credentials, external_account, impersonated, service_account, user_account,
};

/// The OAuth scope requested for credentials read from `credentials_file`.
pub const CLOUD_PLATFORM_SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";

/// Builds credentials from a JSON credentials file, by its `type`: `service_account`,
/// `authorized_user`, `impersonated_service_account` or `external_account`, each asking for
/// [`CLOUD_PLATFORM_SCOPE`].
///
/// The error is a sentence naming the file: it cannot be read, is not JSON, has another
/// `type`, or its contents are refused by the credentials builder.
///
/// # Example
///
/// ```
/// use gcp_sql::google::credentials_from_file;
///
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("key.json");
/// std::fs::write(&path, r#"{"type": "api_key"}"#).unwrap();
/// let err = credentials_from_file(&path).unwrap_err();
/// assert!(err.contains("credential type 'api_key'"));
/// ```
pub fn credentials_from_file(path: &Path) -> std::result::Result<Credentials, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read credentials_file '{}': {e}", path.display()))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("credentials_file '{}' is not JSON: {e}", path.display()))?;
    let kind = json
        .get("type")
        .and_then(|t| t.as_str())
        .unwrap_or_default()
        .to_string();
    let scopes = [CLOUD_PLATFORM_SCOPE];
    let built = match kind.as_str() {
        "service_account" => service_account::Builder::new(json)
            .with_access_specifier(service_account::AccessSpecifier::from_scopes(scopes))
            .build(),
        "authorized_user" => user_account::Builder::new(json).with_scopes(scopes).build(),
        "impersonated_service_account" => {
            impersonated::Builder::new(json).with_scopes(scopes).build()
        }
        "external_account" => external_account::Builder::new(json)
            .with_scopes(scopes)
            .build(),
        other => {
            return Err(format!(
                "credentials_file '{}' has credential type '{other}'; supported are service_account, \
                 authorized_user, impersonated_service_account and external_account",
                path.display()
            ));
        }
    };
    built.map_err(|e| format!("credentials_file '{}': {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use tonic::codegen::http;

    use super::*;

    #[test]
    fn refuses_a_credentials_file_of_an_unknown_type() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("creds.json");
        std::fs::write(&path, r#"{"type": "mystery"}"#).unwrap();
        let err = credentials_from_file(&path).unwrap_err();
        assert!(
            err.contains("mystery") && err.contains("service_account"),
            "{err}"
        );
        let missing = credentials_from_file(&dir.path().join("absent.json")).unwrap_err();
        assert!(missing.contains("cannot read"), "{missing}");
        std::fs::write(&path, "not json").unwrap();
        assert!(
            credentials_from_file(&path)
                .unwrap_err()
                .contains("not JSON")
        );
    }

    /// Runs `openssl` with `args`, failing the test with its stderr when it does not succeed.
    fn openssl(args: &[&str]) -> Vec<u8> {
        let out = std::process::Command::new("openssl")
            .args(args)
            .output()
            .expect("the openssl command (it makes a throwaway RSA key for this test)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    /// Without aws-lc-rs in the build, a service-account key is signed by the ring provider
    /// `install_crypto_provider` installs: the credentials make a self-signed JWT whose
    /// RS256 signature verifies against the key's public half.
    #[tokio::test]
    async fn a_service_account_key_signs_its_token_with_the_installed_provider() {
        use base64::Engine as _;
        use base64::prelude::BASE64_URL_SAFE_NO_PAD;
        use gcloud_sdk::google_cloud_auth::credentials::CacheableResource;

        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key.pem");
        let key_path = key.to_str().unwrap();
        openssl(&[
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
            key_path,
        ]);
        let public = openssl(&[
            "rsa",
            "-in",
            key_path,
            "-RSAPublicKey_out",
            "-outform",
            "DER",
        ]);
        let file = dir.path().join("service-account.json");
        let json = serde_json::json!({
            "type": "service_account",
            "project_id": "test-project",
            "private_key_id": "test-key-id",
            "private_key": std::fs::read_to_string(&key).unwrap(),
            "client_email": "sink@test-project.iam.gserviceaccount.com",
            "client_id": "1",
            "token_uri": "https://oauth2.googleapis.com/token",
        });
        std::fs::write(&file, json.to_string()).unwrap();

        crate::google::install_crypto_provider();
        let credentials = credentials_from_file(&file).unwrap();
        let headers = match credentials.headers(http::Extensions::new()).await.unwrap() {
            CacheableResource::New { data, .. } => data,
            CacheableResource::NotModified => panic!("fresh credentials had no headers"),
        };
        let bearer = headers
            .get(http::header::AUTHORIZATION)
            .expect("an Authorization header")
            .to_str()
            .unwrap();
        let jwt = bearer.strip_prefix("Bearer ").expect("a bearer token");
        let (signed, signature) = jwt.rsplit_once('.').expect("a signed JWT");
        let claims = signed.split('.').nth(1).unwrap();
        let claims: serde_json::Value =
            serde_json::from_slice(&BASE64_URL_SAFE_NO_PAD.decode(claims).unwrap()).unwrap();
        assert_eq!(claims["scope"], CLOUD_PLATFORM_SCOPE, "{claims}");
        assert_eq!(claims["iss"], "sink@test-project.iam.gserviceaccount.com");
        ring::signature::UnparsedPublicKey::new(
            &ring::signature::RSA_PKCS1_2048_8192_SHA256,
            public,
        )
        .verify(
            signed.as_bytes(),
            &BASE64_URL_SAFE_NO_PAD.decode(signature).unwrap(),
        )
        .expect("the token's signature verifies against the service account's public key");
    }

    #[test]
    fn refuses_a_credentials_file_without_a_type() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("creds.json");
        std::fs::write(&path, r#"{"client_email": "a@b"}"#).unwrap();
        let err = credentials_from_file(&path).unwrap_err();
        assert!(err.contains("credential type ''"), "{err}");
    }
}

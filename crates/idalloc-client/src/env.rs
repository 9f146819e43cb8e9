//! The environment variables that reach `idalloc serve`, read one way for every program: the
//! `idalloc` CLI's `--server`, `--token-file`, `--cacert`, `--cert` and `--key` take their
//! defaults from these names, and [`crate::Client::from_env`] builds a client from them.
//!
//! `IDALLOC_SERVER` is the service's URL (several comma-separated: replicas, tried in turn);
//! `IDALLOC_TOKEN_FILE` a file whose first line is the bearer token; `IDALLOC_CACERT` a CA
//! bundle (PEM) that replaces the system's roots; `IDALLOC_CERT` and `IDALLOC_KEY` a client
//! certificate and its key (PEM). The same TLS names as the library's store variables
//! (`idalloc::store::env` with the `etcd` and `embedded` features): the CLI's flags apply to
//! whichever it reaches.

use std::path::Path;
use std::time::Duration;

use idalloc::{Error, Input, Result};

/// The service's URL(s), comma-separated.
pub const SERVER: &str = "IDALLOC_SERVER";
/// A file whose first line is the bearer token.
pub const TOKEN_FILE: &str = "IDALLOC_TOKEN_FILE";
/// The CA bundle (PEM) that verifies the service's certificate.
pub const CACERT: &str = "IDALLOC_CACERT";
/// A client certificate (PEM).
pub const CERT: &str = "IDALLOC_CERT";
/// The private key (PEM) of [`CERT`].
pub const KEY: &str = "IDALLOC_KEY";

fn invalid(what: &str, value: &str, rule: impl Into<String>) -> Error {
    Error::invalid_str(Input::Options, what, value, rule)
}

/// The bearer token: the first line of `path`, trimmed; an unreadable or empty file is refused,
/// naming it.
pub fn read_token_file(path: &Path) -> Result<String> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| invalid("token file", &shown, format!("a readable file ({e})")))?;
    let token = text.lines().next().unwrap_or_default().trim().to_string();
    if token.is_empty() {
        return Err(invalid(
            "token file",
            &shown,
            "a file with the bearer token on its first line",
        ));
    }
    Ok(token)
}

/// An HTTP client trusting `ca` (PEM bundle; `None`: the system's roots) and presenting the
/// client certificate `identity` (`(cert, key)` PEM files), connecting within `connect_timeout`.
pub fn http_client(
    ca: Option<&Path>,
    identity: Option<(&Path, &Path)>,
    connect_timeout: Duration,
) -> Result<reqwest::Client> {
    http_client_builder(ca, identity, connect_timeout)?.build().map_err(|e| {
        invalid("HTTP client", "(TLS settings)", format!("one this platform can build ({e})"))
    })
}

/// The builder of [`http_client`], with the files read and checked, for a program that sets
/// more on it (the `idalloc` CLI's `--insecure-skip-tls-verify`). Errors name the file and say
/// which one it is: `what` is "CA file", "client certificate" or "client key".
pub fn http_client_builder(
    ca: Option<&Path>,
    identity: Option<(&Path, &Path)>,
    connect_timeout: Duration,
) -> Result<reqwest::ClientBuilder> {
    let read = |what: &str, p: &Path| {
        std::fs::read(p)
            .map_err(|e| invalid(what, &p.display().to_string(), format!("a readable file ({e})")))
    };
    let mut b = reqwest::Client::builder().connect_timeout(connect_timeout);
    if let Some(ca) = ca {
        let shown = ca.display().to_string();
        let certs = reqwest::Certificate::from_pem_bundle(&read("CA file", ca)?)
            .map_err(|e| invalid("CA file", &shown, format!("a PEM certificate bundle ({e})")))?;
        if certs.is_empty() {
            return Err(invalid("CA file", &shown, "at least one PEM certificate"));
        }
        b = b.tls_built_in_root_certs(false);
        for c in certs {
            b = b.add_root_certificate(c);
        }
    }
    if let Some((cert, key)) = identity {
        let mut pem = read("client certificate", cert)?;
        pem.push(b'\n');
        pem.extend(read("client key", key)?);
        let id = reqwest::Identity::from_pem(&pem).map_err(|e| {
            invalid(
                "client certificate",
                &format!("{} / {}", cert.display(), key.display()),
                format!("a PEM certificate and its private key ({e})"),
            )
        })?;
        b = b.identity(id);
    }
    Ok(b)
}

/// The endpoints and options the variables describe, `var` answering each variable's value
/// (`None`: unset), on top of `opts`. Reads the token and TLS files.
pub fn settings(
    var: impl Fn(&str) -> Option<String>,
    mut opts: crate::ClientOptions,
) -> Result<(Vec<String>, crate::ClientOptions)> {
    let var = |name: &str| var(name).filter(|v| !v.trim().is_empty());
    let Some(server) = var(SERVER) else {
        return Err(invalid(
            SERVER,
            "(unset)",
            "the URL of an idalloc serve, e.g. http://127.0.0.1:7379",
        ));
    };
    let endpoints: Vec<String> = server.split(',').map(|s| s.trim().to_string()).collect();
    if let Some(f) = var(TOKEN_FILE) {
        opts.token = Some(read_token_file(Path::new(&f))?);
    }
    let (ca, cert, key) = (var(CACERT), var(CERT), var(KEY));
    let identity = match (&cert, &key) {
        (Some(c), Some(k)) => Some((Path::new(c.as_str()), Path::new(k.as_str()))),
        (None, None) => None,
        (Some(c), None) | (None, Some(c)) => {
            return Err(invalid(
                CERT,
                c,
                format!("{CERT} and {KEY} go together: set both or neither"),
            ))
        }
    };
    if ca.is_some() || identity.is_some() {
        let timeout = opts.request_timeout.min(Duration::from_secs(5));
        opts.http = Some(http_client(ca.as_deref().map(Path::new), identity, timeout)?);
    }
    Ok((endpoints, opts))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, String)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn server_token_and_tls_from_the_variables() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "s3cret\nignored\n").unwrap();
        let (eps, o) = settings(
            vars(&[
                (SERVER, "http://a:1, http://b:2".into()),
                (TOKEN_FILE, token.display().to_string()),
            ]),
            crate::ClientOptions::default(),
        )
        .unwrap();
        assert_eq!(eps, ["http://a:1", "http://b:2"]);
        assert_eq!(o.token.as_deref(), Some("s3cret"));
        let e = settings(vars(&[]), crate::ClientOptions::default()).unwrap_err().to_string();
        assert!(e.contains(SERVER), "{e}");
        let e = settings(
            vars(&[(SERVER, "http://a:1".into()), (CERT, "/c.pem".into())]),
            crate::ClientOptions::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("/c.pem") && e.contains(KEY), "{e}");
        std::fs::write(&token, "\n").unwrap();
        let e = read_token_file(&token).unwrap_err().to_string();
        assert!(e.contains("first line"), "{e}");
    }
}

//! The environment variables that choose and reach a store, read one way for every program:
//! the `idalloc` CLI takes its flags' defaults from these names, and [`from_env`] opens the store
//! they describe for a program that wants to follow the same settings (an agent deployed next
//! to the CLI, with the same `IDALLOC_…` variables).
//!
//! The rules are the CLI's: `IDALLOC_STORE` (a store URL, [`super::url::store_url`]) wins; else
//! `IDALLOC_ENDPOINTS` (comma-separated etcd client URLs) selects etcd; else the file store
//! `file:idalloc.redb`. `IDALLOC_CACERT`, `IDALLOC_CERT`, `IDALLOC_KEY` and
//! `IDALLOC_INSECURE_SKIP_TLS_VERIFY` are etcd's TLS settings; `IDALLOC_USER` (`NAME` or
//! `NAME:PASSWORD`) with `IDALLOC_PASSWORD` or `IDALLOC_PASSWORD_FILE` its user. [`settings`] is
//! the pure part: variables in, URL and options out.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::etcd::{EtcdAuth, EtcdTls, Password};
use super::url::{open, OpenOptions};
use super::{Store, StoreError, StoreResult};

/// A store URL.
pub const STORE: &str = "IDALLOC_STORE";
/// etcd client URLs, comma-separated.
pub const ENDPOINTS: &str = "IDALLOC_ENDPOINTS";
/// The CA bundle (PEM) that verifies etcd's (or `serve`'s) certificate.
pub const CACERT: &str = "IDALLOC_CACERT";
/// A client certificate (PEM).
pub const CERT: &str = "IDALLOC_CERT";
/// The private key (PEM) of [`CERT`].
pub const KEY: &str = "IDALLOC_KEY";
/// TESTING ONLY: any value but `0`, `false`, `no`, `off`, `n`, `f` or empty skips verifying
/// the server's certificate.
pub const INSECURE_SKIP_TLS_VERIFY: &str = "IDALLOC_INSECURE_SKIP_TLS_VERIFY";
/// The etcd user, `NAME` or `NAME:PASSWORD`.
pub const USER: &str = "IDALLOC_USER";
/// The etcd user's password.
pub const PASSWORD: &str = "IDALLOC_PASSWORD";
/// A file holding the etcd user's password (one trailing newline is ignored).
pub const PASSWORD_FILE: &str = "IDALLOC_PASSWORD_FILE";
/// The root of every store key (`AllocatorOptions::prefix`).
pub const PREFIX: &str = "IDALLOC_PREFIX";

/// The store when no variable names one.
pub const DEFAULT_STORE: &str = "file:idalloc.redb";

/// A boolean variable as the CLI reads it: set and not one of the false words.
pub fn truthy(value: &str) -> bool {
    !matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "" | "0" | "false" | "no" | "off" | "n" | "f"
    )
}

/// The etcd password of a password file ([`PASSWORD_FILE`], the CLI's `--password-file`): the
/// file's text without one trailing newline (`\n` or `\r\n`). An unreadable or empty file is
/// refused, naming it (the caller adds which setting named it).
pub fn read_password_file(path: &Path) -> StoreResult<Password> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| StoreError::InvalidRequest(format!("{}: cannot read: {e}", path.display())))?;
    let p = text.strip_suffix('\n').map(|t| t.strip_suffix('\r').unwrap_or(t)).unwrap_or(&text);
    if p.is_empty() {
        return Err(StoreError::InvalidRequest(format!(
            "{} is empty: it must hold the etcd password",
            path.display()
        )));
    }
    Ok(Password::new(p))
}

/// The store URL and open options the variables describe, `var` answering each variable's
/// value (`None`: unset). Files are not read here, except the password file.
pub fn settings(var: impl Fn(&str) -> Option<String>) -> StoreResult<(String, OpenOptions)> {
    let var = |name: &str| var(name).filter(|v| !v.is_empty());
    let url = match (var(STORE), var(ENDPOINTS)) {
        (Some(url), _) => url,
        (None, Some(endpoints)) => format!("etcd://{}", endpoints.replace(' ', "")),
        (None, None) => DEFAULT_STORE.to_string(),
    };
    let mut opts = OpenOptions::default();
    let insecure = var(INSECURE_SKIP_TLS_VERIFY).is_some_and(|v| truthy(&v));
    let (ca, cert, key) = (var(CACERT), var(CERT), var(KEY));
    if ca.is_some() || cert.is_some() || key.is_some() || insecure {
        opts.etcd_tls = Some(EtcdTls {
            ca_file: ca.map(PathBuf::from),
            cert_file: cert.map(PathBuf::from),
            key_file: key.map(PathBuf::from),
            insecure_skip_verify: insecure,
        });
    }
    if let Some(user) = var(USER) {
        let (name, inline) = match user.split_once(':') {
            Some((n, p)) => (n.to_string(), Some(Password::new(p))),
            None => (user, None),
        };
        let password = match (inline, var(PASSWORD), var(PASSWORD_FILE)) {
            (Some(p), _, _) => p,
            (None, Some(p), _) => Password::new(p),
            (None, None, Some(file)) => read_password_file(Path::new(&file)).map_err(|e| {
                StoreError::InvalidRequest(format!("{PASSWORD_FILE}: {}", message(e)))
            })?,
            (None, None, None) => {
                return Err(StoreError::InvalidRequest(format!(
                    "{USER} names etcd user {name:?} without a password: set {PASSWORD} or \
                     {PASSWORD_FILE}"
                )))
            }
        };
        opts.etcd_auth = Some(EtcdAuth::new(name, password));
    }
    Ok((url, opts))
}

/// The text of an error of [`read_password_file`].
fn message(e: StoreError) -> String {
    match e {
        StoreError::InvalidRequest(m) => m,
        other => other.to_string(),
    }
}

/// Opens the store the process environment describes ([`settings`] over `std::env::var`).
pub async fn from_env() -> StoreResult<Arc<dyn Store>> {
    let (url, opts) = settings(|name| std::env::var(name).ok())?;
    open(&url, &opts).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn the_cli_rules() {
        assert_eq!(settings(vars(&[])).unwrap().0, "file:idalloc.redb");
        let (url, _) = settings(vars(&[(STORE, "memory:"), (ENDPOINTS, "h:1")])).unwrap();
        assert_eq!(url, "memory:", "IDALLOC_STORE wins");
        let (url, o) = settings(vars(&[(ENDPOINTS, "http://a:1,b:2")])).unwrap();
        assert_eq!(url, "etcd://http://a:1,b:2");
        assert!(o.etcd_tls.is_none() && o.etcd_auth.is_none());
        let (_, o) = settings(vars(&[
            (ENDPOINTS, "https://a:1"),
            (CACERT, "/ca.pem"),
            (INSECURE_SKIP_TLS_VERIFY, "false"),
            (USER, "alice"),
            (PASSWORD, "s3cret"),
        ]))
        .unwrap();
        let tls = o.etcd_tls.unwrap();
        assert_eq!(tls.ca_file, Some(PathBuf::from("/ca.pem")));
        assert!(!tls.insecure_skip_verify);
        let auth = o.etcd_auth.unwrap();
        assert_eq!((auth.user.as_str(), auth.password.expose()), ("alice", "s3cret"));
        let e = settings(vars(&[(USER, "bob")])).err().unwrap().to_string();
        assert!(e.contains("bob") && e.contains(PASSWORD), "{e}");
        assert!(truthy("1") && truthy("true") && !truthy("off") && !truthy(""));
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        for (text, want) in [("pw\n", "pw"), ("pw\r\n", "pw"), ("pw", "pw"), ("p w\n\n", "p w\n")] {
            std::fs::write(&file, text).unwrap();
            assert_eq!(read_password_file(&file).unwrap().expose(), want, "{text:?}");
        }
        let f = file.display().to_string();
        let (_, o) = settings(vars(&[(USER, "ann"), (PASSWORD_FILE, &f)])).unwrap();
        assert_eq!(o.etcd_auth.unwrap().password.expose(), "p w\n");
        for text in ["", "\n", "\r\n"] {
            std::fs::write(&file, text).unwrap();
            let e =
                settings(vars(&[(USER, "ann"), (PASSWORD_FILE, &f)])).err().unwrap().to_string();
            assert!(e.contains(PASSWORD_FILE) && e.contains(&f) && e.contains("empty"), "{e}");
        }
        std::fs::remove_file(&file).unwrap();
        let e = settings(vars(&[(USER, "ann"), (PASSWORD_FILE, &f)])).err().unwrap().to_string();
        assert!(e.contains(PASSWORD_FILE) && e.contains("cannot read"), "{e}");
    }

    #[tokio::test]
    async fn opens_what_the_variables_name() {
        let (url, opts) = settings(vars(&[(STORE, "memory:")])).unwrap();
        assert!(open(&url, &opts).await.is_ok());
    }
}

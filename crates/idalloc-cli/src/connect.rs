//! The store-connection flags for etcd, as etcdctl spells them (`--endpoints`, `--cacert`,
//! `--cert`, `--key`, `--user`, `--password`, `--insecure-skip-tls-verify`), their `IDALLOC_...`
//! environment variables, the YAML client config of etcd's Go client and Cilium
//! (`--etcd-config`), and the credentials of an `etcd://user:password@...` store URL, resolved
//! into one store and its TLS and user settings.
//!
//! Secrets: a password is never required on the command line (where `ps` shows it). It comes, in
//! this order, from `--password` or `--user NAME:PASSWORD` or the store URL (each accepted with a
//! warning), `IDALLOC_PASSWORD`, `--password-file`, the config file's `password`, or a prompt
//! without echo when stdin is a terminal. It is held as a [`Password`], which `Debug` shows as
//! `<redacted>` and which has no `Display`, so no message, log or `status` output can show it.

use std::path::{Path, PathBuf};

use clap::Args;
use idalloc::store::etcd::{EtcdAuth, EtcdTls, Password};
use serde::Deserialize;

use crate::fail::Failure;
use crate::parse::{redact_store, StoreUrl};

/// The default store when nothing selects one.
pub use idalloc::store::env::DEFAULT_STORE;

/// `--user NAME[:PASSWORD]` (etcdctl's form).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserArg {
    pub name: String,
    pub password: Option<Password>,
}

/// Never fails: clap would quote the whole value, password included, in its error. An empty name
/// is refused by [`resolve`].
fn user_arg(s: &str) -> Result<UserArg, String> {
    let (name, password) = match s.split_once(':') {
        Some((n, p)) => (n, Some(Password::new(p))),
        None => (s, None),
    };
    Ok(UserArg { name: name.to_string(), password })
}

/// A boolean flag's environment variable as every program reads it
/// ([`idalloc::store::env::truthy`]: set and not `0`, `false`, `no`, `off`, `n`, `f`).
fn truthy_arg(s: &str) -> Result<bool, String> {
    Ok(idalloc::store::env::truthy(s))
}

fn password_arg(s: &str) -> Result<Password, String> {
    Ok(Password::new(s))
}

/// The etcd connection flags (all global).
#[derive(Args, Debug, Clone, Default)]
pub struct EtcdArgs {
    /// etcd client URLs, comma-separated (as etcdctl); selects the etcd store. A bare HOST:PORT is
    /// https:// when a TLS flag is given, else http://.
    #[arg(
        long,
        global = true, help_heading = crate::cli::GLOBAL,
        env = idalloc::store::env::ENDPOINTS,
        value_delimiter = ',',
        value_name = "URLS"
    )]
    pub endpoints: Option<Vec<String>>,

    /// Verify etcd's server certificate with this CA bundle (PEM) [default: the system's].
    #[arg(
        long = "cacert",
        id = "etcd-cacert",
        global = true, help_heading = crate::cli::GLOBAL,
        env = idalloc::store::env::CACERT,
        value_name = "FILE"
    )]
    pub cacert: Option<PathBuf>,

    /// Client certificate (PEM) for etcd's --client-cert-auth.
    #[arg(
        long = "cert",
        id = "etcd-cert",
        global = true, help_heading = crate::cli::GLOBAL,
        env = idalloc::store::env::CERT,
        value_name = "FILE"
    )]
    pub cert: Option<PathBuf>,

    /// Private key (PEM) of --cert.
    #[arg(long = "key", id = "etcd-key", global = true, help_heading = crate::cli::GLOBAL, env = idalloc::store::env::KEY, value_name = "FILE")]
    pub key: Option<PathBuf>,

    /// TESTING ONLY: do not verify etcd's server certificate (anyone on the path can impersonate
    /// etcd and read the password). Warns on every use.
    #[arg(
        long = "insecure-skip-tls-verify",
        id = "etcd-insecure-skip-tls-verify",
        global = true, help_heading = crate::cli::GLOBAL,
        env = idalloc::store::env::INSECURE_SKIP_TLS_VERIFY,
        value_parser = truthy_arg
    )]
    pub insecure_skip_tls_verify: bool,

    /// etcd user (etcd with `auth enable`). The password comes from IDALLOC_PASSWORD,
    /// --password-file, the --etcd-config file, or a prompt on a terminal. NAME:PASSWORD is
    /// accepted, with a warning.
    #[arg(long = "user", id = "etcd-user", global = true, help_heading = crate::cli::GLOBAL, env = idalloc::store::env::USER, hide_env_values = true, value_name = "NAME", value_parser = user_arg)]
    pub user: Option<UserArg>,

    /// The etcd user's password. Visible to every local user in `ps`: prefer IDALLOC_PASSWORD or
    /// --password-file (a warning says so).
    #[arg(long = "password", id = "etcd-password", global = true, help_heading = crate::cli::GLOBAL, value_name = "PASSWORD", value_parser = password_arg)]
    pub password: Option<Password>,

    /// Read the etcd user's password from FILE (one trailing newline is ignored).
    #[arg(
        long = "password-file",
        id = "etcd-password-file",
        global = true, help_heading = crate::cli::GLOBAL,
        env = idalloc::store::env::PASSWORD_FILE,
        value_name = "FILE"
    )]
    pub password_file: Option<PathBuf>,

    /// etcd client config file (YAML, as etcd's Go client and Cilium's etcd.config: endpoints,
    /// trusted-ca-file, cert-file, key-file, username, password, insecure-skip-tls-verify).
    /// Selects the etcd store with the file's endpoints; flags override the file.
    #[arg(
        long = "etcd-config",
        id = "etcd-config",
        global = true, help_heading = crate::cli::GLOBAL,
        env = "IDALLOC_ETCD_CONFIG",
        value_name = "FILE"
    )]
    pub etcd_config: Option<PathBuf>,
}

/// The fields of etcd's Go client YAML config that idalloc uses; others (`dial-timeout`, ...) are
/// ignored so that an existing Cilium `etcd.config` works unchanged.
#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
struct ConfigFile {
    #[serde(default)]
    endpoints: Vec<String>,
    trusted_ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    username: Option<String>,
    password: Option<String>,
    #[serde(default)]
    insecure_skip_tls_verify: bool,
}

fn read_config(path: &Path) -> Result<ConfigFile, Failure> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Failure::usage(format!("--etcd-config: cannot read {}: {e}", path.display()))
    })?;
    if text.trim().is_empty() {
        return Err(Failure::usage(format!(
            "--etcd-config: {} is empty: expected YAML with at least `endpoints:`",
            path.display()
        )));
    }
    // serde_yaml_ng's messages quote locations, not values, so no secret leaks through them.
    serde_yaml_ng::from_str(&text).map_err(|e| {
        Failure::usage(format!(
            "--etcd-config: {} is not an etcd client config (YAML with endpoints, \
             trusted-ca-file, cert-file, key-file, username, password, \
             insecure-skip-tls-verify): {e}",
            path.display()
        ))
    })
}

/// How the etcd client must connect: TLS and user settings for [`idalloc::store::etcd::EtcdOptions`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EtcdSecurity {
    pub tls: Option<EtcdTls>,
    pub auth: Option<EtcdAuth>,
}

/// What resolution needs from the outside world, so that it can be tested without one.
pub struct Environment<'a> {
    /// An environment variable (`IDALLOC_PASSWORD`).
    pub var: &'a dyn Fn(&str) -> Option<String>,
    /// Asks for the password of a user without echo, if stdin is a terminal (`None` if not).
    pub prompt: &'a dyn Fn(&str) -> Option<std::io::Result<String>>,
    /// Prints a warning line (to stderr).
    pub warn: &'a mut dyn FnMut(String),
}

/// [`resolve`] in this process: its environment variables, a no-echo prompt when stdin is a
/// terminal, warnings on stderr as `warning: ...` lines.
pub fn resolve_here(
    store: Option<StoreUrl>,
    args: &EtcdArgs,
) -> Result<(StoreUrl, EtcdSecurity), Failure> {
    use std::io::IsTerminal;
    let var = |name: &str| std::env::var(name).ok();
    let prompt = |user: &str| {
        std::io::stdin()
            .is_terminal()
            .then(|| rpassword::prompt_password(format!("Password for etcd user {user}: ")))
    };
    let mut warn = |w: String| crate::fail::say(&format!("warning: {w}"));
    resolve(store, args, Environment { var: &var, prompt: &prompt, warn: &mut warn })
}

/// Resolves `--store` (if given) and the etcd flags into the store to open and how.
pub fn resolve(
    store: Option<StoreUrl>,
    args: &EtcdArgs,
    env: Environment<'_>,
) -> Result<(StoreUrl, EtcdSecurity), Failure> {
    let config = args.etcd_config.as_deref().map(read_config).transpose()?;
    let config_path = args.etcd_config.as_deref().map(|p| p.display().to_string());

    let (endpoints, url_user, url_password) = match (store, &args.endpoints) {
        (Some(StoreUrl::Etcd { .. }), Some(_)) => {
            return Err(Failure::usage(
                "both --store etcd://... and --endpoints name etcd members: give them once",
            ))
        }
        (Some(other), Some(_)) => {
            return Err(Failure::usage(format!(
                "--endpoints selects the etcd store, but --store is {}: drop one of them",
                redact_store(&other.endpoint())
            )))
        }
        (Some(StoreUrl::Etcd { endpoints, user, password }), None) => (endpoints, user, password),
        (Some(other), None) => {
            if let Some(path) = &config_path {
                return Err(Failure::usage(format!(
                    "--etcd-config {path} selects the etcd store, but --store is {} {}: drop one \
                     of them",
                    other.kind(),
                    other.endpoint()
                )));
            }
            return Ok((other, EtcdSecurity::default()));
        }
        (None, Some(list)) => {
            let list: Vec<String> =
                list.iter().map(|e| e.trim().to_string()).filter(|e| !e.is_empty()).collect();
            if list.is_empty() {
                return Err(Failure::usage(
                    "--endpoints is empty: give etcd client URLs such as https://10.0.0.1:2379",
                ));
            }
            (list, None, None)
        }
        (None, None) => match &config {
            Some(c) if !c.endpoints.is_empty() => (c.endpoints.clone(), None, None),
            Some(_) => {
                return Err(Failure::usage(format!(
                    "--etcd-config {} lists no endpoints: add `endpoints: [https://HOST:2379]` or \
                     give --endpoints",
                    config_path.unwrap_or_default()
                )))
            }
            None => {
                let default = crate::parse::store_url(DEFAULT_STORE).map_err(Failure::usage)?;
                return Ok((default, EtcdSecurity::default()));
            }
        },
    };
    let config = config.unwrap_or_default();

    // TLS: flags override the file.
    let ca_file = args.cacert.clone().or(config.trusted_ca_file);
    let cert_file = args.cert.clone().or(config.cert_file);
    let key_file = args.key.clone().or(config.key_file);
    let insecure = args.insecure_skip_tls_verify || config.insecure_skip_tls_verify;
    let tls_given = ca_file.is_some() || cert_file.is_some() || key_file.is_some() || insecure;
    let endpoints = idalloc::store::url::with_scheme(&endpoints, tls_given);
    if insecure {
        (env.warn)(
            "--insecure-skip-tls-verify: etcd's server certificate is NOT verified; anyone on the \
             network path can impersonate etcd and read the password. Use for testing only."
                .into(),
        );
    }
    let tls = tls_given.then(|| {
        let mut tls = EtcdTls::default();
        tls.ca_file = ca_file;
        tls.cert_file = cert_file;
        tls.key_file = key_file;
        tls.insecure_skip_verify = insecure;
        tls
    });

    // The user: --user, else the URL's, else the file's.
    let (flag_user, flag_user_password) = match &args.user {
        Some(u) if u.name.trim().is_empty() => {
            return Err(Failure::usage(
                "--user: the user name is empty: --user NAME (the password comes from \
                 IDALLOC_PASSWORD, --password-file or a prompt)",
            ))
        }
        Some(u) => (Some(u.name.clone()), u.password.clone()),
        None => (None, None),
    };
    let user = flag_user.or(url_user).or(config.username.filter(|u| !u.is_empty()));
    let on_command_line = |what: &str| {
        format!(
            "{what} puts the etcd password on the command line, where other local users can see \
             it (ps); prefer IDALLOC_PASSWORD or --password-file"
        )
    };
    let mut password = None;
    for (candidate, warning) in [
        (args.password.clone(), Some(on_command_line("--password"))),
        (flag_user_password, Some(on_command_line("--user NAME:PASSWORD"))),
        (
            url_password,
            Some(
                "a password in the store URL (--store or IDALLOC_STORE) can be read by other \
                 local users (ps, the environment); prefer IDALLOC_PASSWORD or --password-file"
                    .to_string(),
            ),
        ),
    ] {
        if let (Some(p), None) = (candidate, &password) {
            if let Some(w) = warning {
                (env.warn)(w);
            }
            password = Some(p);
        }
    }
    if password.is_none() {
        password =
            (env.var)(idalloc::store::env::PASSWORD).filter(|p| !p.is_empty()).map(Password::new);
    }
    if password.is_none() {
        if let Some(path) = &args.password_file {
            password = Some(read_password_file(path)?);
        }
    }
    if password.is_none() {
        password = config.password.filter(|p| !p.is_empty()).map(Password::new);
    }
    let auth = match (user, password) {
        (None, None) => None,
        (None, Some(_)) => {
            return Err(Failure::usage(
                "an etcd password was given but no user: add --user NAME (or IDALLOC_USER)",
            ))
        }
        (Some(user), Some(password)) => Some(EtcdAuth::new(user, password)),
        (Some(user), None) => match (env.prompt)(&user) {
            Some(Ok(p)) if !p.is_empty() => Some(EtcdAuth::new(user, p)),
            Some(Ok(_)) => {
                return Err(Failure::usage(format!("no password entered for etcd user {user:?}")))
            }
            Some(Err(e)) => {
                return Err(Failure::usage(format!(
                    "cannot read the password of etcd user {user:?} from the terminal: {e}"
                )))
            }
            None => {
                return Err(Failure::usage(format!(
                    "etcd user {user:?} needs a password: set IDALLOC_PASSWORD, give \
                     --password-file FILE, or run on a terminal to be asked"
                )))
            }
        },
    };
    let url = StoreUrl::Etcd { endpoints, user: None, password: None };
    Ok((url, EtcdSecurity { tls, auth }))
}

/// How to reach a `--remote` store (another cluster's etcd): what its URL says (a bare HOST:PORT
/// is http://; the URL's user and password), plus this command's --cacert/--cert/--key when the
/// remote is https:// (one PKI across clusters, as in a Cilium cluster mesh). Its user is never
/// this command's --user: another cluster has its own.
pub fn remote_connection(
    url: &StoreUrl,
    local: &EtcdSecurity,
) -> Result<(StoreUrl, EtcdSecurity), Failure> {
    let StoreUrl::Etcd { endpoints, user, password } = url else {
        return Ok((url.clone(), EtcdSecurity::default()));
    };
    let endpoints = idalloc::store::url::with_scheme(endpoints, false);
    let https = endpoints.iter().all(|e| e.starts_with("https://"));
    let auth = match (user, password) {
        (Some(user), Some(password)) => Some(EtcdAuth::new(user.clone(), password.clone())),
        (Some(user), None) => {
            return Err(Failure::usage(format!(
                "remote etcd user {user:?} has no password: a remote takes its credentials from \
                 its URL, etcd://USER:PASSWORD@HOST:PORT"
            )))
        }
        (None, _) => None,
    };
    let tls = if https { local.tls.clone() } else { None };
    Ok((StoreUrl::Etcd { endpoints, user: None, password: None }, EtcdSecurity { tls, auth }))
}

/// `--password-file` (env `IDALLOC_PASSWORD_FILE`), read as every program reads it
/// ([`idalloc::store::env::read_password_file`]); the message names the flag.
fn read_password_file(path: &Path) -> Result<Password, Failure> {
    idalloc::store::env::read_password_file(path).map_err(|e| match e {
        idalloc::store::StoreError::InvalidRequest(m) => {
            Failure::usage(format!("--password-file: {m}"))
        }
        other => Failure::usage(format!("--password-file: {other}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::store_url;

    struct Run {
        warnings: Vec<String>,
        result: Result<(StoreUrl, EtcdSecurity), Failure>,
    }

    fn run(
        store: Option<&str>,
        args: EtcdArgs,
        env_password: Option<&str>,
        tty: Option<&str>,
    ) -> Run {
        let mut warnings = Vec::new();
        let var = |name: &str| {
            (name == "IDALLOC_PASSWORD").then(|| env_password.map(String::from)).flatten()
        };
        let prompt = |_: &str| tty.map(|p| Ok(p.to_string()));
        let mut warn = |w: String| warnings.push(w);
        let store = store.map(|s| store_url(s).expect("store url"));
        let result =
            resolve(store, &args, Environment { var: &var, prompt: &prompt, warn: &mut warn });
        Run { warnings, result }
    }

    fn ok(r: &Run) -> &(StoreUrl, EtcdSecurity) {
        r.result.as_ref().unwrap_or_else(|f| panic!("{}", f.message))
    }

    fn endpoints(r: &Run) -> Vec<String> {
        match &ok(r).0 {
            StoreUrl::Etcd { endpoints, user, password } => {
                assert!(user.is_none() && password.is_none(), "credentials left in the URL");
                endpoints.clone()
            }
            other => panic!("not etcd: {other:?}"),
        }
    }

    #[test]
    fn default_store_and_bare_endpoints_follow_the_tls_flags() {
        let r = run(None, EtcdArgs::default(), None, None);
        assert_eq!(ok(&r).0, StoreUrl::File("idalloc.redb".into()));
        let args = EtcdArgs {
            endpoints: Some(vec!["h1:2379".into(), "https://h2:2379".into()]),
            ..Default::default()
        };
        assert_eq!(
            endpoints(&run(None, args.clone(), None, None)),
            ["http://h1:2379", "https://h2:2379"]
        );
        let args = EtcdArgs { cacert: Some("ca.pem".into()), ..args };
        let r = run(None, args, None, None);
        assert_eq!(endpoints(&r), ["https://h1:2379", "https://h2:2379"]);
        assert_eq!(ok(&r).1.tls.as_ref().and_then(|t| t.ca_file.clone()), Some("ca.pem".into()));
    }

    #[test]
    fn password_sources_in_order_with_warnings_for_the_command_line() {
        let user = |s: &str| Some(user_arg(s).expect("user"));
        let base = EtcdArgs { endpoints: Some(vec!["h:1".into()]), ..Default::default() };
        let auth = |r: &Run| ok(r).1.auth.clone().expect("auth");

        // Environment: no warning.
        let r = run(None, EtcdArgs { user: user("ann"), ..base.clone() }, Some("from-env"), None);
        assert_eq!(auth(&r).password.expose(), "from-env");
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
        // --password wins, with a warning that does not repeat it.
        let args = EtcdArgs {
            user: user("ann"),
            password: Some(Password::new("flag-pw")),
            ..base.clone()
        };
        let r = run(None, args, Some("from-env"), None);
        assert_eq!(auth(&r).password.expose(), "flag-pw");
        assert_eq!(r.warnings.len(), 1);
        assert!(r.warnings[0].contains("--password") && !r.warnings[0].contains("flag-pw"));
        // user:password form.
        let r = run(None, EtcdArgs { user: user("ann:colon-pw"), ..base.clone() }, None, None);
        assert_eq!((auth(&r).user.as_str(), auth(&r).password.expose()), ("ann", "colon-pw"));
        assert!(r.warnings[0].contains("NAME:PASSWORD"));
        // URL credentials work, with a warning.
        let r = run(Some("etcd://bob:url-pw@h:1"), EtcdArgs::default(), None, None);
        assert_eq!((auth(&r).user.as_str(), auth(&r).password.expose()), ("bob", "url-pw"));
        assert!(r.warnings[0].contains("store URL"));
        // A URL user without password takes the environment's.
        let r = run(Some("etcd://bob@h:1"), EtcdArgs::default(), Some("env-pw"), None);
        assert_eq!(auth(&r).password.expose(), "env-pw");
        // The terminal prompt, last.
        let r = run(None, EtcdArgs { user: user("ann"), ..base.clone() }, None, Some("typed"));
        assert_eq!(auth(&r).password.expose(), "typed");
        // No source and no terminal: a clear error naming the sources.
        let r = run(None, EtcdArgs { user: user("ann"), ..base.clone() }, None, None);
        let f = r.result.expect_err("no password");
        assert!(
            f.message.contains("IDALLOC_PASSWORD") && f.message.contains("--password-file"),
            "{}",
            f.message
        );
        // An empty user name is refused without quoting the password.
        let r = run(None, EtcdArgs { user: user(":hunter2"), ..base.clone() }, None, None);
        let f = r.result.expect_err("empty user");
        assert!(f.message.contains("user name is empty") && !f.message.contains("hunter2"));
        // A password without a user.
        let r = run(None, EtcdArgs { password: Some(Password::new("x")), ..base }, None, None);
        assert!(r.result.expect_err("no user").message.contains("--user"));
    }

    #[test]
    fn password_file_and_config_file() {
        let dir = tempfile::tempdir().expect("tmp");
        let pw = dir.path().join("pw");
        std::fs::write(&pw, "file-pw\n").expect("write");
        let cfg = dir.path().join("etcd.config");
        std::fs::write(
            &cfg,
            "---\nendpoints:\n- https://10.0.0.1:2379\n- 10.0.0.2:2379\ntrusted-ca-file: '/s/ca.crt'\n\
             key-file: '/s/client.key'\ncert-file: '/s/client.crt'\nusername: cilium\n\
             password: cfg-pw\ndial-timeout: 5s\n",
        )
        .expect("write");
        // The config alone selects etcd, with its endpoints, TLS and user.
        let args = EtcdArgs { etcd_config: Some(cfg.clone()), ..Default::default() };
        let r = run(None, args.clone(), None, None);
        assert_eq!(endpoints(&r), ["https://10.0.0.1:2379", "https://10.0.0.2:2379"]);
        let sec = &ok(&r).1;
        let tls = sec.tls.clone().expect("tls");
        assert_eq!(
            (tls.ca_file, tls.cert_file, tls.key_file, tls.insecure_skip_verify),
            (
                Some("/s/ca.crt".into()),
                Some("/s/client.crt".into()),
                Some("/s/client.key".into()),
                false
            )
        );
        let auth = sec.auth.clone().expect("auth");
        assert_eq!((auth.user.as_str(), auth.password.expose()), ("cilium", "cfg-pw"));
        // Flags override the file; the password file beats the config's password.
        let args = EtcdArgs {
            cacert: Some("/other/ca.crt".into()),
            password_file: Some(pw.clone()),
            ..args
        };
        let r = run(None, args, None, None);
        assert_eq!(
            ok(&r).1.tls.as_ref().and_then(|t| t.ca_file.clone()),
            Some("/other/ca.crt".into())
        );
        assert_eq!(
            ok(&r).1.auth.as_ref().map(|a| a.password.expose().to_string()),
            Some("file-pw".into())
        );
        // A config file with --store file: is a contradiction.
        let args = EtcdArgs { etcd_config: Some(cfg), ..Default::default() };
        let r = run(Some("file:x.redb"), args, None, None);
        assert!(r.result.expect_err("conflict").message.contains("--etcd-config"));
        // Bad files are named.
        std::fs::write(&pw, "").expect("write");
        let args = EtcdArgs {
            user: Some(user_arg("a").expect("u")),
            password_file: Some(pw),
            endpoints: Some(vec!["h:1".into()]),
            ..Default::default()
        };
        assert!(run(None, args, None, None)
            .result
            .expect_err("empty")
            .message
            .contains("is empty"));
        let bad = dir.path().join("bad.yaml");
        std::fs::write(&bad, "endpoints: {not: a list}\n").expect("write");
        let args = EtcdArgs { etcd_config: Some(bad.clone()), ..Default::default() };
        let f = run(None, args, None, None).result.expect_err("bad yaml");
        assert!(
            f.message.contains(&bad.display().to_string()) && f.message.contains("endpoints"),
            "{}",
            f.message
        );
    }

    #[test]
    fn insecure_skip_verify_warns_loudly() {
        let args = EtcdArgs {
            endpoints: Some(vec!["h:1".into()]),
            insecure_skip_tls_verify: true,
            ..Default::default()
        };
        let r = run(None, args, None, None);
        assert_eq!(endpoints(&r), ["https://h:1"]);
        assert!(ok(&r).1.tls.as_ref().is_some_and(|t| t.insecure_skip_verify));
        assert!(r
            .warnings
            .iter()
            .any(|w| w.contains("NOT verified") && w.contains("testing only")));
    }
}

//! `serve --config FILE`: serve's flags read from a TOML file whose keys are the long flags'
//! names (`sweep-interval = "30s"`). The file is turned into command-line arguments appended
//! after the ones given, so clap parses and checks its values exactly as it parses flags (the
//! same errors, the same types); a key whose flag is on the command line, or whose environment
//! variable is set, is left out, so flags and environment override the file.

use std::ffi::OsString;
use std::path::Path;

use clap::{ArgAction, Command};

use crate::fail::Failure;

/// The arguments the file at `path` adds to `argv` (the whole command line, program first), for
/// the `serve` subcommand of `cmd`. `env` tells whether a variable is set.
pub fn file_args(
    cmd: &Command,
    argv: &[OsString],
    path: &Path,
    env: impl Fn(&str) -> bool,
) -> Result<Vec<OsString>, Failure> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Failure::usage(format!("--config {}: cannot read the file: {e}", path.display()))
    })?;
    args_of(cmd, argv, &text, env)
        .map_err(|m| Failure::usage(format!("--config {}: {m}", path.display())))
}

/// The flags a config file may set: serve's own and the global ones (`store`, `prefix`, ...),
/// without `config` itself and clap's `help`/`version`.
fn allowed(cmd: &Command) -> Vec<&clap::Arg> {
    let serve = cmd.find_subcommand("serve");
    cmd.get_arguments()
        .filter(|a| a.is_global_set())
        .chain(serve.into_iter().flat_map(|s| s.get_arguments()))
        .filter(|a| a.get_long().is_some_and(|l| l != "config" && l != "help" && l != "version"))
        .collect()
}

/// [`file_args`] of the file's `text`; the error names the offending key or value.
pub fn args_of(
    cmd: &Command,
    argv: &[OsString],
    text: &str,
    env: impl Fn(&str) -> bool,
) -> Result<Vec<OsString>, String> {
    let table: toml::Table = text.parse().map_err(|e| format!("not valid TOML: {e}"))?;
    let flags = allowed(cmd);
    let mut out = Vec::new();
    for (key, value) in &table {
        let Some(arg) = flags.iter().find(|a| a.get_long() == Some(key.as_str())) else {
            let mut names: Vec<&str> = flags.iter().filter_map(|a| a.get_long()).collect();
            names.sort_unstable();
            return Err(format!(
                "unknown key {key:?}; the keys are the long flags of serve and the global ones: {}",
                names.join(", ")
            ));
        };
        let given = argv.iter().any(|a| {
            let a = a.to_string_lossy();
            a == format!("--{key}")
                || a.starts_with(&format!("--{key}="))
                || arg.get_short().is_some_and(|s| a == format!("-{s}"))
        });
        let env_set = arg.get_env().is_some_and(|v| env(&v.to_string_lossy()));
        if given || env_set {
            continue;
        }
        let flag = matches!(arg.get_action(), ArgAction::SetTrue);
        match value {
            toml::Value::Boolean(true) if flag => out.push(OsString::from(format!("--{key}"))),
            toml::Value::Boolean(false) if flag => {}
            toml::Value::Boolean(_) => {
                return Err(format!("{key}: a value is expected, not true or false"))
            }
            _ if flag => return Err(format!("{key}: true or false is expected, not {value}")),
            v => out.push(OsString::from(format!("--{key}={}", scalar(key, v)?))),
        }
    }
    Ok(out)
}

/// A TOML value as the flag's text: a string as it is, a number as written, an array joined by
/// commas (the lists of flags like `endpoints`).
fn scalar(key: &str, v: &toml::Value) -> Result<String, String> {
    match v {
        toml::Value::String(s) => Ok(s.clone()),
        toml::Value::Integer(i) => Ok(i.to_string()),
        toml::Value::Float(f) => Ok(f.to_string()),
        toml::Value::Array(items) => {
            Ok(items.iter().map(|i| scalar(key, i)).collect::<Result<Vec<_>, _>>()?.join(","))
        }
        other => Err(format!("{key}: a string, number or list is expected, not {other}")),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    fn argv(s: &str) -> Vec<OsString> {
        s.split_whitespace().map(OsString::from).collect()
    }

    #[test]
    fn keys_become_flags_unless_given_or_in_the_environment() {
        let cmd = crate::cli::Cli::command();
        let text = "sweep-interval = \"5s\"\nmax-body = 100\ninsecure-listen = true\n\
                    listen = \"127.0.0.1:1\"\nstore = \"memory:\"\ndrain-timeout = \"1s\"\n";
        let got = args_of(&cmd, &argv("idalloc serve --listen 127.0.0.1:2"), text, |v| {
            v == "IDALLOC_DRAIN_TIMEOUT"
        })
        .expect("args");
        let got: Vec<String> = got.iter().map(|a| a.to_string_lossy().into_owned()).collect();
        let mut got = got;
        got.sort();
        assert_eq!(
            got,
            ["--insecure-listen", "--max-body=100", "--store=memory:", "--sweep-interval=5s"]
        );
    }

    #[test]
    fn an_unknown_key_is_named_with_the_allowed_ones() {
        let cmd = crate::cli::Cli::command();
        let e = args_of(&cmd, &argv("idalloc serve"), "sweep_interval = \"5s\"", |_| false)
            .expect_err("unknown");
        assert!(e.contains("\"sweep_interval\"") && e.contains("sweep-interval, "), "{e}");
        let e = args_of(&cmd, &argv("idalloc serve"), "insecure-listen = 1", |_| false)
            .expect_err("not a bool");
        assert!(e.contains("insecure-listen"), "{e}");
    }

    /// Every flag of serve has an environment variable (`IDALLOC_…`), so a deployment can set
    /// any of them the same way.
    #[test]
    fn every_serve_flag_has_an_environment_variable() {
        let cmd = crate::cli::Cli::command();
        let serve = cmd.find_subcommand("serve").expect("serve");
        for a in serve.get_arguments() {
            let Some(long) = a.get_long() else { continue };
            if long == "help" {
                continue;
            }
            let env = a.get_env().map(|e| e.to_string_lossy().into_owned());
            let want = format!("IDALLOC_{}", long.to_uppercase().replace('-', "_"));
            assert_eq!(env.as_deref(), Some(want.as_str()), "serve --{long}");
        }
    }
}

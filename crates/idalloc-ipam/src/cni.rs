//! The CNI protocol as the plugin speaks it (the CNI spec, `SPEC.md`): the verbs, the
//! environment each needs, the versions, and the error object. Pure: no I/O.

use serde_json::{json, Value};

/// The spec versions this plugin implements.
pub const SUPPORTED: [&str; 3] = ["0.4.0", "1.0.0", "1.1.0"];

/// The version used when the input names none this plugin knows (errors, VERSION).
pub const LATEST: &str = "1.1.0";

/// Well-known error codes of the spec, and this plugin's own (100 and above).
pub mod code {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const UNSUPPORTED_FIELD: u32 = 2;
    pub const INVALID_ENV: u32 = 4;
    pub const IO_FAILURE: u32 = 5;
    pub const DECODING: u32 = 6;
    pub const INVALID_CONFIG: u32 = 7;
    pub const TRY_AGAIN_LATER: u32 = 11;
    pub const NOT_AVAILABLE: u32 = 50;
    /// The pool has no free address for a new attachment.
    pub const EXHAUSTED: u32 = 100;
    /// CHECK: the attachment holds no address, or another one than its previous result says.
    pub const CHECK_FAILED: u32 = 101;
    pub const INTERNAL: u32 = 999;
}

/// A CNI error: printed as `{"cniVersion","code","msg","details"}` on stdout, exit status 1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>, details: impl Into<String>) -> CniError {
        CniError { code, msg: msg.into(), details: details.into() }
    }

    /// The error object for `version` (the input's, if this plugin knows it).
    pub fn to_json(&self, version: &str) -> Value {
        json!({"cniVersion": version, "code": self.code, "msg": self.msg, "details": self.details})
    }
}

/// The operation (`CNI_COMMAND`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Gc,
    Status,
    Version,
}

impl Command {
    fn parse(s: &str) -> Option<Command> {
        Some(match s {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "GC" => Command::Gc,
            "STATUS" => Command::Status,
            "VERSION" => Command::Version,
            _ => return None,
        })
    }

    /// The variables this command needs besides `CNI_COMMAND` (as libcni's skel asks them).
    fn required(self) -> &'static [&'static str] {
        match self {
            Command::Add | Command::Check => {
                &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"]
            }
            Command::Del => &["CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"],
            Command::Gc | Command::Status => &["CNI_PATH"],
            Command::Version => &[],
        }
    }

    /// The oldest spec version that has this command.
    pub fn since(self) -> &'static str {
        match self {
            Command::Gc | Command::Status => "1.1.0",
            _ => "0.4.0",
        }
    }
}

/// What the runtime passed in the environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invocation {
    pub command: Command,
    pub container_id: String,
    pub ifname: String,
    /// `CNI_ARGS` as `(key, value)` pairs.
    pub args: Vec<(String, String)>,
}

/// Reads the invocation from `var` (the environment). Missing variables are named in one error
/// (code 4), as are invalid container IDs and interface names.
pub fn invocation(var: &dyn Fn(&str) -> Option<String>) -> Result<Invocation, CniError> {
    let get = |n: &str| var(n).filter(|v| !v.is_empty());
    let Some(cmd) = get("CNI_COMMAND") else {
        return Err(CniError::new(
            code::INVALID_ENV,
            "required env variables [CNI_COMMAND] missing",
            "CNI_COMMAND is one of ADD, DEL, CHECK, GC, STATUS, VERSION",
        ));
    };
    let Some(command) = Command::parse(&cmd) else {
        return Err(CniError::new(
            code::INVALID_ENV,
            format!("unknown CNI_COMMAND {cmd:?}"),
            "CNI_COMMAND is one of ADD, DEL, CHECK, GC, STATUS, VERSION",
        ));
    };
    let missing: Vec<&str> =
        command.required().iter().copied().filter(|n| get(n).is_none()).collect();
    if !missing.is_empty() {
        return Err(CniError::new(
            code::INVALID_ENV,
            format!("required env variables [{}] missing", missing.join(",")),
            format!("CNI_COMMAND={cmd} needs {}", command.required().join(", ")),
        ));
    }
    let container_id = get("CNI_CONTAINERID").unwrap_or_default();
    let ifname = get("CNI_IFNAME").unwrap_or_default();
    if command.required().contains(&"CNI_CONTAINERID") {
        validate_container_id(&container_id)?;
        validate_ifname(&ifname)?;
    }
    let args = parse_args(&get("CNI_ARGS").unwrap_or_default())?;
    Ok(Invocation { command, container_id, ifname, args })
}

/// The spec's rule: an alphanumeric first character, then alphanumerics, `_`, `.` or `-`.
pub fn validate_container_id(id: &str) -> Result<(), CniError> {
    let ok = id.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && id.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(CniError::new(
            code::INVALID_ENV,
            format!("invalid CNI_CONTAINERID {id:?}"),
            "a container ID starts with a letter or digit, followed by letters, digits, '_', '.' \
             or '-'",
        ))
    }
}

/// Linux's rule for interface names (libcni checks the same): 1 to 15 bytes, no `/`, `:` or
/// whitespace, not `.` or `..`.
pub fn validate_ifname(name: &str) -> Result<(), CniError> {
    let ok = !name.is_empty()
        && name.len() <= 15
        && name != "."
        && name != ".."
        && !name.chars().any(|c| c == '/' || c == ':' || c.is_whitespace());
    if ok {
        Ok(())
    } else {
        Err(CniError::new(
            code::INVALID_ENV,
            format!("invalid CNI_IFNAME {name:?}"),
            "an interface name has 1 to 15 bytes, without '/', ':' or whitespace",
        ))
    }
}

/// `CNI_ARGS`: `K=V;K2=V2`.
fn parse_args(s: &str) -> Result<Vec<(String, String)>, CniError> {
    s.split(';')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(CniError::new(
                code::INVALID_ENV,
                format!("invalid CNI_ARGS pair {p:?}"),
                "CNI_ARGS is KEY=VALUE pairs separated by ';'",
            )),
        })
        .collect()
}

/// Checks `version` (the config's `cniVersion`) for `command`: a version this plugin implements,
/// and one that has the command (GC and STATUS are 1.1.0's).
pub fn check_version(version: &str, command: Command) -> Result<(), CniError> {
    if !SUPPORTED.contains(&version) {
        return Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            "incompatible CNI versions",
            format!("config is {version:?}, plugin supports {SUPPORTED:?}"),
        ));
    }
    let since = command.since();
    if SUPPORTED.iter().position(|v| *v == version) < SUPPORTED.iter().position(|v| *v == since) {
        return Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            format!("config version {version} does not allow {command:?}"),
            format!("{command:?} needs cniVersion {since} or later"),
        ));
    }
    Ok(())
}

/// The answer to VERSION.
pub fn version_answer(input_version: Option<&str>) -> Value {
    let v = input_version.filter(|v| SUPPORTED.contains(v)).unwrap_or(LATEST);
    json!({"cniVersion": v, "supportedVersions": SUPPORTED})
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn missing_variables_are_all_named() {
        let e = env(&[("CNI_COMMAND", "ADD"), ("CNI_IFNAME", "eth0")]);
        let err = invocation(&|n| e.get(n).cloned()).unwrap_err();
        assert_eq!(err.code, code::INVALID_ENV);
        assert!(err.msg.contains("[CNI_CONTAINERID,CNI_NETNS,CNI_PATH]"), "{}", err.msg);
        let e = env(&[("CNI_COMMAND", "DEL"), ("CNI_CONTAINERID", "c"), ("CNI_IFNAME", "eth0")]);
        assert!(invocation(&|n| e.get(n).cloned()).unwrap_err().msg.contains("[CNI_PATH]"));
        let e = env(&[("CNI_COMMAND", "VERSION")]);
        assert_eq!(invocation(&|n| e.get(n).cloned()).unwrap().command, Command::Version);
    }

    #[test]
    fn bad_ids_names_and_args_are_refused() {
        assert!(validate_container_id("-x").is_err());
        assert!(validate_container_id("ab_c.d-1").is_ok());
        assert!(validate_ifname("eth0").is_ok());
        for bad in ["", "a/b", "a:b", "sixteen-chars-xx", ".."] {
            assert!(validate_ifname(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_args("A=1;IP=10.0.0.5").unwrap()[1], ("IP".into(), "10.0.0.5".into()));
        assert!(parse_args("novalue").is_err());
    }

    #[test]
    fn versions() {
        assert!(check_version("1.0.0", Command::Add).is_ok());
        assert_eq!(check_version("0.3.1", Command::Add).unwrap_err().code, 1);
        assert_eq!(check_version("1.0.0", Command::Gc).unwrap_err().code, 1);
        assert!(check_version("1.1.0", Command::Status).is_ok());
        assert_eq!(version_answer(Some("9.9.9"))["cniVersion"], "1.1.0");
        assert_eq!(version_answer(Some("0.4.0"))["cniVersion"], "0.4.0");
    }
}

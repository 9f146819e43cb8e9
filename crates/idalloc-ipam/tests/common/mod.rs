//! Running the plugin binary as a runtime does: environment, config on stdin, JSON on stdout.

#![allow(dead_code)]

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::{json, Value};

pub const BIN: &str = env!("CARGO_BIN_EXE_idalloc-ipam");

/// What one exec gave: its exit status and its stdout parsed (Null when empty).
#[derive(Debug)]
pub struct Out {
    pub ok: bool,
    pub code: Option<i32>,
    pub json: Value,
    pub stderr: String,
}

impl Out {
    /// The error code of a failed exec (panics, naming the output, when it succeeded).
    pub fn err_code(&self) -> u64 {
        assert!(!self.ok, "expected a failure: {self:?}");
        self.json["code"].as_u64().unwrap_or_else(|| panic!("no error code: {self:?}"))
    }

    /// The addresses of a successful ADD.
    pub fn addresses(&self) -> Vec<String> {
        assert!(self.ok, "ADD failed: {self:?}");
        self.json["ips"]
            .as_array()
            .unwrap_or_else(|| panic!("no ips: {self:?}"))
            .iter()
            .map(|i| i["address"].as_str().unwrap_or_default().to_string())
            .collect()
    }
}

/// Runs the plugin with exactly `env` (plus PATH) and `stdin`.
pub fn exec_env(env: &[(&str, &str)], stdin: &str) -> Out {
    let mut cmd = Command::new(BIN);
    cmd.env_clear().env("PATH", std::env::var("PATH").unwrap_or_default());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn idalloc-ipam");
    child.stdin.take().expect("stdin").write_all(stdin.as_bytes()).expect("write stdin");
    let out = child.wait_with_output().expect("wait idalloc-ipam");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let json = if text.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {text}"))
    };
    Out {
        ok: out.status.success(),
        code: out.status.code(),
        json,
        stderr: String::from_utf8_lossy(&out.stderr).to_string(),
    }
}

/// Runs verb `cmd` for attachment (`cid`, `ifname`) with the full environment a runtime gives.
pub fn exec(cmd: &str, cid: &str, ifname: &str, conf: &Value) -> Out {
    exec_env(
        &[
            ("CNI_COMMAND", cmd),
            ("CNI_CONTAINERID", cid),
            ("CNI_NETNS", "/var/run/netns/none"),
            ("CNI_IFNAME", ifname),
            ("CNI_PATH", "/usr/lib/cni"),
        ],
        &conf.to_string(),
    )
}

/// A network configuration with `ipam` (the plugin's section) and version `v`.
pub fn netconf(v: &str, name: &str, ipam: Value) -> Value {
    json!({"cniVersion": v, "name": name, "type": "bridge", "ipam": ipam})
}

//! The HTTP client of the CLI's `serve` tests (`serve.rs`, `serve_secure.rs`, `deploy.rs`): one
//! request function and one answer type over ureq, instead of a copy in each. The server process
//! itself comes from `idalloc_testkit::serve`.

// Each test file uses a part of it.
#![allow(dead_code)]

use std::time::Duration;

use serde_json::Value;

/// One answer: status, body as text and as JSON (`Null` if not JSON), and the `www-authenticate`
/// header (what a 401 names).
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub body: Value,
    pub text: String,
    pub www_authenticate: Option<String>,
}

impl Resp {
    /// Asserts a success (200 or 201); returns the JSON body.
    pub fn ok(self) -> Value {
        assert!(self.status == 200 || self.status == 201, "{} {}", self.status, self.text);
        self.body
    }

    /// Asserts an error status and kind; returns the message.
    pub fn err(self, status: u16, kind: &str) -> String {
        assert_eq!(self.status, status, "{}", self.text);
        assert_eq!(self.body["kind"], kind, "{}", self.text);
        let msg = self.body["message"].as_str().expect("message").to_string();
        assert!(!msg.is_empty());
        msg
    }
}

/// A plain-HTTP client that returns answers of every status (not errors), each request bounded
/// by `timeout`.
pub fn plain_agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .build()
        .into()
}

/// One request, with `authorization: Bearer TOKEN` if given and a body (sent as
/// `application/json`, but not checked: tests send broken JSON too) if given; `Err` is a transport
/// failure (TLS refused, connection closed), as text. A successful watch stream never ends, so
/// its body is not read.
pub fn request(
    a: &ureq::Agent,
    method: &str,
    url: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> Result<Resp, String> {
    let auth = token.map(|t| format!("Bearer {t}"));
    macro_rules! with_auth {
        ($req:expr) => {{
            let r = $req;
            match &auth {
                Some(h) => r.header("authorization", h),
                None => r,
            }
        }};
    }
    let r = match (method, body) {
        ("GET", _) => with_auth!(a.get(url)).call(),
        ("DELETE", _) => with_auth!(a.delete(url)).call(),
        ("POST", Some(b)) => {
            with_auth!(a.post(url)).header("content-type", "application/json").send(b)
        }
        ("POST", None) => with_auth!(a.post(url)).send_empty(),
        ("PUT", _) => with_auth!(a.put(url)).send_empty(),
        ("PATCH", Some(b)) => {
            with_auth!(a.patch(url)).header("content-type", "application/json").send(b)
        }
        _ => panic!("unsupported {method}"),
    };
    let mut r = r.map_err(|e| e.to_string())?;
    let status = r.status().as_u16();
    let www_authenticate =
        r.headers().get("www-authenticate").and_then(|v| v.to_str().ok()).map(str::to_string);
    let text = if url.contains("/watch") && status == 200 {
        String::new()
    } else {
        r.body_mut().read_to_string().unwrap_or_default()
    };
    let body = serde_json::from_str(&text).unwrap_or(Value::Null);
    Ok(Resp { status, body, text, www_authenticate })
}

/// Fails with what to do if this process's soft open-files limit is below `n`: a test that holds
/// many sockets (and the `serve` it starts, which inherits the limit and sizes its connection cap
/// from it) would otherwise fail somewhere in the middle with "too many open files".
/// `scripts/test.sh` raises the soft limit to the hard one.
pub fn need_open_files(n: u64, what: &str) {
    let limit = idalloc_server::limits::open_files_limit();
    assert!(
        limit.is_none_or(|l| l >= n),
        "{what} needs an open-files limit of at least {n}, this process has {limit:?}: raise it \
         (`ulimit -n {n}`, as scripts/test.sh does up to the hard limit)"
    );
}

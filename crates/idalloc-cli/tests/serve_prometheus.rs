//! The shipped Prometheus files against the real thing: `promtool check rules`
//! and `promtool test rules` on `deploy/prometheus/` (every alert of the rules has a unit test that
//! fires it), and a real Prometheus (Debian's `prometheus`), configured from the shipped
//! `deploy/prometheus/prometheus.yaml`, scraping a real `idalloc serve` and loading the shipped
//! rules. Prometheus listens on a free loopback port, keeps its data in a temporary directory and
//! is stopped by its PID when the test ends.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{plain_agent, request};
use idalloc_testkit::serve::Serve;
use serde_json::{json, Value};

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/prometheus")
}

fn promtool(args: &[&str]) -> (bool, String) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(deploy())
        .output()
        .expect("run promtool (Debian package prometheus; scripts/test.sh installs it)");
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// The names after `key: ` on lines of `text` (a light YAML scan, enough for these files).
fn names(text: &str, key: &str) -> std::collections::BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.trim().trim_start_matches("- ").strip_prefix(key))
        .map(|n| n.trim().to_string())
        .collect()
}

#[test]
fn the_shipped_alert_rules_pass_promtool_and_every_alert_is_fired_by_a_unit_test() {
    let (ok, out) = promtool(&["check", "rules", "idalloc-alerts.yml"]);
    assert!(ok && out.contains("SUCCESS"), "{out}");
    let (ok, out) = promtool(&["test", "rules", "idalloc-alerts.test.yaml"]);
    assert!(ok && out.contains("SUCCESS"), "{out}");
    let rules = std::fs::read_to_string(deploy().join("idalloc-alerts.yml")).expect("rules");
    let tests = std::fs::read_to_string(deploy().join("idalloc-alerts.test.yaml")).expect("tests");
    let alerts = names(&rules, "alert:");
    assert!(alerts.len() >= 16, "{alerts:?}");
    assert_eq!(alerts, names(&tests, "alertname:"), "every alert has a unit test, and no other");
    let (ok, out) = promtool(&["check", "config", "prometheus.yaml"]);
    // The shipped config names /etc/prometheus/rules/idalloc-alerts.yml, absent here: only its
    // syntax is checked by the scrape test below, which loads it.
    assert!(ok || out.contains("idalloc-alerts.yml"), "{out}");
}

/// A running Prometheus, killed and reaped when dropped.
struct Prometheus {
    child: Child,
    port: u16,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

impl Prometheus {
    /// Starts Prometheus on `config` with its data in `dir`, waiting until it is ready (a free
    /// port taken by someone else between the pick and the bind: tried again on another).
    fn start(dir: &Path, config: &Path) -> Prometheus {
        for _ in 0..3 {
            let port = free_port();
            let child = Command::new("prometheus")
                .arg(format!("--config.file={}", config.display()))
                .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::from(
                    std::fs::File::create(dir.join("prometheus.log")).expect("log"),
                ))
                .spawn()
                .expect("run prometheus (Debian package prometheus; scripts/test.sh installs it)");
            let mut p = Prometheus { child, port };
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline {
                if p.child.try_wait().expect("wait").is_some() {
                    break;
                }
                if p.get("/-/ready").is_some_and(|(s, _)| s == 200) {
                    return p;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            drop(p);
        }
        let log = std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default();
        panic!("prometheus did not become ready:\n{log}");
    }

    fn get(&self, path: &str) -> Option<(u16, Value)> {
        let url = format!("http://127.0.0.1:{}{path}", self.port);
        let r = request(&plain_agent(Duration::from_secs(10)), "GET", &url, None, None).ok()?;
        Some((r.status, r.body))
    }

    /// The value of the instant query `q`'s first sample, if any.
    fn query(&self, q: &str) -> Option<f64> {
        let enc: String = q
            .bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'-' | b'.' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let (_, v) = self.get(&format!("/api/v1/query?query={enc}"))?;
        v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
    }
}

#[test]
fn a_real_prometheus_scrapes_serve_with_the_shipped_settings_and_loads_the_shipped_rules() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("file:{}", dir.path().join("ids.redb").display());
    let s = Serve::start(env!("CARGO_BIN_EXE_idalloc"), &["--store", &store], &[]);
    let agent = plain_agent(Duration::from_secs(30));
    let body = json!({"name":"p","min":1,"max":100}).to_string();
    let r = request(&agent, "POST", &s.http("/v1/pools"), None, Some(&body)).expect("create");
    assert_eq!(r.status, 200, "{}", r.text);
    let body = json!({"key":"k","holder":"h"}).to_string();
    let r = request(&agent, "POST", &s.http("/v1/pools/p/acquire"), None, Some(&body))
        .expect("acquire");
    assert_eq!(r.status, 200, "{}", r.text);

    // The shipped settings, with the test's target, a short interval and the rules' real path.
    let shipped =
        std::fs::read_to_string(deploy().join("prometheus.yaml")).expect("shipped config");
    let rules = deploy().join("idalloc-alerts.yml").canonicalize().expect("rules path");
    let config = shipped
        .replace("127.0.0.1:7379", s.addr())
        .replace("scrape_interval: 15s", "scrape_interval: 1s")
        .replace("scrape_timeout: 10s", "scrape_timeout: 1s")
        .replace("/etc/prometheus/rules/idalloc-alerts.yml", rules.to_str().expect("utf-8"));
    assert!(config.contains(s.addr()) && config.contains("scrape_interval: 1s"), "{config}");
    let config_path = dir.path().join("prometheus.yml");
    std::fs::write(&config_path, config).expect("write config");
    let prom = Prometheus::start(dir.path(), &config_path);

    // The figures are taken from one pass of the wait: a later scrape slower than the 1 s
    // scrape timeout (a loaded machine) sets `up` to 0 and marks the series stale, so asking
    // again after the wait could see that instead of the scrape that succeeded.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut capacity, mut up, mut requests) = (None, None, None);
    while Instant::now() < deadline {
        capacity = prom.query(r#"idalloc_pool_capacity{job="idalloc",pool="p"}"#);
        up = prom.query(r#"up{job="idalloc"}"#);
        requests = prom.query(r#"sum(idalloc_http_requests_total{job="idalloc"})"#);
        if capacity.is_some() && up == Some(1.0) && requests.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(capacity, Some(100.0), "Prometheus did not scrape serve's pool metrics");
    assert_eq!(up, Some(1.0));
    assert!(requests.is_some_and(|n| n >= 2.0), "{requests:?}");
    // The shipped rules are loaded, healthy, and none fires against a healthy service.
    let (_, v) = prom.get("/api/v1/rules").expect("rules");
    let loaded: Vec<&Value> = v["data"]["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .collect();
    assert!(loaded.len() >= 16, "{v}");
    assert!(loaded.iter().all(|r| r["health"] != "err"), "{v}");
    let (_, alerts) = prom.get("/api/v1/alerts").expect("alerts");
    let firing: Vec<&Value> = alerts["data"]["alerts"]
        .as_array()
        .expect("alerts")
        .iter()
        .filter(|a| a["state"] == "firing")
        .collect();
    assert!(firing.is_empty(), "{alerts}");
    drop(prom);
    drop(s);
}

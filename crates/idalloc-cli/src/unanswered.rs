//! What a command that got no answer from its store says: which store, how long the command
//! really waited, and, for an etcd host name that does not resolve, that DNS is the cause.
//!
//! The library's timeouts name one attempt's bound ("no answer within 1.666666666s": a third of
//! `--timeout`, retried three times), which is neither the time the user waited nor where the
//! command went. The command knows both: [`remember`] records the store once it is resolved, and
//! the error line is rewritten by [`explain`] when the failure is the store's silence. The DNS
//! check runs only on that error path (one lookup per endpoint host, bounded).

use std::sync::OnceLock;
use std::time::Duration;

use crate::fail::Failure;
use crate::open::Settings;
use crate::parse::StoreUrl;

/// Where the command went, as recorded by [`remember`].
#[derive(Debug, Clone)]
struct Target {
    /// "etcd http://a:2379,http://b:2379", "file /var/lib/idalloc/ids.redb".
    shown: String,
    /// `host:port` of each etcd endpoint (empty for other stores).
    hosts: Vec<String>,
    timeout: Duration,
}

static TARGET: OnceLock<Target> = OnceLock::new();

/// Records the command's store and `--timeout`, for [`explain`].
pub fn remember(settings: &Settings) {
    let hosts = match &settings.url {
        StoreUrl::Etcd { endpoints, .. } => endpoints.iter().map(|e| host_port(e)).collect(),
        _ => Vec::new(),
    };
    let shown = format!("{} {}", settings.url.kind(), settings.url.endpoint());
    let _ = TARGET.set(Target { shown, hosts, timeout: settings.timeout });
}

/// `host:port` of an endpoint URL (`https://h:2379/` → `h:2379`).
fn host_port(endpoint: &str) -> String {
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
    rest.split('/').next().unwrap_or(rest).to_string()
}

/// Whether `message` is the store's silence (a timeout), as opposed to an answer or a refusal.
fn is_silence(message: &str) -> bool {
    message.starts_with("store unavailable:")
        && (message.contains("no answer within") || message.contains("did not answer within"))
}

/// The message of a timed-out command, naming `target` and the time `waited`; `dns` holds the
/// hosts that did not resolve, with the resolver's reason.
fn reword(message: &str, target: &Target, waited: Duration, dns: &[(String, String)]) -> String {
    let reason = message.strip_prefix("store unavailable:").unwrap_or(message).trim();
    let mut out = format!(
        "store unavailable: {} gave no answer within {:.1}s (--timeout {:?}; last attempt: {reason})",
        target.shown,
        waited.as_secs_f64(),
        target.timeout,
    );
    for (host, why) in dns {
        out.push_str(&format!("; cannot resolve {host} (DNS lookup failed: {why})"));
    }
    out
}

/// `f` reworded when it is the store's silence (see the module docs); any other failure as is.
pub async fn explain(f: Failure, waited: Duration) -> Failure {
    let Some(target) = TARGET.get() else { return f };
    if !is_silence(&f.message) {
        return f;
    }
    let mut dns = Vec::new();
    for host in &target.hosts {
        let lookup = tokio::net::lookup_host(host.clone());
        match tokio::time::timeout(Duration::from_secs(2), lookup).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => dns.push((host.clone(), e.to_string())),
            Err(_) => dns.push((host.clone(), "no answer within 2s".to_string())),
        }
    }
    Failure { code: f.code, kind: f.kind, message: reword(&f.message, target, waited, &dns) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_is_reworded_with_the_store_the_wait_and_dns() {
        let t = Target {
            shown: "etcd http://db.invalid:2379".into(),
            hosts: vec!["db.invalid:2379".into()],
            timeout: Duration::from_secs(3),
        };
        let m = "store unavailable: no answer within 1s";
        assert!(is_silence(m));
        assert!(!is_silence("store unavailable: etcd refused: permission denied"));
        assert!(!is_silence("pool \"p\" not found"));
        let dns = [("db.invalid:2379".to_string(), "Name or service not known".to_string())];
        let r = reword(m, &t, Duration::from_millis(3040), &dns);
        assert_eq!(
            r,
            "store unavailable: etcd http://db.invalid:2379 gave no answer within 3.0s \
             (--timeout 3s; last attempt: no answer within 1s); cannot resolve db.invalid:2379 \
             (DNS lookup failed: Name or service not known)"
        );
        assert_eq!(host_port("https://h:2379/"), "h:2379");
        assert_eq!(host_port("h:2379"), "h:2379");
    }
}

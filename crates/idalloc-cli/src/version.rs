//! `idalloc version`: this client's build (version, git commit, API and record layout versions)
//! and, with a store named, what serves it ("etcd 3.4.27"), asked within `--timeout`.

use idalloc::cluster_version::{OLDEST_CLUSTER_VERSION, PROTOCOL_VERSION};
use idalloc::store::Store;
use serde_json::json;

use crate::commands::Out;
use crate::fail::Failure;
use crate::open::Settings;

/// Prints the client's versions and, if asked, the store's: `store` is `None` when no store was
/// named, `Some(Ok(v))` when it answered, `Some(Err(why))` when it did not (exit 1).
pub fn print(store: Option<Result<String, String>>, out: Out) -> Result<u8, Failure> {
    let v = idalloc_server::build_info::version(None);
    let failed = matches!(store, Some(Err(_)));
    out.either(
        || {
            let mut j = json!({"version": v.version, "git_sha": v.git_sha, "api": v.api,
                               "layout": v.layout, "protocol": PROTOCOL_VERSION,
                               "runs_on_cluster_versions": [OLDEST_CLUSTER_VERSION, PROTOCOL_VERSION]});
            match &store {
                Some(Ok(s)) => j["store"] = json!(s),
                Some(Err(e)) => {
                    j["store"] = serde_json::Value::Null;
                    j["error"] = json!(e);
                }
                None => {}
            }
            j
        },
        || {
            let mut t = format!(
                "idalloc {}\ngit commit: {}\napi:        {}\nlayout:     {}\nprotocol:   \
                 {PROTOCOL_VERSION} (runs on cluster versions {OLDEST_CLUSTER_VERSION} to \
                 {PROTOCOL_VERSION})\n",
                v.version, v.git_sha, v.api, v.layout
            );
            match &store {
                Some(Ok(s)) => t.push_str(&format!("store:      {s}\n")),
                Some(Err(e)) => {
                    t.push_str(&format!("store:      unknown ({})\n", crate::render::controls(e)))
                }
                None => {}
            }
            t
        },
    )?;
    Ok(if failed { crate::fail::RUNTIME } else { crate::fail::OK })
}

/// [`print`] with the version of `store`'s server, asked within `--timeout`.
pub async fn with_store(
    settings: &Settings,
    store: &dyn Store,
    file_missing: bool,
    out: Out,
) -> Result<u8, Failure> {
    if file_missing {
        return print(
            Some(Err(format!("store file {} does not exist", settings.url.endpoint()))),
            out,
        );
    }
    let asked = tokio::time::timeout(settings.timeout, store.server_version()).await;
    let answer = match asked {
        Ok(Ok(Some(v))) => Ok(v),
        Ok(Ok(None)) => Ok("unknown".to_string()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!(
            "{} {}: no answer within {:?}",
            settings.url.kind(),
            settings.url.endpoint(),
            settings.timeout
        )),
    };
    print(Some(answer), out)
}

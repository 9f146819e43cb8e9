//! `idalloc upgrade status` and `idalloc upgrade finalize`: the store's cluster version
//! (`idalloc::cluster_version`, docs/guide/deployment.md "Upgrades").

use std::time::Duration;

use idalloc::cluster_version::{self as cv, Finalized, OLDEST_CLUSTER_VERSION, PROTOCOL_VERSION};
use idalloc::layout::Layout;
use idalloc::store::{GetRequest, KeyRange, Store};
use serde_json::json;

use crate::cli::UpgradeCommand;
use crate::commands::Out;
use crate::fail::{Failure, OK, RUNTIME};

pub async fn run(
    command: &UpgradeCommand,
    layout: &Layout,
    store: &dyn Store,
    out: Out,
) -> Result<u8, Failure> {
    match command {
        UpgradeCommand::Status => status(layout, store, out).await,
        UpgradeCommand::Finalize { grace } => finalize(layout, store, *grace, out).await,
    }
}

/// The client session records only: `P/sessions/<16 hex digits>`, which sort below `g`; the
/// service's slot records under `P/sessions/quota/` and `P/sessions/quota-pools/` sort above.
fn client_session_records(layout: &Layout) -> KeyRange {
    let start = layout.sessions_prefix();
    let mut end = start.clone();
    end.push(b'g');
    KeyRange::range(start, end)
}

async fn status(layout: &Layout, store: &dyn Store, out: Out) -> Result<u8, Failure> {
    let now = cv::read(store, layout).await?;
    let sessions = store
        .get(GetRequest::new(client_session_records(layout)).count_only())
        .await
        .map_err(idalloc::Error::from)?
        .count;
    let supported = cv::check_supported(layout, now.version);
    let pending = supported.is_ok() && now.version < PROTOCOL_VERSION;
    let grace = now.grace.map(|g| g.as_secs());
    out.either(
        || {
            json!({"prefix": layout.prefix(), "cluster_version": now.version,
                   "recorded": now.recorded, "features": cv::features(now.in_force()),
                   "grace_seconds": grace, "protocol": PROTOCOL_VERSION,
                   "runs_on": [OLDEST_CLUSTER_VERSION, PROTOCOL_VERSION],
                   "finalize_pending": pending, "client_sessions": sessions})
        },
        || {
            let recorded = if now.recorded { "" } else { " (no record: written before versions)" };
            let mut t = format!(
                "prefix:          {}\ncluster version: {}{recorded}\nfeatures:        {}\n\
                 this build:      protocol {PROTOCOL_VERSION}, runs on cluster versions \
                 {OLDEST_CLUSTER_VERSION} to {PROTOCOL_VERSION}\nclient sessions: {sessions}\n",
                layout.prefix(),
                now.version,
                match cv::features(now.in_force()) {
                    [] => "unknown to this build".to_string(),
                    known => known.join(", "),
                },
            );
            if let Some(secs) = grace {
                t.push_str(&format!(
                    "grace:           running (set to {secs}s at the finalize): the features of \
                     version {} wait for it\n",
                    now.version
                ));
            }
            match &supported {
                Err(e) => t.push_str(&format!("refused:         {e}\n")),
                Ok(()) if pending => t.push_str(&format!(
                    "pending:         once every process runs protocol {PROTOCOL_VERSION}, run \
                     `idalloc upgrade finalize`\n"
                )),
                Ok(()) => t.push_str("pending:         nothing\n"),
            }
            t
        },
    )?;
    Ok(if supported.is_ok() { OK } else { RUNTIME })
}

async fn finalize(
    layout: &Layout,
    store: &dyn Store,
    grace: Duration,
    out: Out,
) -> Result<u8, Failure> {
    let before = cv::read(store, layout).await?.version;
    let done = cv::finalize(store, layout, grace).await?;
    let (from, moved) = match done {
        Finalized::Moved { from, .. } => (from, true),
        Finalized::Already => (before, false),
    };
    // As the store holds it: whole seconds, rounded up.
    let secs = if moved { grace.as_secs() + u64::from(grace.subsec_nanos() > 0) } else { 0 };
    out.either(
        || {
            json!({"prefix": layout.prefix(), "from": from, "to": PROTOCOL_VERSION,
                   "finalized": moved, "grace_seconds": secs})
        },
        || {
            if moved && secs > 0 {
                format!(
                    "cluster version {from} -> {PROTOCOL_VERSION} at prefix {:?}: {} in force \
                     after a grace of {secs}s\n",
                    layout.prefix(),
                    cv::features(PROTOCOL_VERSION).join(", ")
                )
            } else if moved {
                format!(
                    "cluster version {from} -> {PROTOCOL_VERSION} at prefix {:?}: {} in force\n",
                    layout.prefix(),
                    cv::features(PROTOCOL_VERSION).join(", ")
                )
            } else {
                format!(
                    "cluster version is {PROTOCOL_VERSION} already at prefix {:?}\n",
                    layout.prefix()
                )
            }
        },
    )?;
    Ok(OK)
}

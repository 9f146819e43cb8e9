//! Where a new process's sync of a big pool spends its time. The sync of 3M
//! bindings took 4.0× the time of 1M; the cause is in one of three places: etcd's reads (it walks
//! its index for each page), the transfer and decoding of the records, or the cache's apply
//! (`PoolCache::replace_all`). This child process runs the first two alone, timed and with the
//! CPU of both sides, then the third on what they returned.
//!
//! The listing copies the follower's (`feed.rs`, private to the library): a probing page, then
//! sub-ranges split at the next decimal digits so that each holds about 10 pages, each read
//! with the public `list_all_at` at the probe's revision. A copy can drift from the original;
//! the sync row of the same run (the real follower) shows whether it did: its reads and
//! walked-per-returned ratio should match.

use std::time::Instant;

use idalloc::bench_api::PoolCache;
use idalloc::layout::Layout;
use idalloc::store::{list_all_at, GetRequest, KeyRange, KeyValue, Revision, Store, StoreResult};

use crate::scale::{child_figures, cpu_secs, spec, POOL};

/// The feed's `PAGES_PER_SUBRANGE`.
const PAGES_PER_SUBRANGE: i64 = 10;

/// What [`measure`] found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Phases {
    pub records: u64,
    /// The listing: wall time, and CPU of this process and of etcd during it.
    pub list_secs: f64,
    pub list_cpu_self: f64,
    pub list_cpu_etcd: f64,
    /// `replace_all` of the listing into an empty cache: wall time and this process's CPU (on a
    /// loaded machine the wall time is mostly waiting for a core).
    pub apply_secs: f64,
    pub apply_cpu: f64,
}

/// The sub-ranges the follower reads a prefix of `count` records in, at `page` records a page:
/// `prefix` split at every decimal of `digits` digits (no leading zero), `digits` the fewest
/// (at most 4) that leave about 10 pages a sub-range. One range if small.
pub fn subranges(prefix: &[u8], end: &[u8], count: i64, page: i64) -> Vec<KeyRange> {
    let parts = |digits: u32| if digits == 0 { 1 } else { 9 * 10i64.pow(digits - 1) };
    let mut digits = 0u32;
    while digits < 4 && count / parts(digits) > PAGES_PER_SUBRANGE * page {
        digits += 1;
    }
    if digits == 0 {
        return vec![KeyRange::range(prefix.to_vec(), end.to_vec())];
    }
    let lo = 10u64.pow(digits - 1);
    let mut bounds: Vec<Vec<u8>> = vec![prefix.to_vec()];
    bounds.extend((lo..lo * 10).map(|n| {
        let mut b = prefix.to_vec();
        b.extend_from_slice(n.to_string().as_bytes());
        b
    }));
    bounds.push(end.to_vec());
    bounds.windows(2).map(|w| KeyRange::range(w[0].clone(), w[1].clone())).collect()
}

async fn list(
    store: &dyn Store,
    prefix: &[u8],
    page: i64,
) -> StoreResult<(Vec<KeyValue>, Revision)> {
    let range = KeyRange::prefix(prefix.to_vec());
    let probe = store.get(GetRequest::new(range.clone()).with_limit(page)).await?;
    if !probe.more {
        return Ok((probe.kvs, probe.revision));
    }
    let mut out = Vec::with_capacity(usize::try_from(probe.count).unwrap_or(0));
    for sub in subranges(&range.key, &range.range_end, probe.count, page) {
        out.extend(list_all_at(store, &sub, page, probe.revision).await?.0);
    }
    Ok((out, probe.revision))
}

/// Child side of [`measure`]: prints the figures as JSON.
pub async fn phases_child(url: &str, page: i64, etcd_pid: &str) -> Result<(), String> {
    let store = idalloc_testkit::etcd::connect_test_store(url).await?;
    let layout = Layout::new("idalloc").map_err(|e| e.to_string())?;
    let (c0, e0) = (cpu_secs("self"), cpu_secs(etcd_pid));
    let t0 = Instant::now();
    let (kvs, rev) =
        list(&store, &layout.id_prefix(POOL), page).await.map_err(|e| format!("listing: {e}"))?;
    let list_secs = t0.elapsed().as_secs_f64();
    let delta = |a: Option<f64>, b: Option<f64>| b.zip(a).map_or(f64::NAN, |(b, a)| b - a);
    let list_cpu_self = delta(c0, cpu_secs("self"));
    let list_cpu_etcd = delta(e0, cpu_secs(etcd_pid));
    let mut cache = PoolCache::new(spec());
    let (t1, c1) = (Instant::now(), cpu_secs("self"));
    let events = cache.replace_all(&kvs, rev, |k| layout.parse_id_key(POOL, k));
    let apply_secs = t1.elapsed().as_secs_f64();
    let apply_cpu = delta(c1, cpu_secs("self"));
    std::hint::black_box(events.len());
    println!(
        "{}",
        serde_json::json!({
            "records": kvs.len(), "list_secs": list_secs, "list_cpu_self": list_cpu_self,
            "list_cpu_etcd": list_cpu_etcd, "apply_secs": apply_secs, "apply_cpu": apply_cpu,
        })
    );
    Ok(())
}

/// Runs [`phases_child`] in a fresh process (this binary with `--scale-child-phases`).
pub fn measure(url: &str, page: i64, etcd_pid: &str) -> Result<Phases, String> {
    let v = child_figures("--scale-child-phases", url, page, etcd_pid)?;
    let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    Ok(Phases {
        records: v["records"].as_u64().unwrap_or(0),
        list_secs: f("list_secs"),
        list_cpu_self: f("list_cpu_self"),
        list_cpu_etcd: f("list_cpu_etcd"),
        apply_secs: f("apply_secs"),
        apply_cpu: f("apply_cpu"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subranges_split_like_the_follower_and_cover_the_prefix_once() {
        // 1M records at pages of 1000: 90 sub-ranges would hold 11k each (> 10 pages), so the
        // split goes to three digits (900).
        let subs = subranges(b"p/", b"p0", 1_000_000, 1000);
        assert_eq!(subs.len(), 901, "three digits: 100..=999, plus the part before 100");
        assert_eq!(subs[0].key, b"p/");
        assert_eq!(subs[0].range_end, b"p/100");
        assert_eq!(subs[900].range_end, b"p0");
        assert!(subs.windows(2).all(|w| w[0].range_end == w[1].key), "contiguous");
        // Small: one range.
        assert_eq!(subranges(b"p/", b"p0", 5_000, 1000).len(), 1);
        // At most four digits, however big.
        assert_eq!(subranges(b"p/", b"p0", i64::MAX, 1000).len(), 9001);
    }
}

//! Every wire type against the exact JSON the service sends (docs/guide/api.md's shapes, with the keys
//! in the order the service writes them): parsed, then written back byte for byte. For the
//! answers the service used to build with `json!`, the value built that way must be the same JSON
//! (the same fields, names and values), so moving the service onto these types changed nothing a
//! client sees. Only key order may differ, and only inside lists: `json!` sorted the keys of the
//! structs it embedded (`{"pools":[…]}`, `{"results":[…]}`, a page's `bindings`), while the same
//! struct answered alone kept its declared order; now both keep the declared order.

use idalloc_wire::*;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::json;

/// `golden` parses as `T` and is written back unchanged.
fn round_trip<T: Serialize + DeserializeOwned + std::fmt::Debug + PartialEq>(golden: &str) -> T {
    let v: T = serde_json::from_str(golden).unwrap_or_else(|e| panic!("{golden}: {e}"));
    let back = serde_json::to_string(&v).expect("serializes");
    assert_eq!(back, golden, "{v:?}");
    v
}

/// `value` (as the service built it with `json!`) is the JSON `T` writes: equal as JSON, and
/// byte for byte where `json!` wrote the keys in sorted order at the top level.
fn same_as_json<T: Serialize>(typed: &T, value: serde_json::Value) {
    let text = serde_json::to_string(typed).expect("typed");
    let parsed: serde_json::Value = serde_json::from_str(&text).expect("parses");
    assert_eq!(parsed, value, "{text}");
    let top = |s: &str| -> Vec<String> {
        let v: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(s).expect("object");
        v.keys().cloned().collect()
    };
    // The top-level keys come out in the order `json!` wrote them (its map sorts by key).
    let mut order: Vec<(usize, String)> = top(&value.to_string())
        .into_iter()
        .map(|k| (text.find(&format!("\"{k}\":")).unwrap_or(usize::MAX), k))
        .collect();
    order.sort();
    let keys: Vec<String> = order.into_iter().map(|(_, k)| k).collect();
    assert_eq!(keys, top(&value.to_string()), "{text}");
}

const SPEC: &str = r#"{"name":"vni","min":4096,"max":16777215,"reserved":[[4096,4100]],"prefix":0,"strategy":"random","idle_grace_ms":0,"reuse_delay_ms":30000}"#;

#[test]
fn pools() {
    let spec: PoolSpecBody = round_trip(SPEC);
    assert_eq!((spec.min, spec.max, spec.reserved.clone()), (4096, 16777215, vec![(4096, 4100)]));
    let minimal: PoolSpecBody =
        serde_json::from_str(r#"{"name":"vni","min":1,"max":9}"#).expect("only three required");
    assert_eq!((minimal.prefix, minimal.strategy, minimal.reserved.len()), (0, None, 0));

    let pools: Pools = round_trip(&format!(r#"{{"pools":[{SPEC}]}}"#));
    same_as_json(&pools, json!({ "pools": [spec.clone()] }));
    round_trip::<PoolInfo>(&format!(
        r#"{{"spec":{SPEC},"capacity":16773115,"bound":2,"quarantined":1,"used":3,"free":16773112}}"#
    ));
    let d: Deleted = round_trip(r#"{"deleted":true,"pool":"vni"}"#);
    same_as_json(&d, json!({ "pool": "vni", "deleted": true }));

    let s: Swept = round_trip(
        r#"{"fence_records":3,"folded":0,"idle":1,"pool":"vni","reclaimed":[{"id":4242,"key":"tenant-blue"}]}"#,
    );
    let reclaimed: Vec<_> = [(4242u64, "tenant-blue")]
        .iter()
        .map(|(id, key)| json!({ "id": id, "key": key }))
        .collect();
    same_as_json(
        &s,
        json!({ "pool": "vni", "reclaimed": reclaimed, "idle": 1, "fence_records": 3, "folded": 0 }),
    );
}

#[test]
fn keys() {
    let one: AcquireBody = round_trip(r#"{"key":"tenant-blue","session":"00ab"}"#);
    assert_eq!((one.keys, one.holder), (None, None));
    round_trip::<AcquireBody>(r#"{"keys":["a","b"],"holder":"cfg"}"#);

    let a: Acquired = round_trip(r#"{"key":"tenant-blue","id":70211,"new":true}"#);
    let r: Released = round_trip(r#"{"key":"tenant-blue","held":true,"reclaimed":false}"#);
    let rs: Results<Acquired> =
        round_trip(r#"{"results":[{"key":"tenant-blue","id":70211,"new":true}]}"#);
    same_as_json(&rs, json!({ "results": [a] }));
    let rs: Results<Released> =
        round_trip(r#"{"results":[{"key":"tenant-blue","held":true,"reclaimed":false}]}"#);
    same_as_json(&rs, json!({ "results": [r] }));

    let k: KeyAnswer = round_trip(r#"{"id":70211,"key":"tenant-blue","pool":"vni"}"#);
    same_as_json(&k, json!({ "pool": "vni", "key": "tenant-blue", "id": 70211 }));
    let i: IdAnswer = round_trip(r#"{"id":70211,"key":"tenant-blue","pool":"vni"}"#);
    same_as_json(&i, json!({ "pool": "vni", "id": 70211, "key": "tenant-blue" }));

    let b = r#"{"id":70211,"key":"tenant-blue","holders":["session:lease-694d7b2a1c","cfg"]}"#;
    let page: BindingsPage =
        round_trip(&format!(r#"{{"bindings":[{b}],"next_after":70211,"pool":"vni"}}"#));
    let bindings = page.bindings.clone();
    same_as_json(&page, json!({ "pool": "vni", "bindings": bindings, "next_after": 70211 }));
    let last: BindingsPage = round_trip(r#"{"bindings":[],"next_after":null,"pool":"vni"}"#);
    assert_eq!(last.next_after, None);
    same_as_json(&last, json!({ "pool": "vni", "bindings": [], "next_after": null }));
}

#[test]
fn sessions_health_and_readiness() {
    round_trip::<SessionBody>(r#"{"ttl":15}"#);
    round_trip::<SessionInfo>(
        r#"{"session":"0000694d7b2a1c00ff","holder":"session:lease-694d7b2a1c","ttl":15}"#,
    );
    let k: Keepalive = round_trip(r#"{"ttl":15}"#);
    same_as_json(&k, json!({ "ttl": 15 }));
    let e: Ended = round_trip(r#"{"ended":true}"#);
    same_as_json(&e, json!({ "ended": true }));
    let s: Sessions = round_trip(
        r#"{"sessions":[{"age":3,"client":null,"holder":"session:lease-694d7b2a1c","references":2,"ttl":15}]}"#,
    );
    let list = vec![json!({
        "holder": "session:lease-694d7b2a1c",
        "client": None::<&str>,
        "ttl": 15,
        "age": 3,
        "references": 2,
    })];
    same_as_json(&s, json!({ "sessions": list }));
    round_trip::<Sessions>(
        r#"{"sessions":[{"age":0,"client":"agent-1","holder":"session:lease-1","references":0,"ttl":1}]}"#,
    );
    let h: Health = round_trip(r#"{"status":"ok"}"#);
    same_as_json(&h, json!({ "status": "ok" }));
    let r: Ready = round_trip(r#"{"pools":2,"revision":17,"status":"ready"}"#);
    same_as_json(&r, json!({ "status": "ready", "revision": 17, "pools": 2 }));
}

#[test]
fn watch_events() {
    // docs/guide/api.md's example stream.
    let c: Change = round_trip(r#"{"id":4242,"key":"tenant-blue","revision":17}"#);
    same_as_json(&c, json!({"id": 4242, "key": "tenant-blue", "revision": 17}));
    let s: Synced = round_trip(r#"{"bindings":1,"revision":17}"#);
    same_as_json(&s, json!({"revision": 17, "bindings": 1}));
    let lagged: ErrorEvent =
        round_trip(r#"{"from_revision":18,"kind":"lagged","message":"behind","revision":17}"#);
    same_as_json(
        &lagged,
        json!({"kind": "lagged", "message": "behind", "revision": 17, "from_revision": 18}),
    );
    let gone: ErrorEvent = round_trip(r#"{"kind":"gone","message":"pool deleted"}"#);
    same_as_json(&gone, json!({"kind": "gone", "message": "pool deleted"}));
}

#[test]
fn errors() {
    round_trip::<ErrorBody>(r#"{"kind":"pool_not_found","message":"pool \"vni\" not found"}"#);
    let gone: ErrorBody = round_trip(r#"{"kind":"gone","message":"too old","revision":17}"#);
    assert_eq!(gone.revision, Some(17));
    let mut kinds = errors::kind::ALL.to_vec();
    kinds.sort_unstable();
    kinds.dedup();
    assert_eq!(kinds.len(), errors::kind::ALL.len(), "a kind listed twice");
    assert!(!errors::kind::ALL.contains(&errors::kind::LAGGED), "lagged is an event's kind only");
}

/// Requests refuse unknown fields (a misspelt field is an error, naming the field); answers the
/// client reads are parsed as the service writes them.
#[test]
fn requests_refuse_unknown_fields() {
    let e = serde_json::from_str::<AcquireBody>(r#"{"key":"a","holdr":"x"}"#).unwrap_err();
    assert!(e.to_string().contains("holdr"), "{e}");
    let e = serde_json::from_str::<SessionBody>(r#"{"ttl":15,"ttl_ms":1}"#).unwrap_err();
    assert!(e.to_string().contains("ttl_ms"), "{e}");
    let e = serde_json::from_str::<PoolSpecBody>(r#"{"name":"v","min":1,"max":2,"maxx":3}"#)
        .unwrap_err();
    assert!(e.to_string().contains("maxx"), "{e}");
}

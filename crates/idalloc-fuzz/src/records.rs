//! Target `records`: the decoders of the store's records (`idalloc::layout` record names and
//! values, `idalloc::records` snapshots and spec records), fed names and values no allocator
//! wrote, as a damaged or hand-edited store holds them.
//!
//! Properties: every decoder that accepts something gives back exactly what the encoder writes
//! for the result (one record, one spelling: `encode(decode(v)) == v`, so `decode(encode(x)) ==
//! x` too); the record kinds are disjoint; a snapshot files every record of the pool exactly once
//! (typed, or as unreadable); a spec record is used only when it names its own pool, and its spec
//! round-trips through JSON.

use std::collections::BTreeMap;

use idalloc::layout::{encode_id, parse_id_value, IdRecord, Layout};
use idalloc::records::{parse_spec, PoolSnapshot, SpecProblemKind};
use idalloc::store::KeyValue;
use idalloc::PoolSpec;

use crate::input::Input;

const POOL: &str = "p";

/// Where a fuzzed record name starts: the first byte of each name picks one of these, so that
/// the fuzzer reaches the parsers behind each prefix without having to guess it.
fn name_prefixes(l: &Layout) -> [Vec<u8>; 8] {
    [
        Vec::new(),
        l.pool_data_prefix(POOL),
        l.id_prefix(POOL),
        l.key_prefix(POOL),
        l.refs_prefix(POOL),
        l.holders_prefix(POOL),
        l.pools_prefix(),
        l.fence_floor_key(POOL),
    ]
}

/// Input: records, each `<prefix selector byte><name length byte><name><value length byte><value>`.
pub fn check(data: &[u8]) {
    let l = Layout::default();
    let prefixes = name_prefixes(&l);
    let mut input = Input::new(data);
    let mut kvs = Vec::new();
    while !input.is_empty() {
        let mut key = prefixes[usize::from(input.byte()) % prefixes.len()].clone();
        let n = usize::from(input.byte());
        key.extend_from_slice(input.bytes(n));
        let n = usize::from(input.byte());
        let value = input.bytes(n).to_vec();
        let rev = kvs.len() as i64 + 1;
        kvs.push(KeyValue {
            key,
            value,
            create_revision: rev,
            mod_revision: rev,
            version: 1,
            lease: 0,
        });
    }
    for kv in &kvs {
        check_value(&kv.value);
        check_name(&l, &kv.key);
        check_spec_record(&l, kv);
    }
    check_snapshot(&l, &kvs);
}

fn check_value(value: &[u8]) {
    if let Some(rec) = IdRecord::decode(value) {
        assert_eq!(rec.encode(), value, "ID record value {value:?} decodes to {rec:?}");
        assert!(!rec.key().is_empty(), "an ID record names a key");
    }
    if let Some(id) = parse_id_value(value) {
        assert_eq!(encode_id(id), value, "ID value {value:?} parses to {id}");
    }
}

/// Each record-name parser that accepts `name` gives back exactly `name` when its result is laid
/// out again, and at most one kind accepts it.
fn check_name(l: &Layout, name: &[u8]) {
    let mut kinds = Vec::new();
    if let Some(id) = l.parse_id_key(POOL, name) {
        assert_eq!(l.id_key(POOL, id), name, "ID record name");
        kinds.push("id");
    }
    if let Some(key) = l.parse_key_key(POOL, name) {
        assert_eq!(l.key_key(POOL, &key), name, "key record name");
        kinds.push("key");
    }
    if let Some((key, holder)) = l.parse_ref_key(POOL, name) {
        assert_eq!(l.ref_key(POOL, &key, &holder), name, "reference record name");
        kinds.push("ref");
    }
    if let Some(holder) = l.parse_holder_key(POOL, name) {
        assert_eq!(l.holder_key(POOL, &holder), name, "holder fence record name");
        kinds.push("holder");
    }
    if let Some(pool) = l.parse_pool_spec_key(name) {
        assert_eq!(l.pool_spec_key(&pool), name, "spec record name");
        assert!(idalloc::pool::validate_pool_name(&pool).is_ok(), "spec of pool {pool:?}");
        kinds.push("spec");
    }
    assert!(kinds.len() <= 1, "record name {name:?} parses as {kinds:?}");
}

fn check_spec_record(l: &Layout, kv: &KeyValue) {
    match parse_spec(l, kv) {
        Ok(spec) => {
            assert_eq!(l.parse_pool_spec_key(&kv.key).as_deref(), Some(spec.name()));
            assert_eq!(PoolSpec::from_json(&spec.to_json()).as_ref(), Ok(&spec), "round trip");
        }
        Err(problem) => {
            let record = String::from_utf8_lossy(&kv.key);
            assert_eq!(problem.record, record, "the problem names its record");
            assert!(problem.to_string().contains(&format!("{record:?}")), "{problem}");
            if let SpecProblemKind::NameMismatch { spec_name } = &problem.kind {
                assert_ne!(problem.pool.as_deref(), Some(spec_name.as_str()));
            }
        }
    }
}

/// Every distinct record under the pool's data prefix lands in exactly one place.
fn check_snapshot(l: &Layout, kvs: &[KeyValue]) {
    let data = l.pool_data_prefix(POOL);
    // A listing has each name once (the last write wins, as in the store).
    let distinct: BTreeMap<&[u8], &KeyValue> =
        kvs.iter().map(|kv| (kv.key.as_slice(), kv)).collect();
    let listing: Vec<KeyValue> = distinct.values().map(|kv| (*kv).clone()).collect();
    let s = PoolSnapshot::parse(l, POOL, &listing, 99);
    let ours = listing.iter().filter(|kv| kv.key.starts_with(&data)).count();
    let refs: usize = s.refs.values().map(|m| m.len()).sum();
    let filed = s.ids.len()
        + s.keys.len()
        + refs
        + s.fences.len()
        + usize::from(s.fence_floor.is_some())
        + s.unreadable.len();
    assert_eq!(filed, ours, "records of the pool filed {filed} times, listed {ours}");
    for (id, e) in &s.ids {
        let kv = distinct[l.id_key(POOL, *id).as_slice()];
        assert_eq!(e.record, IdRecord::decode(&kv.value), "ID {id}");
    }
    for u in &s.unreadable {
        assert!(u.name.starts_with(&data), "unreadable record outside the pool: {:?}", u.name);
    }
}

//! Validation of what a remote sends: every binding is checked (ID in the remote's declared
//! space, valid key, user validators) before a view shows it; remote names are checked too.

use std::sync::Arc;

use crate::error::{Error, Input, Result};
use crate::layout::IdRecord;
use crate::pool::validate_key;
use crate::store::{KeyValue, WatchEvent};

/// Checks one remote binding `(id, key)`; `Err` names why it is rejected.
pub type Validator = Arc<dyn Fn(u64, &str) -> std::result::Result<(), String> + Send + Sync>;

/// The built-in checks, then `validators`.
pub fn validate_entry(
    space: (u64, u64),
    validators: &[Validator],
    id: u64,
    key: &str,
) -> std::result::Result<(), String> {
    if id < space.0 || id > space.1 {
        return Err(format!(
            "ID {id:#x} is outside the remote pool's ID space [{:#x}, {:#x}]",
            space.0, space.1
        ));
    }
    validate_key(key).map_err(|e| e.to_string())?;
    for v in validators {
        v(id, key)?;
    }
    Ok(())
}

/// What `check` makes of one record: `None` if it is kept as is, `Some(reason)` if it is a
/// binding that fails validation. Tombstones and unreadable records are not bindings: the cache
/// never shows them, so they pass.
fn rejects(
    kv: &KeyValue,
    parse_id: &impl Fn(&[u8]) -> Option<u64>,
    check: &impl Fn(u64, &str) -> std::result::Result<(), String>,
) -> Option<String> {
    let id = parse_id(&kv.key)?;
    match IdRecord::decode(&kv.value) {
        Some(IdRecord::Bound(key)) => check(id, &key).err(),
        _ => None,
    }
}

/// A listing without the bindings that fail validation, and those reasons.
pub(crate) fn screen_listing(
    kvs: &[KeyValue],
    parse_id: impl Fn(&[u8]) -> Option<u64>,
    check: impl Fn(u64, &str) -> std::result::Result<(), String>,
) -> (Vec<KeyValue>, Vec<String>) {
    let mut kept = Vec::with_capacity(kvs.len());
    let mut dropped = Vec::new();
    for kv in kvs {
        match rejects(kv, &parse_id, &check) {
            None => kept.push(kv.clone()),
            Some(why) => dropped.push(why),
        }
    }
    (kept, dropped)
}

/// A watch event as the view applies it: a binding that fails validation becomes a delete of its
/// ID (whatever the view showed there before is no longer true either).
pub(crate) fn screen_event(
    ev: &WatchEvent,
    parse_id: impl Fn(&[u8]) -> Option<u64>,
    check: impl Fn(u64, &str) -> std::result::Result<(), String>,
) -> (WatchEvent, Option<String>) {
    match ev {
        WatchEvent::Put(kv) => match rejects(kv, &parse_id, &check) {
            None => (ev.clone(), None),
            Some(why) => {
                let del = KeyValue { value: Vec::new(), version: 0, lease: 0, ..kv.clone() };
                (WatchEvent::Delete(del), Some(why))
            }
        },
        WatchEvent::Delete(_) => (ev.clone(), None),
    }
}

/// Checks a remote's name: like a pool name, and not `local`.
pub fn validate_remote_name(name: &str) -> Result<()> {
    crate::pool::validate_pool_name(name).map_err(|_| {
        Error::invalid_str(
            Input::Options,
            "remote name",
            name,
            "[a-z0-9][a-z0-9._-]{0,62}, not \"local\"",
        )
    })?;
    if name == "local" {
        return Err(Error::invalid_str(
            Input::Options,
            "remote name",
            name,
            "\"local\" names this allocator's own store; pick another name",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::IdRecord;

    fn kv(id: u64, rec: IdRecord) -> KeyValue {
        KeyValue {
            key: id.to_string().into_bytes(),
            value: rec.encode(),
            create_revision: 1,
            mod_revision: 1,
            version: 1,
            lease: 0,
        }
    }

    fn parse(k: &[u8]) -> Option<u64> {
        std::str::from_utf8(k).ok()?.parse().ok()
    }

    #[test]
    fn entries_outside_the_declared_space_or_refused_by_a_validator_are_dropped() {
        let space = (0x20001, 0x2ffff);
        let no_k: Validator = Arc::new(|_, key: &str| {
            if key.starts_with('k') {
                Err(format!("key {key:?} starts with k"))
            } else {
                Ok(())
            }
        });
        assert!(validate_entry(space, &[], 0x20005, "a").is_ok());
        assert!(validate_entry(space, &[], 0x10005, "a").expect_err("prefix").contains("0x10005"));
        assert!(validate_entry(space, &[], 0x30000, "a").is_err());
        assert!(validate_entry(space, &[], 0x20005, "").is_err());
        assert!(validate_entry(space, std::slice::from_ref(&no_k), 0x20005, "kk").is_err());

        let listing = vec![
            kv(0x20001, IdRecord::Bound("a".into())),
            kv(0x10001, IdRecord::Bound("b".into())),
            kv(0x20002, IdRecord::Bound("kk".into())),
            kv(0x10002, IdRecord::Tombstone("t".into())),
        ];
        let check = |id, key: &str| validate_entry(space, std::slice::from_ref(&no_k), id, key);
        let (kept, dropped) = screen_listing(&listing, parse, check);
        assert_eq!(kept, vec![listing[0].clone(), listing[3].clone()]);
        assert_eq!(dropped.len(), 2);

        // A put that fails turns into a delete of its ID; a valid one passes untouched.
        let bad = WatchEvent::Put(kv(0x20003, IdRecord::Bound("kx".into())));
        let (ev, why) = screen_event(&bad, parse, check);
        assert!(matches!(ev, WatchEvent::Delete(ref d) if d.key == b"131075".to_vec()));
        assert!(why.is_some());
        let good = WatchEvent::Put(kv(0x20003, IdRecord::Bound("x".into())));
        assert_eq!(screen_event(&good, parse, check), (good.clone(), None));
    }

    #[test]
    fn remote_names() {
        assert!(validate_remote_name("cluster-b").is_ok());
        assert!(validate_remote_name("local").is_err());
        assert!(validate_remote_name("B").is_err());
        assert!(validate_remote_name("").is_err());
    }
}

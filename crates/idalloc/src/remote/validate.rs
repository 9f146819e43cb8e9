//! Validation of what a remote sends: every binding is checked (ID in the remote's declared
//! space, valid key, user validators) before a view shows it, and every removal of a binding the
//! view shows is put to the user validators too; remote names are checked as well.
//!
//! A rejected upsert is dropped: the binding is not shown, and what the view showed at that ID is
//! no longer true either, so it goes (a removal, itself put to the validators). A rejected delete
//! is skipped: the view keeps showing the binding, until a later change or listing removes it
//! with the validators' consent. That is what Cilium's cache validators do (a rejected event is
//! skipped, delete or not), and the point of asking about deletes: a remote must not be able to
//! make bindings vanish that a validator vouches for.

use std::sync::Arc;

use crate::error::{Error, Input, Result};
use crate::layout::IdRecord;
use crate::pool::validate_key;
use crate::store::{KeyValue, WatchEvent};

/// The kind of change a [`Validator`] is asked about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChangeKind {
    /// The remote binds `id` to `key` (in a listing or a watch event), which the view would show.
    Upsert,
    /// The view shows `id` bound to `key` and the remote no longer has that binding (deleted,
    /// tombstoned, absent from a re-listing, or replaced by a binding that was rejected).
    Delete,
}

/// Checks one change of a remote view `(kind, id, key)`; `Err` names why it is rejected. A
/// rejected upsert is not shown; a rejected delete keeps the binding shown (module docs).
/// Removals the view makes itself (`remove_remote`, `stale_ttl`, a refused re-created spec) are
/// not asked. Validators that only care about what is shown can use [`upserts_only`].
pub type Validator =
    Arc<dyn Fn(ChangeKind, u64, &str) -> std::result::Result<(), String> + Send + Sync>;

/// A validator of upserts only, from a check of `(id, key)` (the signature validators had before
/// they were told the kind of change): deletes pass.
pub fn upserts_only(
    check: impl Fn(u64, &str) -> std::result::Result<(), String> + Send + Sync + 'static,
) -> Validator {
    Arc::new(move |kind, id, key| match kind {
        ChangeKind::Upsert => check(id, key),
        ChangeKind::Delete => Ok(()),
    })
}

/// Asks `validators` whether the view may stop showing `id` bound to `key`. No built-in check:
/// the binding passed them when it was shown.
pub fn validate_delete(
    validators: &[Validator],
    id: u64,
    key: &str,
) -> std::result::Result<(), String> {
    for v in validators {
        v(ChangeKind::Delete, id, key)?;
    }
    Ok(())
}

/// The built-in checks, then `validators`, of an upsert.
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
        v(ChangeKind::Upsert, id, key)?;
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

/// Whether `ev` removes the binding the view shows at its ID: a delete, or a put of anything but
/// a binding (a tombstone, an unreadable value). A put of another key is an upsert.
fn removes(ev: &WatchEvent) -> bool {
    match ev {
        WatchEvent::Delete(_) => true,
        WatchEvent::Put(kv) => !matches!(IdRecord::decode(&kv.value), Some(IdRecord::Bound(_))),
    }
}

/// A (screened) watch event as the view applies it when it would remove the binding `shown` at
/// ID `id`: `check` (the delete validators) refusing, it becomes a put of the binding as shown,
/// which keeps it (and still advances the view's revision), with the reason.
pub(crate) fn screen_delete(
    ev: WatchEvent,
    id: Option<u64>,
    shown: Option<&str>,
    check: impl Fn(u64, &str) -> std::result::Result<(), String>,
) -> (WatchEvent, Option<String>) {
    let (Some(id), Some(shown)) = (id, shown) else { return (ev, None) };
    if !removes(&ev) {
        return (ev, None);
    }
    match check(id, shown) {
        Ok(()) => (ev, None),
        Err(why) => {
            let keep = KeyValue {
                value: IdRecord::Bound(shown.to_string()).encode(),
                version: ev.kv().version.max(1),
                ..ev.kv().clone()
            };
            (WatchEvent::Put(keep), Some(refused_delete(id, shown, &why)))
        }
    }
}

fn refused_delete(id: u64, key: &str, why: &str) -> String {
    format!("the delete of ID {id:#x} (key {key:?}) was refused, the binding is kept: {why}")
}

/// A (screened) listing as the view applies it: each binding of `shown` the listing would remove
/// (no binding at its ID) is put to `check` (the delete validators); refused, the listing gets the
/// binding as shown instead of whatever it had at that ID, so the view keeps it. Returns the
/// reasons.
pub(crate) fn keep_refused_deletes(
    listing: &mut Vec<KeyValue>,
    shown: &[(u64, String)],
    parse_id: impl Fn(&[u8]) -> Option<u64>,
    id_key: impl Fn(u64) -> Vec<u8>,
    check: impl Fn(u64, &str) -> std::result::Result<(), String>,
) -> Vec<String> {
    let bound: std::collections::HashSet<u64> = listing
        .iter()
        .filter(|kv| matches!(IdRecord::decode(&kv.value), Some(IdRecord::Bound(_))))
        .filter_map(|kv| parse_id(&kv.key))
        .collect();
    let mut why = Vec::new();
    for (id, key) in shown {
        if bound.contains(id) {
            continue;
        }
        if let Err(e) = check(*id, key) {
            listing.retain(|kv| parse_id(&kv.key) != Some(*id));
            listing.push(KeyValue {
                key: id_key(*id),
                value: IdRecord::Bound(key.clone()).encode(),
                create_revision: 0,
                mod_revision: 0,
                version: 1,
                lease: 0,
            });
            why.push(refused_delete(*id, key, &e));
        }
    }
    why
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
        let no_k: Validator = upserts_only(|_, key: &str| {
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
    fn a_refused_delete_keeps_the_binding_shown() {
        let no_keep = |_: u64, key: &str| {
            if key.starts_with("keep") {
                Err("vouched for".to_string())
            } else {
                Ok(())
            }
        };
        let del = WatchEvent::Delete(KeyValue {
            value: Vec::new(),
            ..kv(7, IdRecord::Bound("x".into()))
        });
        // Refused: the delete becomes a put of the binding as shown.
        let (ev, why) = screen_delete(del.clone(), Some(7), Some("keep-a"), no_keep);
        assert!(
            matches!(&ev, WatchEvent::Put(p) if IdRecord::decode(&p.value) == Some(IdRecord::Bound("keep-a".into())))
        );
        assert!(why.expect("a reason").contains("vouched for"));
        // Accepted, or nothing shown there: unchanged.
        assert_eq!(
            screen_delete(del.clone(), Some(7), Some("other"), no_keep),
            (del.clone(), None)
        );
        assert_eq!(screen_delete(del.clone(), Some(7), None, no_keep), (del, None));
        // A tombstone removes the binding too; a put of another key is an upsert, not asked.
        let tomb = WatchEvent::Put(kv(7, IdRecord::Tombstone("keep-a".into())));
        assert!(screen_delete(tomb, Some(7), Some("keep-a"), no_keep).1.is_some());
        let moved = WatchEvent::Put(kv(7, IdRecord::Bound("new".into())));
        assert_eq!(screen_delete(moved.clone(), Some(7), Some("keep-a"), no_keep), (moved, None));

        // A listing without 1 (refused), without 2 (accepted), 3 as a tombstone (refused), 4 rebound.
        let shown = vec![
            (1, "keep-1".to_string()),
            (2, "go-2".to_string()),
            (3, "keep-3".to_string()),
            (4, "keep-4".to_string()),
        ];
        let mut listing =
            vec![kv(3, IdRecord::Tombstone("keep-3".into())), kv(4, IdRecord::Bound("y".into()))];
        let why = keep_refused_deletes(
            &mut listing,
            &shown,
            parse,
            |id| id.to_string().into_bytes(),
            no_keep,
        );
        assert_eq!(why.len(), 2);
        let mut got: Vec<(u64, Option<IdRecord>)> = listing
            .iter()
            .map(|kv| (parse(&kv.key).expect("id"), IdRecord::decode(&kv.value)))
            .collect();
        got.sort_by_key(|(id, _)| *id);
        assert_eq!(
            got,
            vec![
                (1, Some(IdRecord::Bound("keep-1".into()))),
                (3, Some(IdRecord::Bound("keep-3".into()))),
                (4, Some(IdRecord::Bound("y".into()))),
            ]
        );
    }

    #[test]
    fn validators_are_told_the_kind_of_change() {
        let v: Validator = Arc::new(|kind, _, _: &str| match kind {
            ChangeKind::Upsert => Ok(()),
            ChangeKind::Delete => Err("no deletes".into()),
        });
        let vs = std::slice::from_ref(&v);
        assert!(validate_entry((1, 10), vs, 5, "k").is_ok());
        assert_eq!(validate_delete(vs, 5, "k"), Err("no deletes".to_string()));
        // Old-style checks of (id, key) judge upserts only.
        let old =
            upserts_only(|_, key: &str| if key == "bad" { Err("bad".into()) } else { Ok(()) });
        assert!(validate_entry((1, 10), std::slice::from_ref(&old), 5, "bad").is_err());
        assert!(validate_delete(std::slice::from_ref(&old), 5, "bad").is_ok());
    }

    #[test]
    fn remote_names() {
        assert!(validate_remote_name("cluster-b").is_ok());
        assert!(validate_remote_name("local").is_err());
        assert!(validate_remote_name("B").is_err());
        assert!(validate_remote_name("").is_err());
    }
}

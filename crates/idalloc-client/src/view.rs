//! The client's view of one pool, fed by the service's watch (`GET /v1/pools/{pool}/watch`).
//!
//! Pure: the messages of the stream in ([`Msg`], parsed from the SSE event's name, data and id),
//! the bindings and the library's [`Event`]s out. The stream's I/O and failover are in
//! `watch.rs`.
//!
//! A stream opened without a revision starts with the pool's bindings as of one revision R, then
//! `synced` with id R. The view collects that listing apart and swaps it in whole at `synced`,
//! with an `Upsert` or `Delete` event for every difference from what it held: a re-list (after a
//! 410 `gone`, a failover to a replica whose history does not reach back far enough, or a
//! pool re-created) leaves the view equal to the listing, emits only what changed, and until it is
//! complete the old view keeps answering. A stream resumed from revision M sends the changes
//! after M; the view applies them as they come. Every SSE id is a revision whose changes the view
//! has all of, so it is what a resumed stream sends as `Last-Event-ID`.

use std::collections::HashMap;

use idalloc::Event;
use idalloc_wire::errors::kind;
use idalloc_wire::{Change, ErrorEvent, SpecChange, Synced};

/// One message of the watch stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Msg {
    Upsert {
        id: u64,
        key: String,
    },
    Delete {
        id: u64,
        key: String,
    },
    /// The bindings before it are the whole pool as of `revision`.
    Synced {
        revision: i64,
    },
    /// This stream fell behind; resume after `revision`.
    Lagged {
        revision: i64,
    },
    /// The pool was deleted or re-created: watch it again from scratch.
    Gone,
    /// The pool was resized: the spec now in force.
    Spec(Box<idalloc::PoolSpec>),
    /// A comment, or an event this client does not know (ignored).
    Other,
}

/// Parses one SSE event (its `event` name and `data`). `Err` names what is wrong.
pub(crate) fn parse(event: &str, data: &str) -> Result<Msg, String> {
    let bad = |e: serde_json::Error| format!("{event} event with data {data}: {e}");
    Ok(match event {
        "upsert" => {
            let c: Change = serde_json::from_str(data).map_err(bad)?;
            Msg::Upsert { id: c.id, key: c.key }
        }
        "delete" => {
            let c: Change = serde_json::from_str(data).map_err(bad)?;
            Msg::Delete { id: c.id, key: c.key }
        }
        "synced" => {
            Msg::Synced { revision: serde_json::from_str::<Synced>(data).map_err(bad)?.revision }
        }
        "spec" => {
            let c: SpecChange = serde_json::from_str(data).map_err(bad)?;
            let spec = crate::api::to_spec(&c.spec)
                .map_err(|e| format!("{event} event with data {data}: {e}"))?;
            Msg::Spec(Box::new(spec))
        }
        "error" => {
            let e: ErrorEvent = serde_json::from_str(data).map_err(bad)?;
            match (e.kind.as_str(), e.revision) {
                (kind::LAGGED, Some(revision)) => Msg::Lagged { revision },
                _ => Msg::Gone,
            }
        }
        _ => Msg::Other,
    })
}

/// The bindings of one pool, both ways.
#[derive(Debug, Default)]
pub(crate) struct View {
    by_key: HashMap<String, u64>,
    by_id: HashMap<u64, String>,
    /// The last revision the view has all the changes of (0: none yet).
    revision: i64,
    /// True once a listing was swapped in.
    synced: bool,
    /// The listing being received (a stream opened without a revision, before its `synced`).
    listing: Option<HashMap<u64, String>>,
}

impl View {
    pub fn get(&self, key: &str) -> Option<u64> {
        self.by_key.get(key).copied()
    }

    pub fn key_of(&self, id: u64) -> Option<String> {
        self.by_id.get(&id).cloned()
    }

    /// Every binding, sorted by ID.
    pub fn snapshot(&self) -> Vec<(u64, String)> {
        let mut v: Vec<(u64, String)> = self.by_id.iter().map(|(i, k)| (*i, k.clone())).collect();
        v.sort_unstable();
        v
    }

    /// The revision to resume from (`Last-Event-ID`), or `None` to list afresh.
    pub fn resume_from(&self) -> Option<i64> {
        (self.synced && self.revision > 0).then_some(self.revision)
    }

    /// A stream is about to open: with `resume` false it lists the pool, and the view collects
    /// the listing apart. Drops any half-received listing of an earlier stream.
    pub fn opening(&mut self, resume: bool) {
        self.listing = if resume { None } else { Some(HashMap::new()) };
    }

    /// The stream must be opened afresh (410 `gone`, or the pool was deleted or re-created): the
    /// next stream lists, and the view keeps answering until that listing is complete.
    pub fn forget_revision(&mut self) {
        self.revision = 0;
        self.synced = false;
    }

    /// Applies one message and the SSE id that came with it (empty if none); returns the events
    /// to publish.
    pub fn apply(&mut self, msg: Msg, sse_id: &str) -> Vec<Event> {
        let mut out = Vec::new();
        match msg {
            Msg::Upsert { id, key } => match &mut self.listing {
                Some(l) => {
                    l.insert(id, key);
                }
                None => self.upsert(id, key, &mut out),
            },
            Msg::Delete { id, key } => match &mut self.listing {
                Some(l) => {
                    l.remove(&id);
                }
                None => self.delete(id, &key, &mut out),
            },
            Msg::Synced { revision } => {
                if let Some(l) = self.listing.take() {
                    self.swap_in(l, &mut out);
                }
                self.revision = revision;
                self.synced = true;
                out.push(Event::Synced);
            }
            Msg::Lagged { revision } => {
                if self.listing.is_none() {
                    self.revision = self.revision.max(revision);
                }
            }
            Msg::Gone => self.forget_revision(),
            Msg::Spec(spec) => out.push(Event::Spec(*spec)),
            Msg::Other => {}
        }
        // Only a resumed stream's ids move the revision: a listing's ids come with its `synced`.
        if self.listing.is_none() && self.synced {
            if let Ok(r) = sse_id.trim().parse::<i64>() {
                self.revision = self.revision.max(r);
            }
        }
        out
    }

    fn upsert(&mut self, id: u64, key: String, out: &mut Vec<Event>) {
        if self.by_id.get(&id) == Some(&key) {
            return;
        }
        // The key moved (or the ID changed hands): drop the stale halves first.
        if let Some(old_id) = self.by_key.get(&key).copied() {
            self.by_id.remove(&old_id);
        }
        if let Some(old_key) = self.by_id.insert(id, key.clone()) {
            self.by_key.remove(&old_key);
        }
        self.by_key.insert(key.clone(), id);
        out.push(Event::Upsert { id, key });
    }

    fn delete(&mut self, id: u64, key: &str, out: &mut Vec<Event>) {
        if self.by_id.get(&id).map(String::as_str) != Some(key) {
            return;
        }
        self.by_id.remove(&id);
        self.by_key.remove(key);
        out.push(Event::Delete { id, key: key.to_string() });
    }

    /// Makes the view equal to `listing`, emitting the differences.
    fn swap_in(&mut self, listing: HashMap<u64, String>, out: &mut Vec<Event>) {
        let gone: Vec<(u64, String)> = self
            .by_id
            .iter()
            .filter(|(id, key)| listing.get(id) != Some(key))
            .map(|(id, key)| (*id, key.clone()))
            .collect();
        for (id, key) in gone {
            self.delete(id, &key, out);
        }
        let mut new: Vec<(u64, String)> = listing.into_iter().collect();
        new.sort_unstable();
        for (id, key) in new {
            self.upsert(id, key, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(id: u64, key: &str) -> Msg {
        Msg::Upsert { id, key: key.into() }
    }

    #[test]
    fn a_listing_is_swapped_in_whole_at_synced_with_only_the_differences() {
        let mut v = View::default();
        v.opening(false);
        assert!(v.apply(up(1, "a"), "").is_empty(), "collected apart");
        assert_eq!(v.get("a"), None);
        v.apply(up(2, "b"), "");
        let ev = v.apply(Msg::Synced { revision: 7 }, "7");
        assert_eq!(ev.len(), 3, "{ev:?}");
        assert_eq!(
            (v.get("a"), v.key_of(2).as_deref(), v.resume_from()),
            (Some(1), Some("b"), Some(7))
        );

        // Resumed: changes apply as they come; ids move the revision.
        v.opening(true);
        v.apply(Msg::Delete { id: 1, key: "a".into() }, "");
        v.apply(up(3, "c"), "9");
        assert_eq!((v.get("a"), v.get("c"), v.resume_from()), (None, Some(3), Some(9)));

        // A re-list (after 410): the old view answers until the new listing is complete, then
        // only the differences are events.
        v.forget_revision();
        assert_eq!(v.resume_from(), None);
        v.opening(false);
        v.apply(up(2, "b"), "");
        v.apply(up(4, "d"), "");
        assert_eq!(v.get("c"), Some(3), "still answering");
        let ev = v.apply(Msg::Synced { revision: 12 }, "12");
        assert_eq!(
            ev,
            vec![
                Event::Delete { id: 3, key: "c".into() },
                Event::Upsert { id: 4, key: "d".into() },
                Event::Synced
            ]
        );
        assert_eq!(v.snapshot(), vec![(2, "b".to_string()), (4, "d".to_string())]);
    }

    #[test]
    fn a_key_that_moves_leaves_no_stale_half() {
        let mut v = View::default();
        v.opening(false);
        v.apply(Msg::Synced { revision: 1 }, "1");
        v.apply(up(1, "a"), "2");
        v.apply(up(5, "a"), "3");
        assert_eq!((v.get("a"), v.key_of(1), v.snapshot().len()), (Some(5), None, 1));
        // A delete naming another key than the ID's is stale: ignored.
        v.apply(Msg::Delete { id: 5, key: "b".into() }, "4");
        assert_eq!(v.get("a"), Some(5));
    }

    #[test]
    fn stream_messages_parse_and_bad_ones_are_named() {
        assert_eq!(parse("upsert", r#"{"id":4,"key":"k","revision":3}"#), Ok(up(4, "k")));
        assert_eq!(
            parse("synced", r#"{"revision":17,"bindings":1}"#),
            Ok(Msg::Synced { revision: 17 })
        );
        assert_eq!(
            parse("error", r#"{"kind":"lagged","message":"m","revision":5,"from_revision":6}"#),
            Ok(Msg::Lagged { revision: 5 })
        );
        assert_eq!(parse("error", r#"{"kind":"gone","message":"m"}"#), Ok(Msg::Gone));
        assert_eq!(parse("ping", "x"), Ok(Msg::Other));
        let e = parse("upsert", r#"{"id":"x"}"#).expect_err("bad");
        assert!(e.contains("upsert") && e.contains(r#"{"id":"x"}"#), "{e}");
    }

    #[test]
    fn a_spec_event_is_the_spec_now_in_force_and_a_bad_one_is_named() {
        let data = r#"{"revision":9,"spec":{"name":"p","min":1,"max":20,"reserved":[[3,4]],"prefix":0,"strategy":"random","idle_grace_ms":0,"reuse_delay_ms":0}}"#;
        let want = idalloc::PoolSpec::new("p", 1, 20).reserve(3..=4);
        assert_eq!(parse("spec", data), Ok(Msg::Spec(Box::new(want.clone()))));
        let mut v = View::default();
        assert_eq!(v.apply(Msg::Spec(Box::new(want.clone())), ""), vec![Event::Spec(want)]);
        assert_eq!(v.resume_from(), None, "a spec event moves no revision");
        // A spec the library would refuse (min above max) is named, not taken.
        let bad = r#"{"revision":9,"spec":{"name":"p","min":5,"max":1,"reserved":[],"prefix":0,"strategy":"random","idle_grace_ms":0,"reuse_delay_ms":0}}"#;
        let e = parse("spec", bad).expect_err("bad");
        assert!(e.contains("spec event") && e.contains("min"), "{e}");
    }
}

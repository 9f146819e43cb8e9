//! Compaction of the embedded store's history, by request (etcd's `Compact`) and automatic.

use super::*;

impl Mvcc {
    /// etcd's `Compact`: a revision at or below the compaction point is `Compacted`, one above
    /// the current revision is `FutureRevision`.
    pub fn compact(&mut self, rev: Revision) -> StoreResult<()> {
        if rev <= self.compact_rev {
            return Err(StoreError::Compacted {
                requested: rev,
                compact_revision: self.compact_rev,
            });
        }
        if rev > self.rev {
            return Err(StoreError::FutureRevision { requested: rev, current: self.rev });
        }
        self.compact_to(rev);
        Ok(())
    }

    /// Automatic compaction: keeps at least the last `keep` revisions and compacts in batches
    /// of `keep / 8` (at least 1) so that the cost is amortised. `keep <= 0` disables it.
    pub fn auto_compact(&mut self, keep: i64) {
        if keep <= 0 {
            return;
        }
        let target = self.rev - keep;
        let batch = (keep / 8).max(1);
        if target >= 1 && target - self.compact_rev.max(0) >= batch {
            self.compact_to(target);
        }
    }

    /// Drops history before `rev`: per key, every change `<= rev` except the newest one, and that
    /// one too if it is a delete (etcd's `keyIndex.compact`). Only keys that changed since the
    /// previous compaction can have anything to drop, and the log names them. Backed, the log
    /// rows before `rev` are dropped from the backing by its owner (they are below the new
    /// compaction point it writes).
    fn compact_to(&mut self, rev: Revision) {
        let mut touched: BTreeSet<Vec<u8>> = self
            .log
            .range(..=rev)
            .flat_map(|(_, changes)| changes.iter().map(|(_, k)| k.clone()))
            .collect();
        if let Some(b) = &self.backing {
            touched.extend(b.log(self.compact_rev, rev).map(|(_, _, k)| k));
        }
        let backed = self.backing.is_some();
        for key in touched {
            let entries = if backed {
                history_in(&mut self.keys, &self.backing, &key)
            } else {
                match self.keys.get_mut(&key) {
                    Some(entries) => entries,
                    None => continue,
                }
            };
            let n = entries.partition_point(|e| e.main <= rev);
            let drop = match entries.get(n.wrapping_sub(1)) {
                Some(e) if e.rec.is_some() => n - 1,
                Some(_) => n,
                None => 0,
            };
            self.delta.removed.extend(entries.drain(..drop).map(|e| (e.main, e.sub)));
            // Backed, an emptied history stays as the mark that tells the owner to remove it.
            if entries.is_empty() && !backed {
                self.keys.remove(&key);
            }
        }
        // Keep the log at `rev` itself: a watch may start exactly at the compaction point.
        self.log = self.log.split_off(&rev);
        self.compact_rev = rev;
    }
}

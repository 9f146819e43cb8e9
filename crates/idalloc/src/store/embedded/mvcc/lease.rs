//! The embedded store's leases, as etcd's lessor: grant, keep-alive, revoke (the keys a lease
//! holds go in the same revision) and expiry by a `now` the caller passes.

use super::*;

impl Mvcc {
    /// Grants a lease. As etcd, a TTL below `min_ttl` (etcd's minimum, from its election timeout)
    /// is raised to it; above [`MAX_LEASE_TTL`] is refused.
    pub fn lease_grant(&mut self, ttl: i64, min_ttl: i64, now: Instant) -> StoreResult<Lease> {
        if ttl > MAX_LEASE_TTL {
            return Err(StoreError::InvalidRequest(format!(
                "lease TTL {ttl} s is too large (at most {MAX_LEASE_TTL} s)"
            )));
        }
        let ttl = ttl.max(min_ttl).max(1);
        let id = self.next_lease;
        self.next_lease += 1;
        let deadline = deadline_after(now, ttl);
        self.leases.insert(id, LeaseState { ttl, deadline });
        self.expiry.insert((deadline, id));
        self.delta.leases_put.push((id, ttl, deadline));
        Ok(Lease { id, ttl })
    }

    /// Renews a lease for its full TTL; `None` if it does not exist.
    pub fn lease_keep_alive(&mut self, id: LeaseId, now: Instant) -> Option<i64> {
        let lease = self.leases.get_mut(&id)?;
        self.expiry.remove(&(lease.deadline, id));
        lease.deadline = deadline_after(now, lease.ttl);
        self.expiry.insert((lease.deadline, id));
        self.delta.leases_put.push((id, lease.ttl, lease.deadline));
        Some(lease.ttl)
    }

    /// Revokes a lease, deleting its keys (sorted, as etcd's lessor does) in one revision. False
    /// if the lease does not exist.
    pub fn lease_revoke(&mut self, id: LeaseId) -> bool {
        if !self.leases.contains_key(&id) {
            return false;
        }
        let keys = self.keys_of(id);
        let Some(lease) = self.leases.remove(&id) else {
            return false;
        };
        self.expiry.remove(&(lease.deadline, id));
        self.delta.leases_removed.push(id);
        // Its attachments go from the overlay; backed, the owner drops the lease's rows.
        let attached: Vec<(LeaseId, Vec<u8>)> = self
            .lease_keys
            .range((id, Vec::new())..)
            .take_while(|((l, _), _)| *l == id)
            .map(|(k, _)| k.clone())
            .collect();
        for k in attached {
            self.lease_keys.remove(&k);
        }
        let mut w = WriteCtx { new_rev: self.rev + 1, sub: 0 };
        for key in &keys {
            if self.current(key).is_some() {
                self.record_change(key, None, &mut w);
            }
        }
        if w.sub > 0 {
            self.rev = w.new_rev;
        }
        true
    }

    /// Revokes every lease whose deadline is `<= now`, each in its own revision (as etcd revokes
    /// each expired lease with its own request). Returns how many expired.
    pub fn expire_leases(&mut self, now: Instant) -> usize {
        let mut n = 0;
        while let Some(&(deadline, id)) = self.expiry.first() {
            if deadline > now {
                break;
            }
            self.lease_revoke(id);
            n += 1;
        }
        n
    }

    /// The earliest lease deadline, if any lease exists.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.expiry.first().map(|(d, _)| *d)
    }
}

/// `now + ttl` seconds, saturating far in the future instead of overflowing the clock.
fn deadline_after(now: Instant, ttl_secs: i64) -> Instant {
    let secs = u64::try_from(ttl_secs).unwrap_or(0);
    now.checked_add(Duration::from_secs(secs))
        .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 24 * 3600)))
        .unwrap_or(now)
}

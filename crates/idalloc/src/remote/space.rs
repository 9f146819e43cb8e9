//! ID spaces: the one interval of IDs each cluster of a pool hands out, and the refusal of a
//! remote whose space meets another cluster's (the same IDs for different keys).

use crate::error::{Error, Input, Result};
use crate::pool::PoolSpec;

use super::cluster::Cluster;

/// The IDs a pool can hand out, as one inclusive interval: `prefix | raw` equals `prefix + raw`
/// because the prefix shares no bit with any raw ID (checked by `PoolSpec::validate`).
pub fn id_space(spec: &PoolSpec) -> (u64, u64) {
    (spec.apply_prefix(spec.min()), spec.apply_prefix(spec.max()))
}

/// Refuses a remote named `name` with spec `spec` if its ID space meets any of `others`.
pub fn check_overlap(name: &str, spec: &PoolSpec, others: &[(Cluster, (u64, u64))]) -> Result<()> {
    let (lo, hi) = id_space(spec);
    for (c, (olo, ohi)) in others {
        if lo <= *ohi && *olo <= hi {
            return Err(Error::invalid(
                Input::Options,
                "remote",
                name,
                format!(
                    "its pool {:?} hands out IDs [{lo:#x}, {hi:#x}], which overlap [{olo:#x}, {ohi:#x}] of cluster {c}; \
                     every cluster needs its own prefix bits (or range) so an ID names one binding",
                    spec.name()
                ),
            ));
        }
    }
    Ok(())
}

/// An ID space no ID is in (a refused view's): `lo > hi`, so it meets no other space.
pub(super) const NO_SPACE: (u64, u64) = (u64::MAX, 0);

/// The ID spaces of some clusters of a pool.
pub type Spaces = [(Cluster, (u64, u64))];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::cluster::Cluster;

    #[test]
    fn id_spaces_of_clusters_with_prefix_bits() {
        let a = PoolSpec::new("p", 1, 0xffff).prefix(1 << 16);
        let b = PoolSpec::new("p", 1, 0xffff).prefix(2 << 16);
        assert_eq!(id_space(&a), (0x10001, 0x1ffff));
        assert_eq!(id_space(&b), (0x20001, 0x2ffff));
        let others = vec![(Cluster::Local, id_space(&a))];
        assert!(check_overlap("b", &b, &others).is_ok());
        // Same prefix bits as the local pool: refused, naming both spaces and the cluster.
        let err = check_overlap("twin", &a, &others).expect_err("overlap");
        let msg = err.to_string();
        assert!(msg.contains("twin") && msg.contains("0x10001") && msg.contains("local"), "{msg}");
        // No prefix, range overlapping at one ID.
        let c = PoolSpec::new("p", 0x1ffff, 0x2ffff);
        let others = vec![(Cluster::Remote("x".into()), id_space(&a))];
        assert!(check_overlap("c", &c, &others).expect_err("touching").to_string().contains("x"));
    }
}

//! Addresses as IDs (DESIGN §14): a subnet is a pool whose range is its usable hosts, and an
//! address is `subnet base + ID`. Pure: no I/O.
//!
//! - IPv4: IDs `1 ..= 2^host_bits - 2`, so the network (ID 0) and broadcast (the last) addresses
//!   are outside the range; the subnet needs at least two host bits (`/30` or wider).
//! - IPv6: IDs `1 ..= 2^host_bits - 1` (the subnet-router anycast address, ID 0, is outside);
//!   at most 64 host bits, since an ID is a `u64` (`/64` is the widest subnet).
//! - The gateway (default: the first usable address, as host-local chooses) and every `exclude`
//!   entry are reserved IDs of the pool, so no attachment is ever given them.

use std::net::IpAddr;

use idalloc::PoolSpec;
use ipnet::IpNet;

/// One subnet: its network and how its addresses map to IDs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subnet {
    pub net: IpNet,
}

impl Subnet {
    /// Parses `subnet` in CIDR form; the address must be the network's own (`10.1.2.0/24`, not
    /// `10.1.2.5/24`: which one was meant is ambiguous).
    pub fn parse(subnet: &str) -> Result<Subnet, String> {
        let net: IpNet = subnet.parse().map_err(|_| {
            format!("subnet {subnet:?} is not a CIDR: expected e.g. 10.1.2.0/24 or fd00:1::/64")
        })?;
        if net.network() != net.addr() {
            return Err(format!(
                "subnet {subnet:?} has host bits set: its network is {}",
                net.trunc()
            ));
        }
        let host_bits = net.max_prefix_len() - net.prefix_len();
        match net {
            IpNet::V4(_) if host_bits < 2 => {
                Err(format!("subnet {subnet:?} has no usable hosts: IPv4 subnets are /30 or wider"))
            }
            IpNet::V6(_) if host_bits < 2 => {
                Err(format!("subnet {subnet:?} is too small: IPv6 subnets are /126 or wider"))
            }
            IpNet::V6(_) if host_bits > 64 => Err(format!(
                "subnet {subnet:?} has {host_bits} host bits: at most 64 (a /64 or narrower), \
                 as an address's ID is a 64-bit number"
            )),
            _ => Ok(Subnet { net }),
        }
    }

    fn host_bits(&self) -> u32 {
        u32::from(self.net.max_prefix_len() - self.net.prefix_len())
    }

    fn base(&self) -> u128 {
        to_u128(self.net.network())
    }

    /// The highest usable ID (see the module docs).
    pub fn max_id(&self) -> u64 {
        let all = if self.host_bits() == 64 { u64::MAX } else { (1u64 << self.host_bits()) - 1 };
        match self.net {
            IpNet::V4(_) => all - 1,
            IpNet::V6(_) => all,
        }
    }

    /// The address of `id`.
    pub fn address(&self, id: u64) -> IpAddr {
        from_u128(self.base() + u128::from(id), self.net.addr().is_ipv6())
    }

    /// The ID of `ip`, if `ip` is a usable address of this subnet.
    pub fn id_of(&self, ip: IpAddr) -> Option<u64> {
        if !self.net.contains(&ip) {
            return None;
        }
        let id = u64::try_from(to_u128(ip) - self.base()).ok()?;
        (1..=self.max_id()).contains(&id).then_some(id)
    }

    /// The IDs of `entry` (an address or a CIDR) inside the usable range, as one inclusive range;
    /// an error names an entry outside the subnet.
    pub fn id_range_of(&self, entry: &str) -> Result<Option<(u64, u64)>, String> {
        let outside = || format!("exclude entry {entry:?} is not inside subnet {}", self.net);
        let (lo, hi): (IpAddr, IpAddr) = if entry.contains('/') {
            let n: IpNet = entry
                .parse()
                .map_err(|_| format!("exclude entry {entry:?} is neither an address nor a CIDR"))?;
            (n.network(), n.broadcast())
        } else {
            let ip: IpAddr = entry
                .parse()
                .map_err(|_| format!("exclude entry {entry:?} is neither an address nor a CIDR"))?;
            (ip, ip)
        };
        if !self.net.contains(&lo) || !self.net.contains(&hi) {
            return Err(outside());
        }
        let off = |ip: IpAddr| u64::try_from(to_u128(ip) - self.base()).unwrap_or(u64::MAX);
        let (lo, hi) = (off(lo).max(1), off(hi).min(self.max_id()));
        Ok((lo <= hi).then_some((lo, hi)))
    }

    /// The pool spec of this subnet: range `[1, max_id]`, with `reserved` (gateway, excludes).
    pub fn spec(&self, pool: &str, reserved: &[(u64, u64)]) -> PoolSpec {
        PoolSpec::new(pool, 1, self.max_id()).reserve_all(reserved)
    }
}

fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

fn from_u128(n: u128, v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(n.into())
    } else {
        // A v4 subnet's addresses fit 32 bits: base + id <= broadcast.
        IpAddr::V4(u32::try_from(n).unwrap_or(u32::MAX).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v4_range_is_the_usable_hosts() {
        let s = Subnet::parse("10.1.2.0/24").unwrap();
        assert_eq!(s.max_id(), 254);
        assert_eq!(s.address(1).to_string(), "10.1.2.1");
        assert_eq!(s.address(254).to_string(), "10.1.2.254");
        assert_eq!(s.id_of("10.1.2.7".parse().unwrap()), Some(7));
        assert_eq!(s.id_of("10.1.2.0".parse().unwrap()), None);
        assert_eq!(s.id_of("10.1.2.255".parse().unwrap()), None);
        assert_eq!(s.id_of("10.1.3.1".parse().unwrap()), None);
        assert_eq!(s.id_range_of("10.1.2.64/30").unwrap(), Some((64, 67)));
        assert_eq!(s.id_range_of("10.1.2.0/24").unwrap(), Some((1, 254)));
        assert!(s.id_range_of("10.9.0.1").unwrap_err().contains("not inside"));
        assert!(s.id_range_of("x").unwrap_err().contains("\"x\""));
    }

    #[test]
    fn v6_slash_64_uses_the_whole_u64() {
        let s = Subnet::parse("fd00:1::/64").unwrap();
        assert_eq!(s.max_id(), u64::MAX);
        assert_eq!(s.address(u64::MAX).to_string(), "fd00:1::ffff:ffff:ffff:ffff");
        assert_eq!(s.id_of("fd00:1::5".parse().unwrap()), Some(5));
        assert!(s.spec("v6", &[(1, 1)]).validate().is_ok());
    }

    #[test]
    fn bad_subnets_name_the_value_and_rule() {
        for (bad, rule) in [
            ("10.1.2.5/24", "host bits"),
            ("10.1.2.0/31", "/30"),
            ("fd00::/48", "at most 64"),
            ("fd00::/127", "/126"),
            ("nonsense", "CIDR"),
        ] {
            let e = Subnet::parse(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")) && e.contains(rule), "{bad}: {e}");
        }
    }
}

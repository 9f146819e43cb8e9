//! "did you mean": the closest existing pool name to one that is not found, so a typo
//! (`vnii`) is fixed from the error line instead of by listing the pools. Pure.

/// The existing name closest to `missing`, if one is close enough to be a likely typo: a
/// Jaro-Winkler similarity of at least 0.8 (clap's own threshold for subcommands), or `missing`
/// being a prefix of it or it of `missing`.
pub fn closest<'a>(missing: &str, names: &'a [String]) -> Option<&'a str> {
    names
        .iter()
        .filter(|n| n.as_str() != missing)
        .map(|n| {
            let prefix = n.starts_with(missing) || missing.starts_with(n.as_str());
            let score = strsim::jaro_winkler(missing, n);
            (if prefix { score.max(0.8) } else { score }, n)
        })
        .filter(|(score, _)| *score >= 0.8)
        // Highest score; the first name on a tie (names come sorted), so the answer is stable.
        .fold(None::<(f64, &String)>, |best, (score, n)| match best {
            Some((b, _)) if b >= score => best,
            _ => Some((score, n)),
        })
        .map(|(_, n)| n.as_str())
}

/// `message` with `; did you mean "NAME"?` appended when a pool close to `missing` exists.
pub fn pool_message(message: &str, missing: &str, names: &[String]) -> String {
    match closest(missing, names) {
        Some(n) => format!("{message}; did you mean {n:?}?"),
        None => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn typos_find_the_pool() {
        let pools = names(&["ids", "vlan", "vni"]);
        assert_eq!(closest("vnii", &pools), Some("vni"));
        assert_eq!(closest("vn", &pools), Some("vni"));
        assert_eq!(closest("vlna", &pools), Some("vlan"));
        assert_eq!(closest("idz", &pools), Some("ids"));
    }

    #[test]
    fn nothing_close_suggests_nothing() {
        let pools = names(&["ids", "vlan", "vni"]);
        assert_eq!(closest("tenants", &pools), None);
        assert_eq!(closest("x", &names(&[])), None);
        assert_eq!(pool_message("pool \"q\" not found", "q", &pools), "pool \"q\" not found");
        assert_eq!(
            pool_message("pool \"vnii\" not found", "vnii", &pools),
            "pool \"vnii\" not found; did you mean \"vni\"?"
        );
    }
}

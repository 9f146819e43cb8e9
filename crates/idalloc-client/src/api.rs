//! The service's request and answer bodies (docs/guide/api.md): the wire types of `idalloc-wire`,
//! which the service itself uses, and the client's conversion of a spec body to and from the
//! library's spec (validated by the library, so a spec the service shows is checked here too).

use std::time::Duration;

use idalloc::{Error, Input, PoolSpec, Strategy};
use serde::Serialize;
use serde_json::Value;

pub(crate) use idalloc_wire::{
    AcquireBody, Acquired, BindingsPage, IdAnswer, KeyAnswer, PoolInfo, PoolSpecBody as SpecBody,
    Pools, Released, Results, SessionBody, SessionInfo, MAX_KEYS_PER_REQUEST,
};

/// A request body as the transport sends it. The wire types are strings, numbers and lists of
/// them, which always serialize; `Null` (refused by the service with 400) cannot happen.
pub(crate) fn json<T: Serialize>(body: &T) -> Value {
    serde_json::to_value(body).unwrap_or_default()
}

/// The body of an acquire or release: one key or several, of a durable holder or a session.
pub(crate) fn keys_body(keys: Keys<'_>, owner: Owner<'_>) -> Value {
    let (key, keys) = match keys {
        Keys::One(k) => (Some(k.to_string()), None),
        Keys::Many(ks) => (None, Some(ks.to_vec())),
    };
    let (session, holder) = match owner {
        Owner::Session(s) => (Some(s.to_string()), None),
        Owner::Holder(h) => (None, Some(h.to_string())),
    };
    json(&AcquireBody { key, keys, session, holder, hint: None })
}

/// `key` or `keys` of [`AcquireBody`].
pub(crate) enum Keys<'a> {
    One(&'a str),
    Many(&'a [String]),
}

/// `session` or `holder` of [`AcquireBody`].
pub(crate) enum Owner<'a> {
    Session(&'a str),
    Holder(&'a str),
}

/// A spec as the service takes and shows it.
pub(crate) fn spec_body(s: &PoolSpec) -> SpecBody {
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    SpecBody {
        name: s.name().to_string(),
        min: s.min(),
        max: s.max(),
        reserved: s.reserved().to_vec(),
        prefix: s.prefix_bits(),
        strategy: Some(s.strategy_kind().to_string()),
        idle_grace_ms: ms(s.idle_grace_duration()),
        reuse_delay_ms: ms(s.reuse_delay_duration()),
    }
}

/// The spec the service showed, validated as the library validates it.
pub(crate) fn to_spec(b: &SpecBody) -> idalloc::Result<PoolSpec> {
    let strategy = match b.strategy.as_deref() {
        None | Some("random") => Strategy::Random,
        Some("lowest") => Strategy::Lowest,
        Some(other) => {
            return Err(Error::invalid(
                Input::Options,
                "pool strategy",
                other,
                "one of \"random\", \"lowest\" (a newer service than this client?)",
            ))
        }
    };
    let spec = PoolSpec::new(b.name.clone(), b.min, b.max)
        .reserve_all(&b.reserved)
        .prefix(b.prefix)
        .strategy(strategy)
        .idle_grace(Duration::from_millis(b.idle_grace_ms))
        .reuse_delay(Duration::from_millis(b.reuse_delay_ms));
    spec.validate()?;
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_round_trip_and_an_unknown_strategy_is_named() {
        let spec = PoolSpec::new("vni", 10, 99)
            .reserve_all(&[(10, 12)])
            .strategy(Strategy::Lowest)
            .reuse_delay(Duration::from_secs(3));
        assert_eq!(to_spec(&spec_body(&spec)).ok(), Some(spec.clone()));
        let mut body = spec_body(&spec);
        body.strategy = Some("fastest".into());
        let e = to_spec(&body).expect_err("unknown strategy");
        assert!(e.to_string().contains("fastest"), "{e}");
        body.strategy = None;
        body.max = 5;
        assert!(to_spec(&body).is_err(), "max < min is refused");
    }
}

//! Durable and leased holder names never meet (docs/design-notes.md): a holder's fence
//! record `holder/<h>` is keyed by the name alone, so a durable holder named like a process's
//! leased holder would share its record, and a leased release of an in-doubt key could put the
//! record on the session lease, where it vanishes without raising the floor. The library's
//! generated leased names start with `lease:`, which durable names may not.

use idalloc::pool::LEASED_HOLDER_PREFIX;
use idalloc::store::embedded::EmbeddedStore;
use idalloc::{Allocator, AllocatorOptions, Error, Input, PoolSpec};

fn refused_as_holder<T: std::fmt::Debug>(r: Result<T, Error>, name: &str) {
    match r {
        Err(Error::InvalidInput { input: Input::Holder, value, rule, .. }) => {
            assert!(value.contains(name), "the error names {name:?}: {value}");
            assert!(rule.contains("fence record"), "the error says why: {rule}");
        }
        other => panic!("durable holder {name:?} must be refused, got {other:?}"),
    }
}

#[tokio::test]
async fn durable_holders_may_not_take_a_leased_name() {
    let alloc = Allocator::new(EmbeddedStore::memory(), AllocatorOptions::default()).unwrap();
    assert!(alloc.holder().starts_with(LEASED_HOLDER_PREFIX), "{}", alloc.holder());
    let pool = alloc.ensure_pool(&PoolSpec::new("p", 1, 100)).await.unwrap();

    // Another process's generated leased name, this process's own, and one of its sessions'.
    let own = alloc.holder().to_string();
    for name in ["lease:node-7-0badcafe", own.as_str(), &format!("{own}-c1f")] {
        refused_as_holder(pool.acquire_durable("k", name).await, name);
        refused_as_holder(pool.release_durable("k", name).await, name);
        refused_as_holder(alloc.release_durable("p", "k", name).await, name);
        for r in pool.acquire_many_durable(&["a", "b"], name).await {
            refused_as_holder(r, name);
        }
        for r in pool.release_many_durable(&["a"], name).await {
            refused_as_holder(r, name);
        }
    }
    // Nothing was written: no binding, no reference.
    assert!(pool.list().await.unwrap().is_empty());

    // A durable name outside the namespace works, next to a leased hold of the same key.
    let leased = pool.acquire("k").await.unwrap();
    let durable = pool.acquire_durable("k", "cfg").await.unwrap();
    assert_eq!(leased.id, durable.id);
    let holders = pool.list().await.unwrap().remove(0).holders;
    assert_eq!(holders.len(), 2, "{holders:?}");
}

//! The store conformance suite against a real etcd, the reference implementation.
//!
//! Uses the etcd named by `IDALLOC_TEST_ETCD` (as `scripts/test.sh` sets it), else a private etcd
//! per test if `etcd` is on `PATH`, else the tests are skipped with a notice (never under
//! `CI=true`). Cases that compact or count revisions exactly always start their own etcd.

use idalloc_testkit::conformance::etcd_factory;

idalloc_testkit::conformance_tests!(etcd, etcd_factory, paused_time = false);

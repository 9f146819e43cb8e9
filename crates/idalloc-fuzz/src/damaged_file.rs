//! Target `damaged_file`: the embedded store opened on a damaged file
//! (`idalloc::store::embedded::EmbeddedStore::open`), the regression net for the guarded redb
//! calls of `store/embedded/file.rs`.
//!
//! Property: opening any file gives a store or `StoreError::Corrupt` naming the file; a store
//! that opened reads every record back, or fails the read with `StoreError::Corrupt` naming the
//! file (the file store reads rows on demand, so damage in a row the open does not
//! read is met by the read); never a panic, never another error.
//!
//! Inputs are edits of a real store file (made once per process: records, deletes, a lease), so
//! the fuzzer works on redb's page structures rather than on bytes redb refuses at the header.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use idalloc::store::embedded::{EmbeddedOptions, EmbeddedStore};
use idalloc::store::{GetRequest, KeyRange, Store, StoreError, TxnOp, TxnRequest};

use crate::input::Input;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime")
}

fn options() -> EmbeddedOptions {
    EmbeddedOptions::builder()
        .lock_timeout(Duration::from_millis(100))
        .build()
        .expect("valid embedded options")
}

/// A scratch folder for this process, and the clean store file's bytes.
struct Base {
    dir: tempfile::TempDir,
    clean: Vec<u8>,
}

fn base() -> &'static Base {
    static BASE: OnceLock<Base> = OnceLock::new();
    BASE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("scratch folder");
        let path = dir.path().join("base.redb");
        runtime().block_on(async {
            let s = EmbeddedStore::open(&path, options()).await.expect("a new store file");
            let lease = s.lease_grant(3600).await.expect("lease");
            for i in 0..20 {
                let put = TxnOp::put(format!("idalloc/data/p/id/{i}"), format!("key {i}"));
                s.txn(TxnRequest::new().and_then([put])).await.expect("put");
            }
            let leased = TxnOp::put_on_lease("idalloc/data/p/ref/k/h", "1", lease.id);
            s.txn(TxnRequest::new().and_then([leased])).await.expect("leased put");
            for i in 0..5 {
                let del = TxnOp::delete(format!("idalloc/data/p/id/{i}"));
                s.txn(TxnRequest::new().and_then([del])).await.expect("delete");
            }
        });
        let clean = std::fs::read(&path).expect("the store file");
        Base { dir, clean }
    })
}

/// The file an input describes. First byte: 0 = the rest is the whole file (garbage, empty, a
/// foreign file); 1 = the clean file cut to the length in the next 4 bytes; otherwise the clean
/// file with patches `<offset u32 LE><length byte><bytes>` (offsets wrap at the file's length).
pub fn damaged(data: &[u8]) -> Vec<u8> {
    let clean = &base().clean;
    let mut input = Input::new(data);
    match input.byte() {
        0 => input.rest().to_vec(),
        1 => {
            let len = input.u32() as usize % (clean.len() + 1);
            clean[..len].to_vec()
        }
        _ => {
            let mut file = clean.clone();
            while !input.is_empty() {
                let at = input.u32() as usize % file.len();
                let n = usize::from(input.byte());
                let patch = input.bytes(n);
                let end = (at + patch.len()).min(file.len());
                file[at..end].copy_from_slice(&patch[..end - at]);
            }
            file
        }
    }
}

/// Input: see [`damaged`].
pub fn check(data: &[u8]) {
    // Its own file and its own panic count: runs in parallel (the corpus replay and the
    // generated cases) neither overwrite each other's file nor see each other's panics.
    let scope = crate::panics::Scope::new("damaged_file");
    let file = damaged(data);
    let path: PathBuf = base().dir.path().join(format!("{}.redb", scope.name()));
    std::fs::write(&path, &file).expect("writing the damaged file");
    // The runtime is dropped at the end of the statement: the store's writer thread, which
    // closes the file, is done.
    scope.block_on(open_damaged(&path));
    let _ = std::fs::remove_file(&path);
    assert_eq!(scope.panics(), 0, "a thread panicked opening, reading or closing the file");
}

async fn open_damaged(path: &Path) {
    match EmbeddedStore::open(path, options()).await {
        Ok(store) => {
            // Whatever opened serves reads of everything it holds, or says the file is damaged.
            let all = GetRequest::new(KeyRange::from_key(Vec::new()));
            match store.get(all).await {
                Ok(_) => {}
                Err(e) => corrupt_naming(path, e),
            }
        }
        Err(e) => corrupt_naming(path, e),
    }
}

fn corrupt_naming(path: &Path, e: StoreError) {
    match e {
        StoreError::Corrupt { path: named, reason } => {
            assert_eq!(named, path.display().to_string(), "the error names the file");
            assert!(!reason.is_empty(), "the error says what is wrong");
        }
        other => panic!("a damaged file must be Corrupt, got {other}"),
    }
}

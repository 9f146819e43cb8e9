//! `acquire --from` and `release --from` stream their input and output, so
//! their peak memory is bounded by the batches in flight, not by the input.
//!
//! The real binary, with an input ten times longer than another: the peak resident memory
//! (`VmHWM` in `/proc/<pid>/status`, read while the command writes its output) must stay within
//! 1.5 times. Keys of 1,000 bytes make the input itself weigh 2 MB and 20 MB, so a command that
//! held it (as the old ones did, twice: the bytes and the keys) would peak far higher. The pool
//! stays at 100 bindings (the inputs cycle over the same keys, or release keys nobody holds), so
//! what the pool costs does not grow with the input. A ratio, not a time.
//!
//! `acquire` runs on etcd (`IDALLOC_TEST_ETCD`, or a private one): acquiring a held key again
//! still writes a revision, and the embedded store keeps every revision's records in the
//! process until compaction, so on the file store the store itself would grow with the input.
//! `release` of keys nobody holds writes nothing and runs on the file store.
//!
//! Acquiring *new* keys grows the pool by every key; the command opens a `random` pool lazily
//! (it guesses candidates and lets the txns decide, as a lone `acquire` does), so it does not
//! hold the pool's view, which would grow with the input (`acquire_from_of_new_keys_…`).

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

/// Lines of the shorter input; the longer has ten times as many.
const SHORT: usize = 2_000;
/// Bytes per key.
const KEY_BYTES: usize = 1_000;

fn idalloc(store: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_idalloc"));
    c.args(["--store", store, "--timeout", "60s"]).env("CI", "true");
    c
}

fn key(i: usize) -> String {
    format!("{i:06}{}", "k".repeat(KEY_BYTES - 6))
}

/// Writes `lines` keys: `key(i % distinct)`.
fn input(path: &Path, lines: usize, distinct: usize, offset: usize) {
    input_of(path, lines, distinct, offset, key);
}

/// Writes `lines` keys: `key(i % distinct)`.
fn input_of(path: &Path, lines: usize, distinct: usize, offset: usize, key: fn(usize) -> String) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).expect("create input"));
    for i in 0..lines {
        writeln!(f, "{}", key(offset + i % distinct)).expect("write input");
    }
    f.flush().expect("flush input");
}

/// Peak resident memory of `/proc/<pid>/status`, in KiB, if the process still has one.
fn vm_hwm(pid: u32) -> Option<u64> {
    use idalloc_testkit::procs::{memory, Proc};
    Some(memory(Proc::Pid(pid))?.peak / 1024)
}

/// Runs `cmd`, reading its output line by line; returns the number of lines and the largest
/// peak resident memory seen (sampled every 500 lines: the peak is a high-water mark, so any
/// sample after it shows it).
fn run_measured(mut cmd: Command) -> (usize, u64) {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("run idalloc");
    let pid = child.id();
    let out = BufReader::new(child.stdout.take().expect("stdout"));
    let (mut lines, mut peak) = (0usize, 0u64);
    for line in out.lines() {
        line.expect("utf-8 output");
        lines += 1;
        if lines % 500 == 0 {
            peak = peak.max(vm_hwm(pid).unwrap_or(0));
        }
    }
    let output = child.wait_with_output().expect("wait");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(peak > 0, "no memory sample was taken");
    (lines, peak)
}

/// Runs `verb POOL --holder h --from` on the short and the long input; asserts one output line
/// per key and the long run's peak within 1.5 times the short one's.
fn compare(store: &str, prefix: &str, verb: &str, short: &Path, long: &Path) {
    let run = |path: &Path| {
        let mut c = idalloc(store);
        c.args(["--prefix", prefix, verb, "p", "--holder", "h", "--from"]).arg(path);
        run_measured(c)
    };
    let (n_short, short_peak) = run(short);
    let (n_long, long_peak) = run(long);
    assert_eq!((n_short, n_long), (SHORT, 10 * SHORT), "{verb}: one output line per key");
    eprintln!(
        "{verb} --from: {short_peak} KiB peak for {n_short} keys, {long_peak} KiB for {n_long}"
    );
    assert!(
        (long_peak as f64) <= 1.5 * short_peak as f64,
        "{verb} --from: {long_peak} KiB peak for {n_long} keys, {short_peak} KiB for {n_short}"
    );
}

fn create_pool(store: &str, prefix: &str) {
    let created = idalloc(store)
        .args(["--prefix", prefix, "pool", "create", "p", "--range", "1-100000"])
        .output()
        .expect("pool create");
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
}

#[test]
fn release_from_memory_does_not_grow_with_the_input() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = format!("file:{}", dir.path().join("s.redb").display());
    create_pool(&store, "idalloc");
    let (short, long) = (dir.path().join("short"), dir.path().join("long"));
    // Keys nobody holds, each one once.
    input(&short, SHORT, SHORT, 0);
    input(&long, 10 * SHORT, 10 * SHORT, 0);
    compare(&store, "idalloc", "release", &short, &long);
}

#[test]
fn acquire_from_memory_does_not_grow_with_the_input() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let Some(etcd) = rt.block_on(idalloc_testkit::etcd::test_etcd_endpoint()) else { return };
    let store = etcd.endpoint();
    let prefix = format!("streaming-{}", std::process::id());
    create_pool(&store, &prefix);
    let dir = tempfile::tempdir().expect("temp dir");
    let (short, long) = (dir.path().join("short"), dir.path().join("long"));
    // The same 100 keys over and over: the first pass binds them, the rest find them held.
    input(&short, SHORT, 100, 0);
    input(&long, 10 * SHORT, 100, 0);
    compare(&store, &prefix, "acquire", &short, &long);
}

/// `acquire --from` of keys that are all new, 2,000 into one empty pool and
/// 20,000 into another: the pool grows by every key (60 MB of keys of 3,000 bytes in the long
/// run), and a process that held the pool's view (the old `--from`, which watched it) grew with
/// it: 1.4 times with keys of 1,000 bytes, too close to the margin, hence the longer keys.
#[test]
fn acquire_from_of_new_keys_does_not_grow_with_the_pool() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let Some(etcd) = rt.block_on(idalloc_testkit::etcd::test_etcd_endpoint()) else { return };
    let store = etcd.endpoint();
    let prefix = format!("streaming-new-{}", std::process::id());
    let dir = tempfile::tempdir().expect("temp dir");
    let (short, long) = (dir.path().join("short"), dir.path().join("long"));
    let long_key = |i: usize| format!("{i:06}{}", "k".repeat(3 * KEY_BYTES - 6));
    input_of(&short, SHORT, SHORT, 0, long_key);
    input_of(&long, 10 * SHORT, 10 * SHORT, SHORT, long_key);
    let run = |pool: &str, path: &Path| {
        let created = idalloc(&store)
            .args(["--prefix", &prefix, "pool", "create", pool, "--range", "1-1000000"])
            .output()
            .expect("pool create");
        assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
        let mut c = idalloc(&store);
        c.args(["--prefix", &prefix, "acquire", pool, "--holder", "h", "--from"]).arg(path);
        run_measured(c)
    };
    let (n_short, short_peak) = run("short", &short);
    let (n_long, long_peak) = run("long", &long);
    assert_eq!((n_short, n_long), (SHORT, 10 * SHORT), "one output line per key");
    eprintln!("acquire --from, new keys: {short_peak} KiB peak for {n_short}, {long_peak} KiB for {n_long}");
    assert!(
        (long_peak as f64) <= 1.5 * short_peak as f64,
        "acquire --from of new keys: {long_peak} KiB peak for {n_long} keys, {short_peak} KiB for {n_short}"
    );
    // Every key got its own ID: the guesses were settled by the store.
    let listed = idalloc(&store)
        .args(["--prefix", &prefix, "--json", "pool", "show", "long"])
        .output()
        .expect("pool show");
    let shown: serde_json::Value =
        serde_json::from_slice(&listed.stdout).expect("pool show prints JSON");
    assert_eq!(shown["bound"], 10 * SHORT, "{shown}");
}

/// Runs `cmd` to the end, reading its output, while a thread samples its peak resident memory
/// every 2 ms (a high-water mark: the last sample before the process ends shows every peak
/// before it, and the peak of a listing is reached while it reads, long before the end).
/// Returns the output's lines and the largest peak seen, in KiB.
fn run_sampled(mut cmd: Command) -> (Vec<String>, u64) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("run idalloc");
    let pid = child.id();
    let (done, peak) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let sampler = {
        let (done, peak) = (done.clone(), peak.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Acquire) {
                match vm_hwm(pid) {
                    Some(kib) => peak.fetch_max(kib, Ordering::AcqRel),
                    None => break, // exited (a zombie has no memory left to read)
                };
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        })
    };
    let out = BufReader::new(child.stdout.take().expect("stdout"));
    let lines: Vec<String> = out.lines().map(|l| l.expect("utf-8 output")).collect();
    let output = child.wait_with_output().expect("wait");
    done.store(true, Ordering::Release);
    sampler.join().expect("sampler");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let peak = peak.load(Ordering::Acquire);
    assert!(peak > 0, "no memory sample was taken");
    (lines, peak)
}

/// `list` and `check` stream the pool, so their peak memory does not grow with
/// it: a pool of 2,000 bindings and one of 20,000, with keys of 3,000 bytes (each binding's
/// three records weigh about 10 KB, 200 MB for the larger pool), on etcd. The old commands held
/// every record of the pool (`list` and `check` collected the listing first) and grew with it.
/// Also checks what was printed: every binding once, in ID order, and the check clean.
#[test]
fn list_and_check_do_not_grow_with_the_pool() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let Some(etcd) = rt.block_on(idalloc_testkit::etcd::test_etcd_endpoint()) else { return };
    let store = etcd.endpoint();
    let prefix = format!("streaming-list-{}", std::process::id());
    let dir = tempfile::tempdir().expect("temp dir");
    let long_key = |i: usize| format!("{i:06}{}", "k".repeat(3 * KEY_BYTES - 6));
    let fill = |pool: &str, n: usize, offset: usize| {
        let path = dir.path().join(pool);
        input_of(&path, n, n, offset, long_key);
        let created = idalloc(&store)
            .args(["--prefix", &prefix, "pool", "create", pool, "--range", "1-1000000"])
            .output()
            .expect("pool create");
        assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
        let acquired = idalloc(&store)
            .args(["--prefix", &prefix, "acquire", pool, "--holder", "h", "--from"])
            .arg(&path)
            .output()
            .expect("acquire --from");
        assert!(acquired.status.success(), "{}", String::from_utf8_lossy(&acquired.stderr));
    };
    fill("short", SHORT, 0);
    fill("long", 10 * SHORT, SHORT);
    let measure = |args: &[&str]| {
        let mut c = idalloc(&store);
        c.args(["--prefix", &prefix]).args(args);
        run_sampled(c)
    };
    let (short_list, short_peak) = measure(&["list", "short"]);
    let (long_list, long_peak) = measure(&["list", "long"]);
    for (lines, n) in [(&short_list, SHORT), (&long_list, 10 * SHORT)] {
        assert_eq!(lines.len(), n + 1, "a header and one line per binding");
        let ids: Vec<u64> = lines[1..]
            .iter()
            .map(|l| l.split_whitespace().next().and_then(|id| id.parse().ok()).expect("an ID"))
            .collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "in ID order, each once");
        assert!(lines[1..].iter().all(|l| l.ends_with("  h")), "held by h");
    }
    eprintln!(
        "list: {short_peak} KiB peak for {SHORT} bindings, {long_peak} KiB for {}",
        10 * SHORT
    );
    let (short_check, short_check_peak) = measure(&["check", "short"]);
    let (long_check, long_check_peak) = measure(&["check", "long"]);
    for out in [&short_check, &long_check] {
        assert!(out.len() == 1 && out[0].ends_with(": no breaches"), "{out:?}");
    }
    eprintln!(
        "check: {short_check_peak} KiB peak for {SHORT} bindings, {long_check_peak} KiB for {}",
        10 * SHORT
    );
    assert!(
        (long_peak as f64) <= 1.5 * short_peak as f64,
        "list: {long_peak} KiB peak for {} bindings, {short_peak} KiB for {SHORT}",
        10 * SHORT
    );
    assert!(
        (long_check_peak as f64) <= 1.5 * short_check_peak as f64,
        "check: {long_check_peak} KiB peak for {} bindings, {short_check_peak} KiB for {SHORT}",
        10 * SHORT
    );
}

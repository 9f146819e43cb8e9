//! `acquire POOL --from FILE|-` and `release POOL --from FILE|-`: many keys in one process,
//! packed many per store request by the library's batched calls, several in flight.
//!
//! The input is read twice, one line at a time, never whole: a first pass
//! checks every line, so a bad line (exit 2, naming its number) leaves the store untouched rather
//! than half-done, and counts the keys for the progress line; the second pass reads the keys
//! again as the batches need them. Standard input (or a pipe given by name) cannot be read twice,
//! so it is first copied to an unnamed temporary file. Batches of keys run `concurrency` at a
//! time; `buffered` yields results in input order, so output line N belongs to input line N and
//! is written as soon as it and all before it are done. Memory is bounded by the batches in
//! flight, whatever the input's length. A key's error (a bad record, the store gone) stops the
//! command from starting more batches; the batches in flight finish and every key done is still
//! written, so the output is exactly what the command did (the failed keys have no line).

use std::fs::File;
use std::io::{BufReader, Seek, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use futures::stream::{self, StreamExt};
use idalloc::Pool;
use idalloc_cli::keys::{KeyLines, LineError};
use serde_json::json;

use crate::commands::Out;
use crate::fail::Failure;
use crate::progress::Progress;

/// A checked `--from` input, ready to be read again from its start.
pub struct Input {
    file: File,
    /// Keys in it (every line is one).
    keys: usize,
}

impl Input {
    /// Opens `from` (`-`: standard input), copies it to a temporary file if it cannot be read
    /// twice, and checks every line. A bad line is a usage error (exit 2) naming its number.
    pub fn open(from: &Path) -> Result<Input, Failure> {
        let mut file = if from == Path::new("-") {
            spool(&mut std::io::stdin().lock(), "stdin")?
        } else {
            let named = |e: std::io::Error| {
                Failure::usage(format!("--from {}: cannot read the file: {e}", from.display()))
            };
            let mut f = File::open(from).map_err(named)?;
            let meta = f.metadata().map_err(named)?;
            if meta.is_file() {
                f
            } else if meta.is_dir() {
                return Err(named(std::io::Error::other("it is a directory")));
            } else {
                // A pipe or device: read once, into a file that can be read again.
                spool(&mut f, &from.display().to_string())?
            }
        };
        let mut keys = 0;
        for line in KeyLines::new(BufReader::new(&file)) {
            match line {
                Ok(_) => keys += 1,
                Err(LineError::Bad(m)) => return Err(Failure::usage(m)),
                Err(LineError::Io(e)) => return Err(read_failure(from, e)),
            }
        }
        file.rewind().map_err(|e| read_failure(from, e))?;
        Ok(Input { file, keys })
    }

    /// The keys again, from the start. An error here means the file changed or failed since
    /// [`Input::open`] checked it.
    fn keys(self) -> impl Iterator<Item = Result<String, LineError>> {
        KeyLines::new(BufReader::new(self.file))
    }
}

fn read_failure(from: &Path, e: std::io::Error) -> Failure {
    Failure::runtime(format!("--from {}: reading the keys: {e}", from.display()))
}

/// Copies `input` to an unnamed temporary file (removed when closed) and returns it rewound.
fn spool(input: &mut impl std::io::Read, what: &str) -> Result<File, Failure> {
    let fail = |e: std::io::Error| {
        let dir = std::env::temp_dir();
        Failure::runtime(format!(
            "reading keys from {what} into a temporary file in {} (the directory TMPDIR names, \
             /tmp when it is unset): {e}",
            dir.display()
        ))
    };
    let mut f = tempfile::tempfile().map_err(fail)?;
    std::io::copy(input, &mut f).map_err(fail)?;
    f.rewind().map_err(fail)?;
    Ok(f)
}

/// Keys per library call: one batched request of up to 100 keys when uncontended, so
/// `concurrency` calls in flight keep that many batches in flight.
const KEYS_PER_CALL: usize = 100;

pub async fn acquire_from(
    pool: &Pool,
    from: &Path,
    holder: &str,
    concurrency: usize,
    out: Out,
) -> Result<(), Failure> {
    let name = pool.name().to_string();
    acquire_from_with(&name, from, holder, concurrency, out, |chunk| {
        let pool = pool.clone();
        let holder = holder.to_string();
        async move { pool.acquire_many_durable(&chunk, &holder).await }
    })
    .await
}

/// [`acquire_from`] with the acquire of a chunk of keys given (a store's pool, or a pool of
/// `idalloc serve` through its client): one result per key, in order.
pub async fn acquire_from_with<F, Fut>(
    name: &str,
    from: &Path,
    holder: &str,
    concurrency: usize,
    out: Out,
    call: F,
) -> Result<(), Failure>
where
    F: Fn(Vec<String>) -> Fut,
    Fut: std::future::Future<Output = Vec<idalloc::Result<idalloc::Acquired>>>,
{
    let input = Input::open(from)?;
    run_batched(input, "acquired", concurrency, call, |w, key, got: &idalloc::Acquired| {
        let v = json!({"pool": name, "key": key, "id": got.id, "new": got.new, "holder": holder});
        if let Some(doc) = out.doc(&v) {
            w.write_all(doc.as_bytes())
        } else {
            writeln!(w, "{}\t{}", got.id, crate::render::text(key))
        }
    })
    .await
}

/// `release POOL --from FILE|-`: the output of `release POOL KEY` once per key, in input order.
/// A pool that does not exist holds nothing: every key reports so, as a single release does.
pub async fn release_from(
    pool: Option<&Pool>,
    pool_name: &str,
    from: &Path,
    holder: &str,
    concurrency: usize,
    out: Out,
) -> Result<(), Failure> {
    release_from_with(pool_name, from, holder, concurrency, out, |chunk| {
        let pool = pool.cloned();
        let holder = holder.to_string();
        async move {
            match pool {
                Some(pool) => pool.release_many_durable(&chunk, &holder).await,
                None => chunk
                    .iter()
                    .map(|_| Ok(idalloc::Released { held: false, reclaimed: false }))
                    .collect(),
            }
        }
    })
    .await
}

/// [`release_from`] with the release of a chunk of keys given: one result per key, in order.
pub async fn release_from_with<F, Fut>(
    pool_name: &str,
    from: &Path,
    holder: &str,
    concurrency: usize,
    out: Out,
    call: F,
) -> Result<(), Failure>
where
    F: Fn(Vec<String>) -> Fut,
    Fut: std::future::Future<Output = Vec<idalloc::Result<idalloc::Released>>>,
{
    let input = Input::open(from)?;
    run_batched(input, "released", concurrency, call, |w, key, r: &idalloc::Released| {
        let v = json!({"pool": pool_name, "key": key, "holder": holder,
                       "released": r.held, "reclaimed": r.reclaimed});
        if let Some(doc) = out.doc(&v) {
            w.write_all(doc.as_bytes())
        } else {
            match (r.held, r.reclaimed) {
                (false, _) => writeln!(
                    w,
                    "{} held nothing for {key:?} in {pool_name}",
                    crate::render::text(holder)
                ),
                (true, true) => writeln!(w, "released; {key:?} was reclaimed"),
                // Unlike a single `release`, name the key: after a stopped batch not every
                // input line has an output line.
                (true, false) => writeln!(w, "released {key:?}"),
            }
        }
    })
    .await
}

/// Runs `call` on chunks of [`KEYS_PER_CALL`] keys, `concurrency` chunks at a time, and writes
/// one line per key in input order as soon as it and all before it are done.
///
/// A key's error stops the batch, but only from starting more chunks: the chunks already in
/// flight are awaited to the end, never dropped (a dropped call may still commit, and its keys
/// would be acquired with nobody told), and every key they did is written like any other, so the
/// output lists exactly what the command did and the caller can undo it.
/// Failed keys get no line; the error names the first one (input line and key), how many keys
/// were done, failed and never tried.
async fn run_batched<T, F, Fut>(
    input: Input,
    verb: &'static str,
    concurrency: usize,
    call: F,
    mut line: impl FnMut(&mut dyn Write, &str, &T) -> std::io::Result<()>,
) -> Result<(), Failure>
where
    F: Fn(Vec<String>) -> Fut,
    Fut: std::future::Future<Output = Vec<idalloc::Result<T>>>,
{
    let total = input.keys;
    let mut progress = Progress::stderr(verb, total);
    // Set on the first error: `buffered` asks for the next chunk only when it has room, so no
    // chunk starts after this, and the ones in flight finish.
    let stop = AtomicBool::new(false);
    // Why the input could not be read again (it changed or failed after the check).
    let reread: Mutex<Option<String>> = Mutex::new(None);
    let mut keys = input.keys();
    let mut next_first = 0usize;
    let launches = std::iter::from_fn(|| {
        if stop.load(Ordering::Relaxed) {
            return None;
        }
        let mut chunk = Vec::with_capacity(KEYS_PER_CALL);
        while chunk.len() < KEYS_PER_CALL {
            match keys.next() {
                // Only the keys counted and checked are acted on: a file that grew since (still
                // being written) stops the batch there, and the summary's counts stay right.
                Some(Ok(_)) if next_first + chunk.len() >= total => {
                    if let Ok(mut r) = reread.lock() {
                        *r = Some(format!(
                            "the input grew after its {total} keys were checked; the keys past \
                             them were not tried"
                        ));
                    }
                    stop.store(true, Ordering::Relaxed);
                    break;
                }
                Some(Ok(k)) => chunk.push(k),
                Some(Err(e)) => {
                    let why = match e {
                        LineError::Bad(m) => {
                            format!("{m} (the input changed after it was checked)")
                        }
                        LineError::Io(e) => format!("reading the keys again: {e}"),
                    };
                    if let Ok(mut r) = reread.lock() {
                        *r = Some(why);
                    }
                    stop.store(true, Ordering::Relaxed);
                    break;
                }
                None => break,
            }
        }
        if chunk.is_empty() {
            return None;
        }
        let first = next_first;
        next_first += chunk.len();
        let fut = call(chunk.clone());
        Some(async move { (first, chunk, fut.await) })
    });
    let mut results = stream::iter(launches).buffered(concurrency.max(1));

    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::new(stdout.lock());
    let mut tally = Tally::default();
    let mut write_failed: Option<std::io::Error> = None;
    while let Some((first, chunk, rs)) = results.next().await {
        for (i, (key, r)) in chunk.iter().zip(rs).enumerate() {
            tally.tried += 1;
            match r {
                Ok(got) => {
                    tally.done += 1;
                    progress.tick();
                    if write_failed.is_none() {
                        if let Err(e) = line(&mut w, key, &got) {
                            write_failed = Some(e);
                            stop.store(true, Ordering::Relaxed);
                        }
                    }
                }
                Err(e) => {
                    tally.failed += 1;
                    if e.store_did_not_answer() {
                        tally.unanswered += 1;
                    }
                    if tally.first.is_none() {
                        tally.first = Some((first + i + 1, key.clone(), e.into()));
                        stop.store(true, Ordering::Relaxed);
                    }
                }
            }
        }
    }
    drop(results);
    progress.finish();
    let write_err = crate::fail::stdout_error;
    if let Some(e) = write_failed {
        return Err(write_err(e));
    }
    w.flush().map_err(write_err)?;
    let reread = reread.lock().ok().and_then(|mut r| r.take());
    match tally.first.take() {
        None => match reread {
            None => Ok(()),
            Some(why) => Err(Failure::runtime(format!(
                "{verb} {} of {total} keys (each printed above), then stopped: --from: {why}",
                tally.done
            ))),
        },
        Some((line_no, key, f)) => Err(tally.failure(verb, total, line_no, &key, f)),
    }
}

/// What a batch did, for its error.
#[derive(Default)]
struct Tally {
    /// Keys with a result (done or failed); the rest were never tried.
    tried: usize,
    done: usize,
    failed: usize,
    /// Failed keys whose store request went unanswered: their outcome is unknown.
    unanswered: usize,
    /// The first failed key: input line, key, error.
    first: Option<(usize, String, Failure)>,
}

impl Tally {
    /// `acquired 1099 of 2000 keys (each printed above), then stopped at line 500 (key "k499"):
    /// <the error>; 900 keys not tried`, with the first error's exit code.
    fn failure(&self, verb: &str, total: usize, line_no: usize, key: &str, f: Failure) -> Failure {
        let mut message = format!(
            "{verb} {} of {total} keys (each printed above), then stopped at line {line_no} \
             (key {key:?}): {}",
            self.done, f.message
        );
        if self.failed > 1 {
            message.push_str(&format!("; {} more keys failed", self.failed - 1));
        }
        // Checked: an input that grew between the passes (`--from` a file still being written)
        // has more keys tried than counted at first.
        let untried = total.saturating_sub(self.tried);
        if untried > 0 {
            message.push_str(&format!("; {untried} keys not tried"));
        }
        if self.unanswered > 0 {
            message.push_str(&format!(
                "; {} failed keys got no answer from the store and may have been {verb} all the \
                 same (`idalloc list` shows the holder's keys)",
                self.unanswered
            ));
        }
        Failure { code: f.code, kind: f.kind, message }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_batch_says_what_it_did() {
        let t = Tally { tried: 1200, done: 1197, failed: 3, unanswered: 0, first: None };
        let f =
            Failure { code: crate::fail::CORRUPT, kind: "corrupt", message: "bad record".into() };
        let f = t.failure("acquired", 2000, 500, "k499", f);
        assert_eq!(f.code, crate::fail::CORRUPT);
        assert_eq!(
            f.message,
            "acquired 1197 of 2000 keys (each printed above), then stopped at line 500 \
             (key \"k499\"): bad record; 2 more keys failed; 800 keys not tried"
        );
        let t = Tally { tried: 10, done: 9, failed: 1, unanswered: 0, first: None };
        let f = t.failure("released", 10, 3, "k", Failure::runtime("gone"));
        assert_eq!(
            f.message,
            "released 9 of 10 keys (each printed above), then stopped at line 3 (key \"k\"): gone"
        );
        // More keys tried than counted (an input that grew between its passes): no wrapped
        // count.
        let t = Tally { tried: 1200, done: 1199, failed: 1, unanswered: 0, first: None };
        let f = t.failure("acquired", 1000, 1200, "k", Failure::runtime("gone"));
        assert!(!f.message.contains("not tried"), "{}", f.message);
        let t = Tally { tried: 10, done: 8, failed: 2, unanswered: 2, first: None };
        let f = t.failure("acquired", 10, 3, "k", Failure::runtime("timed out"));
        assert!(
            f.message.ends_with(
                "; 2 failed keys got no answer from the store and may have been acquired all the \
                 same (`idalloc list` shows the holder's keys)"
            ),
            "{}",
            f.message
        );
    }
}

//! `acquire POOL --from FILE|-` and `release POOL --from FILE|-`: many keys in one process,
//! packed many per store request by the library's batched calls (issue 14), several in flight.
//!
//! The whole input is read and checked first, so a bad line (exit 2, naming its number) leaves the
//! store untouched rather than half-done. Batches of keys then run `concurrency` at a time; `buffered`
//! yields results in input order, so output line N belongs to input line N and is written as soon
//! as it and all before it are done.

use std::io::{Read, Write};
use std::path::Path;

use futures::stream::{self, StreamExt};
use idalloc::Pool;
use serde_json::json;

use crate::commands::Out;
use crate::fail::Failure;
use crate::progress::Progress;

/// Splits input into keys: lines end at `\n`, a `\r` right before it is dropped (files written on
/// Windows), nothing else is trimmed (keys may have spaces). A final line without `\n` counts.
/// Returns the first bad line's error: empty, not UTF-8, or over the key limit.
pub fn parse_keys(input: &[u8]) -> Result<Vec<String>, Failure> {
    let mut keys = Vec::new();
    let mut rest = input;
    let mut line_no = 0usize;
    while !rest.is_empty() {
        line_no += 1;
        let (line, next) = match rest.iter().position(|&b| b == b'\n') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, &rest[rest.len()..]),
        };
        rest = next;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        match idalloc::pool::validate_key_bytes(line) {
            Ok(k) => keys.push(k.to_string()),
            Err(e) => {
                let why = if line.is_empty() {
                    "empty lines are not allowed (every line is one key)".to_string()
                } else {
                    e.to_string()
                };
                return Err(Failure::usage(format!("--from line {line_no}: {why}")));
            }
        }
    }
    Ok(keys)
}

fn read_input(from: &Path) -> Result<Vec<u8>, Failure> {
    let mut buf = Vec::new();
    if from == Path::new("-") {
        std::io::stdin()
            .lock()
            .read_to_end(&mut buf)
            .map_err(|e| Failure::runtime(format!("reading keys from stdin: {e}")))?;
    } else {
        buf = std::fs::read(from).map_err(|e| {
            Failure::usage(format!("--from {}: cannot read the file: {e}", from.display()))
        })?;
    }
    Ok(buf)
}

/// Keys per library call: one batched request of up to 100 keys when uncontended (issue 14), so
/// `concurrency` calls in flight keep that many batches in flight.
const KEYS_PER_CALL: usize = 100;

pub async fn acquire_from(
    pool: &Pool,
    from: &Path,
    holder: &str,
    concurrency: usize,
    out: Out,
) -> Result<(), Failure> {
    let keys = parse_keys(&read_input(from)?)?;
    let name = pool.spec().name().to_string();
    run_batched(
        keys,
        "acquired",
        concurrency,
        |chunk| {
            let pool = pool.clone();
            let holder = holder.to_string();
            async move { pool.acquire_many_durable(&chunk, &holder).await }
        },
        |w, key, got: &idalloc::Acquired| {
            if out.json {
                let line = json!({"pool": name, "key": key, "id": got.id, "new": got.new, "holder": holder});
                writeln!(w, "{line}")
            } else {
                writeln!(w, "{}\t{}", got.id, crate::render::text(key))
            }
        },
    )
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
    let keys = parse_keys(&read_input(from)?)?;
    run_batched(
        keys,
        "released",
        concurrency,
        |chunk| {
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
        },
        |w, key, r: &idalloc::Released| {
            if out.json {
                let line = json!({"pool": pool_name, "key": key, "holder": holder,
                                  "released": r.held, "reclaimed": r.reclaimed});
                writeln!(w, "{line}")
            } else {
                match (r.held, r.reclaimed) {
                    (false, _) => writeln!(
                        w,
                        "{} held nothing for {key:?} in {pool_name}",
                        crate::render::text(holder)
                    ),
                    (true, true) => writeln!(w, "released; {key:?} was reclaimed"),
                    (true, false) => writeln!(w, "released"),
                }
            }
        },
    )
    .await
}

/// Runs `call` on chunks of [`KEYS_PER_CALL`] keys, `concurrency` chunks at a time, and writes
/// one line per key in input order as soon as it and all before it are done; stops at the first
/// error (naming how many keys were done).
async fn run_batched<T, F, Fut>(
    keys: Vec<String>,
    verb: &'static str,
    concurrency: usize,
    call: F,
    mut line: impl FnMut(&mut dyn Write, &str, &T) -> std::io::Result<()>,
) -> Result<(), Failure>
where
    F: Fn(Vec<String>) -> Fut,
    Fut: std::future::Future<Output = Vec<idalloc::Result<T>>>,
{
    let total = keys.len();
    let mut progress = Progress::stderr(verb, total);
    let chunks: Vec<Vec<String>> = keys.chunks(KEYS_PER_CALL).map(<[String]>::to_vec).collect();
    let mut results = stream::iter(chunks.into_iter().map(|chunk| {
        let fut = call(chunk.clone());
        async move { (chunk, fut.await) }
    }))
    .buffered(concurrency.max(1));

    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::new(stdout.lock());
    let mut done = 0usize;
    let write_err = |e: std::io::Error| Failure::runtime(format!("writing to stdout: {e}"));
    while let Some((chunk, rs)) = results.next().await {
        for (key, r) in chunk.iter().zip(rs) {
            let got = match r {
                Ok(g) => g,
                Err(e) => {
                    let _ = w.flush();
                    progress.finish();
                    let mut f: Failure = e.into();
                    f.message = format!("after {done} of {total} keys: {}", f.message);
                    return Err(f);
                }
            };
            line(&mut w, key, &got).map_err(write_err)?;
            done += 1;
            progress.tick();
        }
    }
    progress.finish();
    w.flush().map_err(write_err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_per_line() {
        assert_eq!(parse_keys(b"a\nb c\r\nd").unwrap(), vec!["a", "b c", "d"]);
        assert_eq!(parse_keys(b"a\n").unwrap(), vec!["a"]);
        assert!(parse_keys(b"").unwrap().is_empty());
        let e = parse_keys(b"a\n\nb\n").unwrap_err();
        assert_eq!(e.code, crate::fail::USAGE);
        assert!(e.message.starts_with("--from line 2: empty"), "{}", e.message);
        let e = parse_keys(b"a\nb\n\xff\n").unwrap_err();
        assert!(e.message.starts_with("--from line 3: invalid key"), "{}", e.message);
        let long = format!("ok\n{}\n", "k".repeat(4097));
        let e = parse_keys(long.as_bytes()).unwrap_err();
        assert!(e.message.contains("line 2") && e.message.contains("4097 bytes"), "{}", e.message);
    }
}

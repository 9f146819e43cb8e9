//! `acquire POOL --from FILE|-`: many keys in one process, many acquires in flight.
//!
//! The whole input is read and checked first, so a bad line (exit 2, naming its number) leaves the
//! store untouched rather than half-done. Acquires then run `concurrency` at a time; `buffered`
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

pub async fn acquire_from(
    pool: &Pool,
    from: &Path,
    holder: &str,
    concurrency: usize,
    out: Out,
) -> Result<(), Failure> {
    let keys = parse_keys(&read_input(from)?)?;
    let total = keys.len();
    let mut progress = Progress::stderr("acquired", total);
    let name = pool.spec().name().to_string();
    let mut results = stream::iter(keys.into_iter().map(|key| {
        let pool = pool.clone();
        let holder = holder.to_string();
        async move {
            let r = pool.acquire_durable(&key, &holder).await;
            (key, r)
        }
    }))
    .buffered(concurrency.max(1));

    let stdout = std::io::stdout();
    let mut w = std::io::BufWriter::new(stdout.lock());
    let mut done = 0usize;
    let write_err = |e: std::io::Error| Failure::runtime(format!("writing to stdout: {e}"));
    while let Some((key, r)) = results.next().await {
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
        if out.json {
            let line =
                json!({"pool": name, "key": key, "id": got.id, "new": got.new, "holder": holder});
            writeln!(w, "{line}").map_err(write_err)?;
        } else {
            writeln!(w, "{}\t{}", got.id, crate::render::text(&key)).map_err(write_err)?;
        }
        done += 1;
        progress.tick();
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

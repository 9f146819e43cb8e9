//! The `--from FILE|-` input of `acquire` and `release`: one key per line, read one line at a
//! time ([`KeyLines`]) so that a million keys cost the memory of one line, not of the input.

use std::io::BufRead;

/// Longest line kept whole. Longer lines are refused anyway (a key is at most
/// [`idalloc::pool::MAX_KEY_BYTES`] bytes); past this the rest of the line is skipped unread into
/// memory, so one huge line without a newline cannot exhaust it.
const LINE_CAP: usize = 4 * idalloc::pool::MAX_KEY_BYTES;

/// Why a line of the input is not a key, or why the input could not be read.
#[derive(Debug)]
pub enum LineError {
    /// `--from line N: why` (exit 2 when found before the store is touched).
    Bad(String),
    /// Reading the input failed.
    Io(std::io::Error),
}

/// The keys of an input, one per line, in order. Lines end at `\n`, a `\r` right before it is
/// dropped (files written on Windows), nothing else is trimmed (keys may have spaces). A final
/// line without `\n` counts. A bad line (empty, not UTF-8, or over the key limit) is an error
/// naming its number; the iterator ends after the first error.
pub struct KeyLines<R> {
    input: R,
    line_no: usize,
    buf: Vec<u8>,
    done: bool,
}

impl<R: BufRead> KeyLines<R> {
    pub fn new(input: R) -> KeyLines<R> {
        KeyLines { input, line_no: 0, buf: Vec::new(), done: false }
    }

    /// Reads the next line into `buf` (without its `\n`), keeping at most [`LINE_CAP`] + 1
    /// bytes of it. `Ok(false)` at the end of the input. The length is exact up to the cap.
    fn read_line(&mut self) -> std::io::Result<bool> {
        self.buf.clear();
        let mut any = false;
        loop {
            let chunk = match self.input.fill_buf() {
                Ok(c) => c,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if chunk.is_empty() {
                return Ok(any);
            }
            any = true;
            let (part, used, end) = match chunk.iter().position(|&b| b == b'\n') {
                Some(i) => (&chunk[..i], i + 1, true),
                None => (chunk, chunk.len(), false),
            };
            let room = (LINE_CAP + 1).saturating_sub(self.buf.len());
            self.buf.extend_from_slice(&part[..part.len().min(room)]);
            self.input.consume(used);
            if end {
                return Ok(true);
            }
        }
    }
}

impl<R: BufRead> Iterator for KeyLines<R> {
    type Item = Result<String, LineError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.read_line() {
            Ok(false) => {
                self.done = true;
                return None;
            }
            Ok(true) => {}
            Err(e) => {
                self.done = true;
                return Some(Err(LineError::Io(e)));
            }
        }
        self.line_no += 1;
        let line = self.buf.strip_suffix(b"\r").unwrap_or(&self.buf);
        let why = if line.is_empty() {
            "empty lines are not allowed (every line is one key)".to_string()
        } else if line.len() > LINE_CAP {
            format!(
                "the line is over {LINE_CAP} bytes; a key is at most {} bytes",
                idalloc::pool::MAX_KEY_BYTES
            )
        } else {
            match idalloc::pool::validate_key_bytes(line) {
                Ok(k) => return Some(Ok(k.to_string())),
                Err(e) => e.to_string(),
            }
        };
        self.done = true;
        Some(Err(LineError::Bad(format!("--from line {}: {why}", self.line_no))))
    }
}

/// Every key of `input` ([`KeyLines`]), or the first bad line's message (`--from line N: why`).
pub fn parse_keys(input: &[u8]) -> Result<Vec<String>, String> {
    KeyLines::new(input)
        .map(|r| match r {
            Ok(k) => Ok(k),
            Err(LineError::Bad(m)) => Err(m),
            Err(LineError::Io(e)) => Err(format!("--from: {e}")),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_keys() {
        assert_eq!(parse_keys(b"a\nb c\r\nd").unwrap(), vec!["a", "b c", "d"]);
        assert_eq!(parse_keys(b"a\n").unwrap(), vec!["a"]);
        assert!(parse_keys(b"").unwrap().is_empty());
        let e = parse_keys(b"a\n\nb\n").unwrap_err();
        assert!(e.starts_with("--from line 2: empty"), "{e}");
        let e = parse_keys(b"a\nb\n\xff\n").unwrap_err();
        assert!(e.starts_with("--from line 3: invalid key"), "{e}");
        assert_eq!(
            parse_keys(b"\r\n").unwrap_err(),
            "--from line 1: empty lines are not allowed (every line is one key)"
        );
    }

    /// A line far longer than any key is refused by number without being held whole.
    #[test]
    fn a_huge_line_is_refused_by_number() {
        let mut input = b"ok\n".to_vec();
        input.extend(std::iter::repeat_n(b'k', 10 * LINE_CAP));
        input.extend(b"\nnext\n");
        let mut lines = KeyLines::new(std::io::BufReader::with_capacity(64, &input[..]));
        assert_eq!(lines.next().unwrap().unwrap(), "ok");
        match lines.next() {
            Some(Err(LineError::Bad(m))) => {
                assert!(m.starts_with("--from line 2: the line is over 16384 bytes"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        assert!(lines.buf.capacity() < 2 * LINE_CAP, "{}", lines.buf.capacity());
        assert!(lines.next().is_none(), "stops at the first bad line");
        // Up to the cap, the length in the message is exact.
        let e = parse_keys(format!("ok\n{}\n", "k".repeat(4097)).as_bytes()).unwrap_err();
        assert!(e.contains("line 2") && e.contains("4097 bytes"), "{e}");
    }
}

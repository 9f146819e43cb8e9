//! Target `from_input`: the key lines of `idalloc acquire|release POOL --from FILE|-`
//! (`idalloc_cli::keys::parse_keys`, the function the binary calls).
//!
//! Properties: accepted input gives one valid key per line, and the keys written back one per
//! line parse to the same keys (with `\r\n` endings always; with `\n` when no key ends in `\r`); refused input names the first bad line, every line before it
//! being a valid key.

use idalloc_cli::keys::parse_keys;

/// The input's lines as the command splits them: at `\n`, one `\r` before it dropped, a last line
/// without `\n` counted.
fn lines(data: &[u8]) -> Vec<&[u8]> {
    let mut out: Vec<&[u8]> = data.split(|&b| b == b'\n').collect();
    if data.is_empty() || data.ends_with(b"\n") {
        out.pop();
    }
    out.into_iter().map(|l| l.strip_suffix(b"\r").unwrap_or(l)).collect()
}

/// Input: the file's bytes.
pub fn check(data: &[u8]) {
    let lines = lines(data);
    match parse_keys(data) {
        Ok(keys) => {
            assert_eq!(keys.len(), lines.len(), "one key per line");
            for (key, line) in keys.iter().zip(&lines) {
                assert_eq!(key.as_bytes(), *line, "a key is its line");
                assert!(idalloc::pool::validate_key(key).is_ok(), "accepted key {key:?} is valid");
            }
            // Written back with `\r\n` endings, every key list reads back: one `\r` is dropped per
            // line, so a key ending in `\r` survives. With `\n` endings, so does every list
            // whose keys do not end in `\r` (a key `a\r` then reads as `a`: the CRLF rule).
            let crlf: Vec<u8> =
                keys.iter().flat_map(|k| [k.as_bytes(), b"\r\n"].concat()).collect();
            assert_eq!(parse_keys(&crlf).as_ref(), Ok(&keys), "written back with CRLF");
            if !keys.iter().any(|k| k.ends_with('\r')) {
                let lf: Vec<u8> =
                    keys.iter().flat_map(|k| [k.as_bytes(), b"\n"].concat()).collect();
                assert_eq!(parse_keys(&lf).as_ref(), Ok(&keys), "written back with LF");
            }
        }
        Err(msg) => {
            let n: usize = msg
                .strip_prefix("--from line ")
                .and_then(|r| r.split_once(':'))
                .and_then(|(n, _)| n.parse().ok())
                .unwrap_or_else(|| panic!("the error names its line: {msg}"));
            assert!((1..=lines.len()).contains(&n), "line {n} of {}: {msg}", lines.len());
            assert!(
                idalloc::pool::validate_key_bytes(lines[n - 1]).is_err(),
                "line {n} is refused but valid: {msg}"
            );
            for (i, line) in lines[..n - 1].iter().enumerate() {
                assert!(
                    idalloc::pool::validate_key_bytes(line).is_ok(),
                    "line {} was valid",
                    i + 1
                );
            }
        }
    }
}

//! The `--from FILE|-` input of `acquire` and `release`: one key per line.

/// Splits input into keys: lines end at `\n`, a `\r` right before it is dropped (files written on
/// Windows), nothing else is trimmed (keys may have spaces). A final line without `\n` counts.
/// Returns the first bad line's message (`--from line N: why`): empty, not UTF-8, or over the key
/// limit. The command exits 2 (usage) with it, before touching the store.
pub fn parse_keys(input: &[u8]) -> Result<Vec<String>, String> {
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
                return Err(format!("--from line {line_no}: {why}"));
            }
        }
    }
    Ok(keys)
}

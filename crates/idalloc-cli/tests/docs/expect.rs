//! Whether a command's output is the one its page shows. Equal text, line by line, except for
//! this declared variance and nothing else:
//!
//! - `…` inside a line matches any text within that line (also none);
//! - a line that is `…` alone matches any number of whole lines (also none);
//! - `<name>` (lower-case letters, digits and `-`) matches one token of letters, digits and
//!   `._:+-` (an ID, a revision, a session id, a commit, a timestamp); every later `<name>` of the
//!   same name on the same page must be the same text, so "the same key gets the same ID" is
//!   checked, not assumed;
//! - trailing spaces of a line and blank lines at the end are not compared;
//! - a command that exits non-zero prints a last line `(exit N)` ([`with_exit`]).

use std::collections::HashMap;

/// What the placeholders of a page stand for so far.
pub type Bindings = HashMap<String, String>;

/// The ellipsis that matches any text.
const ANY: &str = "…";

/// One piece of an expected line.
#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Text(String),
    Any,
    Named(String),
}

/// One expected line.
#[derive(Debug, Clone, PartialEq)]
enum Line {
    /// `…` alone: any number of lines.
    AnyLines,
    Pieces(Vec<Piece>),
}

/// `output` with the `(exit N)` line the page shows for a non-zero exit status (`None`: killed by
/// a signal, shown as `(exit signal)`).
pub fn with_exit(output: &str, code: Option<i32>) -> String {
    match code {
        Some(0) => output.to_string(),
        other => {
            let mut s = output.to_string();
            if !s.is_empty() && !s.ends_with('\n') {
                s.push('\n');
            }
            match other {
                Some(n) => s.push_str(&format!("(exit {n})\n")),
                None => s.push_str("(exit signal)\n"),
            }
            s
        }
    }
}

/// Whether `actual` is what `expected` shows, given the page's `bindings`; on a match, the
/// bindings with this output's placeholders added.
pub fn matches(expected: &[String], actual: &str, bindings: &Bindings) -> Option<Bindings> {
    let pattern: Vec<Line> =
        trim_end(expected.iter().map(String::as_str)).map(parse_line).collect();
    let lines: Vec<&str> = trim_end(actual.lines()).collect();
    let mut b = bindings.clone();
    match_lines(&pattern, &lines, &mut b).then_some(b)
}

/// Lines without trailing spaces and without blank lines at the end.
fn trim_end<'a>(lines: impl Iterator<Item = &'a str>) -> impl Iterator<Item = &'a str> {
    let v: Vec<&str> = lines.map(str::trim_end).collect();
    let keep = v.iter().rposition(|l| !l.is_empty()).map_or(0, |p| p + 1);
    v.into_iter().take(keep)
}

fn parse_line(line: &str) -> Line {
    if line.trim() == ANY {
        return Line::AnyLines;
    }
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut rest = line;
    while let Some(c) = rest.chars().next() {
        if let Some(after) = rest.strip_prefix(ANY) {
            flush(&mut text, &mut pieces);
            pieces.push(Piece::Any);
            rest = after;
        } else if let Some((name, after)) = placeholder(rest) {
            flush(&mut text, &mut pieces);
            pieces.push(Piece::Named(name.to_string()));
            rest = after;
        } else {
            text.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    flush(&mut text, &mut pieces);
    Line::Pieces(pieces)
}

fn flush(text: &mut String, pieces: &mut Vec<Piece>) {
    if !text.is_empty() {
        pieces.push(Piece::Text(std::mem::take(text)));
    }
}

/// `<name>` at the start of `s`: the name and the rest.
fn placeholder(s: &str) -> Option<(&str, &str)> {
    let inner = s.strip_prefix('<')?;
    let end = inner.find('>')?;
    let name = &inner[..end];
    let first = name.chars().next()?;
    let ok = first.is_ascii_lowercase()
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    ok.then(|| (name, &inner[end + 1..]))
}

fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "._:+-".contains(c)
}

fn match_lines(pattern: &[Line], lines: &[&str], b: &mut Bindings) -> bool {
    let Some((first, rest)) = pattern.split_first() else {
        return lines.is_empty();
    };
    match first {
        Line::AnyLines => (0..=lines.len()).any(|skip| {
            let mut tried = b.clone();
            let ok = match_lines(rest, &lines[skip..], &mut tried);
            if ok {
                *b = tried;
            }
            ok
        }),
        Line::Pieces(pieces) => {
            let Some((line, more)) = lines.split_first() else {
                return false;
            };
            let mut tried = b.clone();
            let ok = match_pieces(pieces, line, &mut tried) && match_lines(rest, more, &mut tried);
            if ok {
                *b = tried;
            }
            ok
        }
    }
}

/// Whether `text` (one line) is `pieces`, binding new placeholders into `b`.
fn match_pieces(pieces: &[Piece], text: &str, b: &mut Bindings) -> bool {
    let Some((first, rest)) = pieces.split_first() else {
        return text.is_empty();
    };
    match first {
        Piece::Text(t) => text.strip_prefix(t.as_str()).is_some_and(|r| match_pieces(rest, r, b)),
        Piece::Any => text
            .char_indices()
            .map(|(i, _)| i)
            .chain([text.len()])
            .any(|i| try_rest(rest, &text[i..], b, None)),
        Piece::Named(name) => {
            if let Some(value) = b.get(name).cloned() {
                return text.strip_prefix(value.as_str()).is_some_and(|r| match_pieces(rest, r, b));
            }
            let token = text.len() - text.trim_start_matches(is_token_char).len();
            // Longest first: a token usually ends where the next literal starts.
            (1..=token)
                .rev()
                .filter(|&n| text.is_char_boundary(n))
                .any(|n| try_rest(rest, &text[n..], b, Some((name, &text[..n]))))
        }
    }
}

/// `match_pieces(rest, text)` with `bind` added, keeping `b` unchanged unless it matches.
fn try_rest(rest: &[Piece], text: &str, b: &mut Bindings, bind: Option<(&str, &str)>) -> bool {
    let mut tried = b.clone();
    if let Some((name, value)) = bind {
        tried.insert(name.to_string(), value.to_string());
    }
    let ok = match_pieces(rest, text, &mut tried);
    if ok {
        *b = tried;
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exp(lines: &[&str]) -> Vec<String> {
        lines.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_planted_mismatch_fails() {
        let none = Bindings::new();
        assert!(matches(&exp(&["4096"]), "4096\n", &none).is_some());
        assert!(matches(&exp(&["4096"]), "4097\n", &none).is_none());
        // A line more, a line less, a changed column: each fails.
        assert!(matches(&exp(&["a", "b"]), "a\nb\nc\n", &none).is_none());
        assert!(matches(&exp(&["a", "b"]), "a\n", &none).is_none());
        assert!(matches(&exp(&["ID    KEY"]), "ID  KEY\n", &none).is_none());
        // A non-zero exit the page does not show fails; the one it shows passes.
        assert!(matches(&exp(&["error: x"]), &with_exit("error: x\n", Some(3)), &none).is_none());
        assert!(matches(&exp(&["error: x", "(exit 3)"]), &with_exit("error: x", Some(3)), &none)
            .is_some());
        assert!(matches(&exp(&["error: x", "(exit 3)"]), &with_exit("error: x", Some(2)), &none)
            .is_none());
    }

    #[test]
    fn only_trailing_spaces_and_final_blank_lines_are_ignored() {
        let none = Bindings::new();
        assert!(matches(&exp(&["a", ""]), "a   \n\n\n", &none).is_some());
        assert!(matches(&exp(&["a", "", "b"]), "a\nb\n", &none).is_none());
        assert!(matches(&exp(&[" a"]), "a\n", &none).is_none());
    }

    #[test]
    fn an_ellipsis_matches_within_a_line_or_whole_lines() {
        let none = Bindings::new();
        assert!(matches(&exp(&["git commit: …"]), "git commit: 0123456789ab\n", &none).is_some());
        assert!(matches(&exp(&["a…c"]), "ac\n", &none).is_some());
        assert!(matches(&exp(&["a…c"]), "abd\n", &none).is_none());
        assert!(matches(&exp(&["first", "…", "last"]), "first\nx\ny\nlast\n", &none).is_some());
        assert!(matches(&exp(&["first", "…", "last"]), "first\nlast\n", &none).is_some());
        assert!(matches(&exp(&["first", "…", "last"]), "first\nx\n", &none).is_none());
        // Within a line it never crosses a line's end.
        assert!(matches(&exp(&["a…b"]), "a\nb\n", &none).is_none());
    }

    #[test]
    fn a_named_placeholder_binds_once_per_page() {
        let none = Bindings::new();
        let b =
            matches(&exp(&["{\"id\":<id>,\"new\":true}"]), "{\"id\":4133,\"new\":true}\n", &none)
                .expect("matches");
        assert_eq!(b["id"], "4133");
        // The same name later on the page is the same value: a planted other ID fails.
        assert!(matches(&exp(&["<id>"]), "4133\n", &b).is_some());
        assert!(matches(&exp(&["<id>"]), "4134\n", &b).is_none());
        // Twice in one output, too.
        assert!(matches(&exp(&["<a> <a>"]), "7 8\n", &none).is_none());
        assert!(matches(&exp(&["<a> <a>"]), "7 7\n", &none).is_some());
        // A token, not any text: spaces and quotes are not in it.
        assert!(matches(&exp(&["<id>"]), "41 33\n", &none).is_none());
        assert!(matches(&exp(&["<id>"]), "\n", &none).is_none());
        // Upper case or other characters inside the angle brackets are text.
        assert!(matches(&exp(&["<MIN-MAX>"]), "<MIN-MAX>\n", &none).is_some());
        assert!(matches(&exp(&["<MIN-MAX>"]), "5\n", &none).is_none());
    }

    #[test]
    fn a_failed_match_binds_nothing() {
        let none = Bindings::new();
        assert!(matches(&exp(&["<id> x"]), "5 y\n", &none).is_none());
        let b = matches(&exp(&["…", "<id>"]), "1\n2\n", &none).expect("matches");
        assert_eq!(b["id"], "2");
    }
}

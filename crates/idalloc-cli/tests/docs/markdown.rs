//! The shell blocks of a guide page. A fenced block whose language is a shell's (`console`, `sh`,
//! `bash`, `shell`, `shell-session`) either runs or says why not:
//!
//! - a `console` block is a transcript: each `$ ` line is a command (a line ending in `\` goes on
//!   to the next), and the lines up to the next `$ ` line are its output;
//! - a block right after `<!-- not run: REASON -->` (a blank line between them is allowed) is
//!   counted, with its reason, and not run;
//! - anything else (an `sh` block of bare commands, a `console` block without a `$ ` line) is an
//!   error naming the line: an example nobody runs is an example that drifts.
//!
//! Other blocks (no language, `json`, `rust`, `text`, …) are not commands and are left alone.

/// The languages of a fenced block that hold commands.
const SHELL_LANGS: &[&str] = &["console", "sh", "bash", "shell", "shell-session"];

/// The marker of a block that is not run, before its reason.
const NOT_RUN: &str = "<!-- not run:";

/// One command of a transcript and the output the page shows for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Example {
    /// 1-based line of the command's `$ ` in the page.
    pub line: usize,
    /// The command as the shell gets it (continuation lines joined with their `\` and newline).
    pub command: String,
    /// The output lines shown under it (none: the command prints nothing).
    pub output: Vec<String>,
}

/// A shell block of a page.
#[derive(Debug, Clone, PartialEq)]
pub enum Block {
    /// A `console` transcript: its commands in order.
    Run { line: usize, examples: Vec<Example> },
    /// A block marked `<!-- not run: REASON -->`.
    Skipped { line: usize, reason: String },
}

/// Every shell block of `text`, in order, or the errors (line and what is wrong) of the blocks
/// that neither run nor say why.
pub fn blocks(text: &str) -> Result<Vec<Block>, Vec<(usize, String)>> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut errors = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some((indent, fence, lang)) = fence_open(lines[i]) else {
            i += 1;
            continue;
        };
        let start = i;
        let mut body = Vec::new();
        i += 1;
        while i < lines.len() && !is_fence_close(lines[i], &fence) {
            body.push(strip_indent(lines[i], indent));
            i += 1;
        }
        if i == lines.len() {
            errors.push((start + 1, "a fenced block that is never closed".to_string()));
            break;
        }
        i += 1;
        if !SHELL_LANGS.contains(&lang.as_str()) {
            continue;
        }
        if let Some(reason) = not_run_reason(&lines[..start]) {
            if reason.is_empty() {
                errors.push((start + 1, "`<!-- not run: -->` without a reason".to_string()));
            } else {
                out.push(Block::Skipped { line: start + 1, reason });
            }
            continue;
        }
        if lang != "console" {
            errors.push((
                start + 1,
                format!(
                    "a `{lang}` block of commands that is not run: write it as a `console` \
                     transcript (`$ ` before each command, its output below) or put \
                     `<!-- not run: REASON -->` before it"
                ),
            ));
            continue;
        }
        match transcript(&body, start + 2) {
            Ok(examples) if examples.is_empty() => errors.push((
                start + 1,
                "a `console` block without a `$ ` command: mark it `<!-- not run: REASON -->`"
                    .to_string(),
            )),
            Ok(examples) => out.push(Block::Run { line: start + 1, examples }),
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// The commands of a `console` block's lines; `first` is the page line of `body[0]`.
fn transcript(body: &[&str], first: usize) -> Result<Vec<Example>, (usize, String)> {
    let mut examples: Vec<Example> = Vec::new();
    let mut i = 0;
    while i < body.len() {
        let line = body[i];
        if let Some(cmd) = line.strip_prefix("$ ") {
            let at = first + i;
            let mut command = cmd.to_string();
            while command.ends_with('\\') {
                i += 1;
                let Some(next) = body.get(i) else {
                    return Err((at, "a command ends in `\\` with no line after it".to_string()));
                };
                command.push('\n');
                command.push_str(next);
            }
            examples.push(Example { line: at, command, output: Vec::new() });
        } else if let Some(last) = examples.last_mut() {
            last.output.push(line.to_string());
        } else if !line.trim().is_empty() {
            return Err((first + i, format!("output before any `$ ` command: {line:?}")));
        }
        i += 1;
    }
    Ok(examples)
}

/// `(indent, fence, language)` if `line` opens a fenced block.
fn fence_open(line: &str) -> Option<(usize, String, String)> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    let rest = &line[indent..];
    let ticks = rest.len() - rest.trim_start_matches('`').len();
    if ticks < 3 {
        return None;
    }
    let lang = rest[ticks..].split_whitespace().next().unwrap_or("").to_string();
    Some((indent, rest[..ticks].to_string(), lang))
}

fn is_fence_close(line: &str, fence: &str) -> bool {
    let t = line.trim();
    t.starts_with(fence) && t.chars().all(|c| c == '`')
}

fn strip_indent(line: &str, indent: usize) -> &str {
    let spaces = line.len() - line.trim_start_matches(' ').len();
    &line[spaces.min(indent)..]
}

/// The reason of a `<!-- not run: REASON -->` marker on the last non-blank line of `before`.
fn not_run_reason(before: &[&str]) -> Option<String> {
    let last = before.iter().rev().find(|l| !l.trim().is_empty())?.trim();
    let reason = last.strip_prefix(NOT_RUN)?.strip_suffix("-->")?;
    Some(reason.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transcript_is_commands_with_their_output() {
        let page = "text\n\n```console\n$ idalloc acquire vni k\n4096\n$ idalloc pool \\\n  list\n$ true\n```\n";
        let got = blocks(page).expect("parses");
        assert_eq!(
            got,
            vec![Block::Run {
                line: 3,
                examples: vec![
                    Example {
                        line: 4,
                        command: "idalloc acquire vni k".into(),
                        output: vec!["4096".into()]
                    },
                    Example { line: 6, command: "idalloc pool \\\n  list".into(), output: vec![] },
                    Example { line: 8, command: "true".into(), output: vec![] },
                ],
            }]
        );
    }

    #[test]
    fn a_marked_block_is_skipped_with_its_reason_and_other_languages_are_not_commands() {
        let page = "<!-- not run: needs etcd -->\n\n```sh\netcd &\n```\n```json\n{}\n```\n```\nidalloc x\n```\n";
        assert_eq!(
            blocks(page).expect("parses"),
            vec![Block::Skipped { line: 3, reason: "needs etcd".into() }]
        );
    }

    #[test]
    fn an_unmarked_sh_block_an_empty_transcript_and_a_bare_marker_are_errors() {
        let page = "```sh\nidalloc pool list\n```\n\n```console\nno prompt\n```\n\n<!-- not run: -->\n```sh\nx\n```\n";
        let errors = blocks(page).expect_err("three errors");
        let lines: Vec<usize> = errors.iter().map(|e| e.0).collect();
        assert_eq!(lines, vec![1, 6, 10], "{errors:?}");
        assert!(errors[0].1.contains("not run"), "{}", errors[0].1);
    }
}

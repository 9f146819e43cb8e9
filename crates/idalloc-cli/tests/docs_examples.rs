//! The guide's examples run: every `console` transcript of the pages in [`PAGES`] is run, command
//! by command, and its output compared with the page's (tests/docs/expect.rs says what may differ),
//! so a change of output fails here until the page follows. docs/design/testing.md ("Doc
//! examples") is the user's side of it.
//!
//! A page is one walk-through: its commands run in order in one fresh directory (so the default
//! store `file:idalloc.redb` is a file of its own), with `USER=alice`, the `idalloc` of this build
//! first on `PATH`, no `IDALLOC_*` variable of the test's environment, and the shell variables a
//! command sets (`S=$(curl …)`) kept for the commands after it. stderr is shown with stdout, as a
//! terminal shows them. A command `idalloc … serve … &` starts the page's service: the runner
//! starts it on a free 127.0.0.1 port (its first stdout line is the command's output), and the
//! page's `127.0.0.1:7379` and `localhost:7379` stand for its address in the commands after it and in their output. The
//! service is stopped at the end of the page.

mod docs;

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use docs::expect::{self, Bindings};
use docs::markdown::{self, Block, Example};
use idalloc_testkit::serve::Serve;

/// The pages whose shell blocks run.
const PAGES: &[&str] = &["docs/guide/quick-start.md", "docs/guide/cli.md", "docs/guide/api.md"];

/// How many blocks of all pages may be marked `<!-- not run: … -->`. Raising it is a decision:
/// each skipped block is an example that can drift.
const MAX_NOT_RUN: usize = 6;

/// The addresses of a page's service, as the page writes them (a bare `:7379` is not replaced:
/// `"id":73791` is an ID).
const DOC_ADDRS: &[&str] = &["127.0.0.1:7379", "localhost:7379"];

/// A bound for a command that hangs (every example ends in well under a second), not a
/// statement about speed.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_idalloc")
}

/// One page being run: its directory, its shell state, its service, its placeholders.
struct Page {
    name: &'static str,
    // Before `dir`: fields drop in order, so the service is stopped before its directory goes.
    serve: Option<Serve>,
    dir: tempfile::TempDir,
    bindings: Bindings,
}

/// A command whose output is not the page's.
struct Mismatch {
    at: String,
    command: String,
    expected: Vec<String>,
    actual: String,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{}: $ {}", self.at, self.command)?;
        writeln!(f, "=== the page shows:")?;
        for l in &self.expected {
            writeln!(f, "{l}")?;
        }
        writeln!(f, "=== the command printed:")?;
        write!(f, "{}", self.actual)?;
        if !self.actual.ends_with('\n') {
            writeln!(f)?;
        }
        writeln!(f, "=== end")
    }
}

impl Page {
    fn new(name: &'static str) -> Page {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("home")).expect("home");
        Page { name, dir, serve: None, bindings: Bindings::new() }
    }

    fn state_file(&self) -> PathBuf {
        self.dir.path().join(".shell-state")
    }

    /// Runs one example; `Err` with what differs.
    fn run(&mut self, ex: &Example) -> Result<(), Mismatch> {
        let actual = match serve_command(&ex.command) {
            Some((global, args)) => self.start_serve(&global, &args),
            // Anything else in the background would outlive its command unwatched.
            None if ex.command.trim_end().ends_with('&') => {
                "(not run: only `idalloc … serve … &` may run in the background)\n".to_string()
            }
            None => self.shell(&ex.command),
        };
        match expect::matches(&ex.output, &actual, &self.bindings) {
            Some(b) => {
                self.bindings = b;
                Ok(())
            }
            None => Err(Mismatch {
                at: format!("{}:{}", self.name, ex.line),
                command: ex.command.clone(),
                expected: ex.output.clone(),
                actual,
            }),
        }
    }

    /// Starts the page's service; its "output" is its listening line.
    fn start_serve(&mut self, global: &[String], args: &[String]) -> String {
        assert!(self.serve.is_none(), "{}: a second service on one page", self.name);
        let global: Vec<&str> = global.iter().map(String::as_str).collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let serve = Serve::start_in(bin(), self.dir.path(), &global, &args);
        let line = format!("listening on {}\n", serve.addr());
        self.serve = Some(serve);
        self.page_addrs_in(&line)
    }

    /// `text` with the page's service addresses replaced by the real one.
    fn service_addrs_in(&self, text: &str) -> String {
        let mut text = text.to_string();
        if let Some(s) = &self.serve {
            for doc in DOC_ADDRS {
                text = text.replace(doc, &doc.replace("7379", port(s)));
            }
        }
        text
    }

    /// `text` with the real service address replaced by the page's.
    fn page_addrs_in(&self, text: &str) -> String {
        let mut text = text.to_string();
        if let Some(s) = &self.serve {
            for doc in DOC_ADDRS {
                text = text.replace(&doc.replace("7379", port(s)), doc);
            }
        }
        text
    }

    /// Runs `command` with bash in the page's directory and state: stdout and stderr as one text,
    /// plus `(exit N)` when it fails.
    fn shell(&self, command: &str) -> String {
        let script = format!(
            "set -a\n[ -f \"$DOCS_STATE\" ] && . \"$DOCS_STATE\" 2>/dev/null\nexec 2>&1\n{}\n\
             __docs_rc=$?\nexport -p > \"$DOCS_STATE\"\nexit $__docs_rc\n",
            self.service_addrs_in(command)
        );
        let bin_dir = Path::new(bin()).parent().expect("bin dir").to_path_buf();
        let path = std::env::join_paths(
            std::iter::once(bin_dir)
                .chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
        )
        .expect("PATH");
        let mut cmd = Command::new("bash");
        cmd.arg("-c")
            .arg(script)
            .current_dir(self.dir.path())
            .env_clear()
            .env("PATH", path)
            .env("HOME", self.dir.path().join("home"))
            .env("USER", "alice")
            .env("LOGNAME", "alice")
            .env("LANG", "C.UTF-8")
            .env("DOCS_STATE", self.state_file())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            // Its own process group, so that a hung command and its children are killed together.
            .process_group(0);
        let mut child = cmd.spawn().expect("spawn bash");
        let mut stdout = child.stdout.take().expect("stdout");
        let reader = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = stdout.read_to_end(&mut buf);
            buf
        });
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        let status = loop {
            if let Some(st) = child.try_wait().expect("wait") {
                break st;
            }
            if Instant::now() > deadline {
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{}", child.id())])
                    .status();
                let st = child.wait().expect("wait");
                let out = reader.join().unwrap_or_default();
                return format!(
                    "{}(no exit within {COMMAND_TIMEOUT:?}: killed; {st})\n",
                    String::from_utf8_lossy(&out)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let out = reader.join().unwrap_or_default();
        let text = self.page_addrs_in(&String::from_utf8_lossy(&out));
        expect::with_exit(&text, status.code())
    }
}

fn port(s: &Serve) -> &str {
    s.addr().rsplit(':').next().unwrap_or("")
}

/// `idalloc GLOBAL… serve ARGS… &`: the global options and serve's own, without `--listen` (the
/// runner's service listens on a free port).
fn serve_command(command: &str) -> Option<(Vec<String>, Vec<String>)> {
    let words: Vec<&str> = command.split_whitespace().collect();
    let (last, words) = words.split_last()?;
    if *last != "&" || words.first() != Some(&"idalloc") {
        return None;
    }
    let at = words.iter().position(|w| *w == "serve")?;
    let global = words[1..at].iter().map(|s| s.to_string()).collect();
    let mut args = Vec::new();
    let mut rest = words[at + 1..].iter();
    while let Some(w) = rest.next() {
        if *w == "--listen" {
            rest.next();
        } else if !w.starts_with("--listen=") {
            args.push(w.to_string());
        }
    }
    Some((global, args))
}

#[test]
fn every_shell_block_of_the_guide_runs_and_prints_what_the_page_shows() {
    let mut mismatches = Vec::new();
    let mut errors = Vec::new();
    let mut skipped = Vec::new();
    let mut ran = 0;
    for name in PAGES {
        let text = std::fs::read_to_string(repo_root().join(name))
            .unwrap_or_else(|e| panic!("read {name}: {e}"));
        let blocks = match markdown::blocks(&text) {
            Ok(b) => b,
            Err(errs) => {
                errors.extend(errs.into_iter().map(|(line, e)| format!("{name}:{line}: {e}")));
                continue;
            }
        };
        let mut page = Page::new(name);
        let mut page_ran = 0;
        for block in &blocks {
            match block {
                Block::Skipped { line, reason } => skipped.push(format!("{name}:{line}: {reason}")),
                Block::Run { examples, .. } => {
                    for ex in examples {
                        page_ran += 1;
                        if let Err(m) = page.run(ex) {
                            mismatches.push(m.to_string());
                        }
                    }
                }
            }
        }
        // A page that names commands but whose parser found none is a broken runner, not a pass.
        if page_ran == 0 {
            errors.push(format!("{name}: no command ran"));
        }
        ran += page_ran;
    }
    eprintln!("doc examples: {ran} commands run; {} blocks not run:", skipped.len());
    for s in &skipped {
        eprintln!("  {s}");
    }
    let mut report = String::new();
    if !errors.is_empty() {
        report += &format!("blocks that neither run nor say why:\n{}\n\n", errors.join("\n"));
    }
    if !mismatches.is_empty() {
        report += &format!(
            "{} doc examples print something else than their page shows (the binary is the truth \
             unless it is a bug: fix the page or the bug):\n\n{}\n",
            mismatches.len(),
            mismatches.join("\n")
        );
    }
    if skipped.len() > MAX_NOT_RUN {
        report += &format!(
            "{} blocks are marked not run, more than the {MAX_NOT_RUN} allowed:\n{}\n",
            skipped.len(),
            skipped.join("\n")
        );
    }
    assert!(report.is_empty(), "{report}");
}

#[test]
fn a_page_whose_output_drifted_fails_naming_file_line_command_and_both_outputs() {
    let page_text = "```console\n$ idalloc pool create vni --range 1-10 --strategy lowest\n…\n$ idalloc acquire vni k\n2\n```\n";
    let blocks = markdown::blocks(page_text).expect("parses");
    let Block::Run { examples, .. } = &blocks[0] else { panic!("{blocks:?}") };
    let mut page = Page::new("planted.md");
    page.run(&examples[0]).map_err(|m| m.to_string()).expect("pool create");
    let report = page.run(&examples[1]).map_err(|m| m.to_string()).expect_err("1, not 2");
    for part in [
        "planted.md:4: $ idalloc acquire vni k",
        "=== the page shows:\n2\n=== the command printed:\n1\n=== end",
    ] {
        assert!(report.contains(part), "{part:?} not in:\n{report}");
    }
}

#[test]
fn shell_state_carries_over_and_a_failing_command_shows_its_exit_code() {
    let page_text = "```console\n$ K=$(echo tenant-blue)\n$ echo \"$K\"\ntenant-blue\n$ idalloc get nope k\nerror: …\n(exit 3)\n```\n";
    let blocks = markdown::blocks(page_text).expect("parses");
    let Block::Run { examples, .. } = &blocks[0] else { panic!("{blocks:?}") };
    let mut page = Page::new("state.md");
    for ex in examples {
        page.run(ex).map_err(|m| m.to_string()).expect("runs as shown");
    }
}

#[test]
fn only_an_idalloc_serve_runs_in_the_background_and_on_a_free_port() {
    let words = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        serve_command("idalloc --prefix p serve --listen 127.0.0.1:7379 --max-body 10 &"),
        Some((words(&["--prefix", "p"]), words(&["--max-body", "10"])))
    );
    assert_eq!(
        serve_command("idalloc serve --listen 127.0.0.1:7379"),
        None,
        "not in the background"
    );
    assert_eq!(serve_command("sleep 100 &"), None);
    let mut page = Page::new("background.md");
    let ex = Example { line: 1, command: "sleep 100 &".into(), output: vec![] };
    let report = page.run(&ex).map_err(|m| m.to_string()).expect_err("refused");
    assert!(report.contains("only `idalloc … serve … &`"), "{report}");
}

//! `idalloc`: the command-line front of the idalloc library. See `idalloc --help` and
//! docs/guide/cli.md.

#![forbid(unsafe_code)]

mod batch;
mod cli;
mod commands;
mod config;
mod connect;
mod docgen;
mod fail;
mod list;
mod open;
mod parse;
mod print;
mod progress;
mod reach;
mod release_holder;
mod remotes;
mod render;
mod serve;
mod suggest;
mod through;
mod unanswered;
mod upgrade;
mod version;
mod watch;

use std::process::ExitCode;

use clap::Parser;

/// How long the exit waits for blocking work (a file store's commit in progress) to finish.
const SHUTDOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let json_errors = wants_json(&argv);
    let cli = match parse(argv) {
        Ok(c) => c,
        Err(Parsed::Failed(f)) => return fail(&f, json_errors),
        Err(Parsed::Clap(e)) => {
            use clap::error::ErrorKind;
            return match e.kind() {
                ErrorKind::DisplayHelp
                | ErrorKind::DisplayVersion
                | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                    let _ = e.print();
                    ExitCode::from(
                        if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                            fail::USAGE
                        } else {
                            fail::OK
                        },
                    )
                }
                _ => fail(
                    &fail::Failure::usage(fail::clap_line(&e.render().to_string())),
                    json_errors,
                ),
            };
        }
    };
    init_logs(&cli);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            fail::say(&format!("error: cannot start the async runtime: {e}"));
            return ExitCode::from(fail::RUNTIME);
        }
    };
    let started = std::time::Instant::now();
    let ran = runtime.block_on(async {
        match commands::run(cli).await {
            Err(f) => Err(unanswered::explain(f, started.elapsed()).await),
            ok => ok,
        }
    });
    let code = match ran {
        Ok(code) => code,
        Err(f) => {
            // A closed stdout (`| head`) is not worth a line: the reader asked for no more.
            if !f.is_quiet() {
                fail::say(&if json_errors { f.json_line() } else { f.line() });
            }
            f.code
        }
    };
    // Shutting the runtime down drops its background tasks (a pool's watch, a file store's lease
    // reaper), and with them their handles on the store, so a file store is closed cleanly (else
    // its next open must repair it, which a read-only open cannot do). Bounded: a blocking call
    // that does not return (a hung disk) must not keep the process from exiting.
    runtime.shutdown_timeout(SHUTDOWN_WAIT);
    ExitCode::from(code)
}

/// Why the command line was not parsed.
enum Parsed {
    /// clap's own error, --help or --version.
    Clap(clap::Error),
    /// The `serve --config` file could not be used.
    Failed(fail::Failure),
}

/// Parses `argv`; with `serve --config FILE`, again with the file's flags appended
/// (`config::file_args`), so flags and environment variables override the file.
fn parse(argv: Vec<std::ffi::OsString>) -> Result<cli::Cli, Parsed> {
    use clap::CommandFactory;
    let first = cli::Cli::try_parse_from(&argv).map_err(Parsed::Clap)?;
    let cli::Command::Serve(cli::ServeArgs { config: Some(path), .. }) = &first.command else {
        return Ok(first);
    };
    let extra =
        config::file_args(&cli::Cli::command(), &argv, path, |v| std::env::var_os(v).is_some())
            .map_err(Parsed::Failed)?;
    let mut all = argv;
    all.extend(extra);
    cli::Cli::try_parse_from(all).map_err(Parsed::Clap)
}

/// Whether the command line asks for JSON output (`--json`, `-o json`, `--output=json`, ...),
/// read before clap parses it so that even a bad command line's error is JSON.
fn wants_json(argv: &[std::ffi::OsString]) -> bool {
    let words: Vec<String> = argv.iter().map(|a| a.to_string_lossy().into_owned()).collect();
    words.iter().enumerate().any(|(i, w)| match w.as_str() {
        "--json" | "-ojson" | "-o=json" | "--output=json" => true,
        "-o" | "--output" => words.get(i + 1).is_some_and(|n| n == "json"),
        _ => false,
    })
}

/// Reports a failure that happened before the command ran, and its exit code.
fn fail(f: &fail::Failure, json: bool) -> ExitCode {
    fail::say(&if json { f.json_line() } else { f.line() });
    ExitCode::from(f.code)
}

/// Logs on stderr through `tracing`, filtered by RUST_LOG, as text or JSON lines. Default: none
/// for one-shot commands (their contract is one `error:` line on stderr; `RUST_LOG=warn` shows the
/// retries behind it), `info` for serve, whose start, shutdown and session events are worth seeing.
fn init_logs(cli: &cli::Cli) {
    use tracing_subscriber::EnvFilter;
    let default = if matches!(cli.command, cli::Command::Serve(_)) { "info" } else { "off" };
    let mut filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    // serve's audit log is on whatever RUST_LOG says, unless RUST_LOG names its target itself.
    let names_audit = std::env::var("RUST_LOG").is_ok_and(|v| v.contains("idalloc::audit"));
    if matches!(cli.command, cli::Command::Serve(_)) && !names_audit {
        if let Ok(d) = "idalloc::audit=info".parse() {
            filter = filter.add_directive(d);
        }
    }
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match cli.log_format {
        cli::LogFormat::Json => builder.json().try_init(),
        cli::LogFormat::Text => builder.with_ansi(false).try_init(),
    };
}

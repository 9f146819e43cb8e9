//! `idalloc`: the command-line front of the idalloc library. See `idalloc --help` and
//! docs/cli.md.

#![forbid(unsafe_code)]

mod batch;
mod cli;
mod commands;
mod connect;
mod docgen;
mod fail;
mod list;
mod open;
mod parse;
mod progress;
mod reach;
mod remotes;
mod render;
mod serve;
mod watch;

use std::process::ExitCode;

use clap::Parser;

/// How long the exit waits for blocking work (a file store's commit in progress) to finish.
const SHUTDOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

fn main() -> ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
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
                _ => {
                    eprintln!("error: {}", fail::clap_line(&e.render().to_string()));
                    ExitCode::from(fail::USAGE)
                }
            };
        }
    };
    init_logs(&cli);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(fail::RUNTIME);
        }
    };
    let code = match runtime.block_on(commands::run(cli)) {
        Ok(code) => code,
        Err(f) => {
            eprintln!("{}", f.line());
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

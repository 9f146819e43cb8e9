//! `idalloc`: the command-line front of the idalloc library (issue 4). See `idalloc --help` and
//! docs/cli.md.

#![forbid(unsafe_code)]

mod batch;
mod cli;
mod commands;
mod connect;
mod fail;
mod open;
mod parse;
mod progress;
mod remotes;
mod render;
mod watch;

use std::process::ExitCode;

use clap::Parser;

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
    // Background tasks (an etcd watch, a file store's lease reaper) must not delay the exit.
    runtime.shutdown_background();
    ExitCode::from(code)
}

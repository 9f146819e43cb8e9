//! Shell completions and man pages, generated from the clap definitions the
//! parser itself uses (`Cli::command()`), so they cannot drift from the commands: a new command
//! or flag shows up in both with no second list to keep. Nothing installs them; docs/guide/cli.md and
//! each command's --help say where they go.

use std::path::Path;

use clap::CommandFactory;
use clap_complete::Shell;

use crate::cli::{Cli, ShellArg};
use crate::fail::Failure;

/// The program name the scripts complete and the pages are titled with.
const BIN: &str = "idalloc";

/// The completion script for `shell`.
pub fn completions(shell: ShellArg) -> Vec<u8> {
    let shell = match shell {
        ShellArg::Bash => Shell::Bash,
        ShellArg::Zsh => Shell::Zsh,
        ShellArg::Fish => Shell::Fish,
    };
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), BIN, &mut out);
    if shell == Shell::Bash {
        out.extend(bash_pools().into_bytes());
    }
    out
}

/// The flags every command takes (`idalloc options`), with their help and environment
/// variables, as kubectl's `options` lists its global flags.
pub fn options() -> String {
    let globals: Vec<clap::Arg> =
        Cli::command().get_arguments().filter(|a| a.is_global_set()).cloned().collect();
    let mut cmd = clap::Command::new(BIN)
        .disable_help_flag(true)
        .disable_version_flag(true)
        .help_template(
            "The following options can be passed to any command, before or after it:\n\n{all-args}\n",
        )
        .args(globals);
    cmd.render_help().to_string()
}

/// The commands whose first operand is a pool name (`acquire`, `pool show`, ...), as space-joined
/// paths, read from the parser: their positional argument `pool`, and `pool delete`'s `name`.
fn pool_operand_commands() -> Vec<String> {
    fn walk(cmd: &clap::Command, above: &str, out: &mut Vec<String>) {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            let path = if above.is_empty() {
                sub.get_name().to_string()
            } else {
                format!("{above} {}", sub.get_name())
            };
            let first = sub.get_positionals().next().map(|a| a.get_id().as_str());
            if first == Some("pool") || path == "pool delete" {
                out.push(path.clone());
            }
            walk(sub, &path, out);
        }
    }
    let mut out = Vec::new();
    walk(&Cli::command(), "", &mut out);
    out
}

/// Bash: pool names completed from the store or server (`idalloc __complete pools`, with the
/// global flags typed on the line and the environment), wrapped around clap's static
/// completion. A pool name is completed as the first operand of the commands of
/// [`pool_operand_commands`]; everything else is clap's.
fn bash_pools() -> String {
    let mut cmd = Cli::command();
    cmd.build();
    // Flags that take a value: the word after them is that value, not an operand.
    let mut valued: Vec<String> = Vec::new();
    let mut global: Vec<String> = Vec::new();
    fn collect(cmd: &clap::Command, valued: &mut Vec<String>, global: &mut Vec<String>) {
        for a in cmd.get_arguments() {
            let takes = a.get_action().takes_values();
            let names: Vec<String> = a
                .get_long()
                .map(|l| format!("--{l}"))
                .into_iter()
                .chain(a.get_short().map(|s| format!("-{s}")))
                .collect();
            for n in names {
                if takes && !valued.contains(&n) {
                    valued.push(n.clone());
                }
                if a.is_global_set() && !global.contains(&n) {
                    global.push(n);
                }
            }
        }
        for sub in cmd.get_subcommands() {
            collect(sub, valued, global);
        }
    }
    collect(&cmd, &mut valued, &mut global);
    let commands = pool_operand_commands();
    format!(
        r#"
# Pool names: asked of the store or server the line names (global flags typed, environment).
_idalloc_pool_names() {{
    local valued=" {valued} " global=" {global} " commands="|{commands}|"
    local i=1 w path="" operands=0 args=() cur="${{COMP_WORDS[COMP_CWORD]}}"
    local prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    [[ "$cur" == -* || ( "$COMP_CWORD" -gt 1 && "$valued" == *" $prev "* ) ]] && return 1
    while [[ $i -lt $COMP_CWORD ]]; do
        w="${{COMP_WORDS[i]}}"
        if [[ "$w" == -* ]]; then
            if [[ "$global" == *" ${{w%%=*}} "* ]]; then
                args+=("$w")
                if [[ "$w" != *=* && "$valued" == *" $w "* ]]; then
                    i=$((i + 1)); args+=("${{COMP_WORDS[i]}}")
                fi
            elif [[ "$w" != *=* && "$valued" == *" $w "* ]]; then
                i=$((i + 1))
            fi
        elif [[ "$commands" == *"|${{path:+$path }}$w|"* || ( -z "$path" && "$commands" == *"|$w "* ) ]]; then
            path="${{path:+$path }}$w"
        elif [[ -z "$path" ]]; then
            return 1
        else
            operands=$((operands + 1))
        fi
        i=$((i + 1))
    done
    [[ "$commands" == *"|$path|"* && $operands -eq 0 ]] || return 1
    COMPREPLY=( $(compgen -W "$("${{COMP_WORDS[0]}}" "${{args[@]}}" __complete pools 2>/dev/null)" -- "$cur") )
    return 0
}}

_idalloc_with_pools() {{
    _idalloc_pool_names || _idalloc "$@"
}}

complete -F _idalloc_with_pools -o bashdefault -o default idalloc
"#,
        valued = valued.join(" "),
        global = global.join(" "),
        commands = commands.join("|"),
    )
}

/// The main man page (section 1), in roff.
pub fn man_page() -> Result<Vec<u8>, Failure> {
    let mut out = Vec::new();
    clap_mangen::Man::new(Cli::command())
        .render(&mut out)
        .map_err(|e| Failure::runtime(format!("rendering the man page: {e}")))?;
    Ok(out)
}

/// Writes `idalloc.1` and one page per (visible) subcommand into `dir`, which must exist.
pub fn man_pages_to(dir: &Path) -> Result<(), Failure> {
    if !dir.is_dir() {
        return Err(Failure::usage(format!(
            "--dir {:?}: not an existing directory (create it first)",
            dir.display().to_string()
        )));
    }
    clap_mangen::generate_to(Cli::command(), dir).map_err(|e| {
        Failure::runtime(format!("writing man pages into {:?}: {e}", dir.display().to_string()))
    })
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::process::{Command, Stdio};

    use super::*;

    /// Every command path of the parser, from the clap definitions (`pool create`, `acquire`,
    /// ...), hidden ones and clap's own `help` left out.
    fn command_paths() -> Vec<Vec<String>> {
        fn walk(cmd: &clap::Command, above: &[String], out: &mut Vec<Vec<String>>) {
            for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help")
            {
                let mut path = above.to_vec();
                path.push(sub.get_name().to_string());
                walk(sub, &path, out);
                out.push(path);
            }
        }
        let mut cmd = Cli::command();
        cmd.build();
        let mut out = Vec::new();
        walk(&cmd, &[], &mut out);
        out
    }

    fn shells() -> [ShellArg; 3] {
        [ShellArg::Bash, ShellArg::Zsh, ShellArg::Fish]
    }

    #[test]
    fn the_command_list_is_read_from_the_parser() {
        let paths = command_paths();
        // The walk sees the nesting (a command under `pool`) and the commands of this item.
        assert!(paths.iter().any(|p| p.len() == 2 && p[0] == "pool"), "{paths:?}");
        for name in ["completions", "man"] {
            assert!(paths.iter().any(|p| p == &[name.to_string()]), "{name} in {paths:?}");
        }
    }

    #[test]
    fn completions_name_every_command_and_flag_for_each_shell() {
        let paths = command_paths();
        let mut cmd = Cli::command();
        cmd.build();
        let flags: Vec<String> =
            cmd.get_arguments().filter_map(|a| a.get_long()).map(|l| format!("--{l}")).collect();
        assert!(flags.iter().any(|f| f == "--store"), "{flags:?}");
        for shell in shells() {
            let script = String::from_utf8(completions(shell)).unwrap();
            assert!(script.len() > 1000, "{shell:?}: a real script, not {} bytes", script.len());
            // Each shell's way of registering the completion: the script is for that shell.
            let registers = match shell {
                ShellArg::Bash => "complete -F _idalloc",
                ShellArg::Zsh => "#compdef idalloc",
                ShellArg::Fish => "complete -c idalloc",
            };
            assert!(script.contains(registers), "{shell:?} script lacks {registers:?}");
            for path in &paths {
                let name = path.last().unwrap();
                // How each shell's script offers a command (a mention alone could be any word).
                let entry = match shell {
                    // The case label of the command's parent and its name: `idalloc,acquire)`,
                    // `idalloc__subcmd__pool,create)`.
                    ShellArg::Bash => {
                        let parent: Vec<String> = std::iter::once("idalloc".to_string())
                            .chain(path[..path.len() - 1].iter().map(|p| format!("subcmd__{p}")))
                            .collect();
                        format!("{},{name})", parent.join("__"))
                    }
                    ShellArg::Zsh => format!("'{name}:"),
                    ShellArg::Fish => format!("-a \"{name}\""),
                };
                assert!(script.contains(&entry), "{shell:?} script lacks {entry} ({path:?})");
            }
            // fish names long flags without their dashes (`-l store`).
            for flag in &flags {
                let bare = flag.trim_start_matches('-');
                assert!(
                    script.contains(flag.as_str()) || script.contains(&format!("-l {bare}")),
                    "{shell:?} script lacks {flag}"
                );
            }
        }
    }

    #[test]
    fn bash_accepts_the_bash_script() {
        let script = completions(ShellArg::Bash);
        let mut bash = Command::new("bash")
            .args(["-n", "/dev/stdin"])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("bash is installed where the tests run");
        bash.stdin.take().unwrap().write_all(&script).unwrap();
        let out = bash.wait_with_output().unwrap();
        assert!(out.status.success(), "bash -n: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Renders a page with groff (`-k`: UTF-8 input through preconv, as `man` does) and every
    /// warning on (`-ww`) but "cannot adjust line" (a long unbreakable token such as a URL list):
    /// the plain text, or `None` without groff. Fails the test on any warning or error.
    fn groff(page: &[u8]) -> Option<String> {
        let mut groff = Command::new("groff")
            .args(["-k", "-man", "-Tutf8", "-ww", "-Wbreak"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .ok()?;
        groff.stdin.take().unwrap().write_all(page).unwrap();
        let out = groff.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && err.trim().is_empty(), "groff: {err}");
        // Drop overstrike bold/underline (`X\bX`, `_\bX`) to compare plain words.
        let raw = String::from_utf8_lossy(&out.stdout).to_string();
        let mut plain = String::new();
        let mut chars = raw.chars().peekable();
        while let Some(c) = chars.next() {
            if chars.peek() == Some(&'\u{8}') {
                chars.next();
                continue;
            }
            plain.push(c);
        }
        Some(plain)
    }

    /// The page parses (groff renders it without a warning; without groff, the roff's
    /// structure is checked instead) and has the usual sections and every command.
    #[test]
    fn the_man_page_renders_with_every_command() {
        let page = man_page().unwrap();
        let roff = String::from_utf8(page.clone()).unwrap();
        assert!(roff.contains("\n.TH idalloc 1"), "title line: {roff}");
        let text = groff(&page).unwrap_or_else(|| roff.replace(".SH ", ""));
        for section in ["NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "SUBCOMMANDS"] {
            assert!(text.contains(section), "no {section} section:\n{text}");
        }
        for path in command_paths().iter().filter(|p| p.len() == 1) {
            assert!(text.contains(&format!("idalloc-{}", path[0])), "{path:?} not listed:\n{text}");
        }
    }

    #[test]
    fn man_dir_writes_a_page_per_command() {
        let dir = tempfile::tempdir().unwrap();
        man_pages_to(dir.path()).unwrap();
        for path in command_paths() {
            let file = dir.path().join(format!("idalloc-{}.1", path.join("-")));
            let page = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            groff(&page);
        }
        assert!(dir.path().join("idalloc.1").is_file());
        let missing = dir.path().join("nope");
        let e = man_pages_to(&missing).unwrap_err();
        assert!(e.message.contains("nope") && e.message.contains("not an existing directory"));
    }
}

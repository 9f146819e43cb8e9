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
    match shell {
        Shell::Zsh => {
            // The pool operands get a value of their own, replaced in the script by the function
            // that asks for the pools' names.
            clap_complete::generate(shell, &mut marked_pool_operands(), BIN, &mut out);
            let script = String::from_utf8_lossy(&out)
                .replace(&format!(":({ZSH_MARK})'"), ":_idalloc_pools'");
            return zsh_with_pools(&script).into_bytes();
        }
        _ => clap_complete::generate(shell, &mut Cli::command(), BIN, &mut out),
    }
    match shell {
        Shell::Bash => out.extend(bash_pools().into_bytes()),
        Shell::Fish => out.extend(fish_pools().into_bytes()),
        _ => {}
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

/// The commands whose first operand is an existing pool's name (`acquire`, `pool show`, ...),
/// as space-joined paths, with that operand's id, read from the parser: their positional
/// argument `pool`, and the `name` of `pool delete` and `pool resize`.
fn pool_operands() -> Vec<(String, String)> {
    fn walk(cmd: &clap::Command, above: &str, out: &mut Vec<(String, String)>) {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            let path = if above.is_empty() {
                sub.get_name().to_string()
            } else {
                format!("{above} {}", sub.get_name())
            };
            if let Some(first) = sub.get_positionals().next().map(|a| a.get_id().as_str()) {
                if first == "pool" || path == "pool delete" || path == "pool resize" {
                    out.push((path.clone(), first.to_string()));
                }
            }
            walk(sub, &path, out);
        }
    }
    let mut out = Vec::new();
    walk(&Cli::command(), "", &mut out);
    out
}

/// The commands of [`pool_operands`].
fn pool_operand_commands() -> Vec<String> {
    pool_operands().into_iter().map(|(path, _)| path).collect()
}

/// The value zsh's script is generated with for a pool operand, then replaced.
const ZSH_MARK: &str = "IDALLOC_POOL_NAMES";

/// The parser with each pool operand given the one possible value [`ZSH_MARK`], so that clap's
/// zsh script names it where the operand's completion goes. Only for generating scripts: the
/// parser that runs commands is [`Cli::command`].
fn marked_pool_operands() -> clap::Command {
    fn mark(cmd: clap::Command, path: &[&str], id: &str) -> clap::Command {
        match path.split_first() {
            // `mut_args` keeps the arguments' order (`mut_arg` moves the argument last, after
            // the operands that follow it).
            None => cmd.mut_args(|a| if a.get_id() == id { a.value_parser([ZSH_MARK]) } else { a }),
            // `mut_subcommands` keeps the commands' order, as the script lists them.
            Some((first, rest)) => cmd.mut_subcommands(|sub| {
                if sub.get_name() == *first {
                    mark(sub, rest, id)
                } else {
                    sub
                }
            }),
        }
    }
    pool_operands().into_iter().fold(Cli::command(), |cmd, (path, id)| {
        let path: Vec<&str> = path.split(' ').collect();
        mark(cmd, &path, &id)
    })
}

/// The flags that take a value and the global flags, long and short, as typed (`--store`,
/// `-o`): the words a completion function must skip or pass on to `__complete`.
fn flag_words() -> (Vec<String>, Vec<String>) {
    let mut cmd = Cli::command();
    cmd.build();
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
    (valued, global)
}

/// Zsh: clap's script, whose pool operands complete with `_idalloc_pools`: the names
/// `idalloc __complete pools` prints, asked with the global flags typed on the line and the
/// environment. The words before the cursor are kept by `_idalloc` as it starts
/// (`_idalloc_words`): where a pool is completed, `$words` holds only the subcommand's.
fn zsh_with_pools(script: &str) -> String {
    let (valued, global) = flag_words();
    let function = format!(
        r#"
# Pool names: asked of the store or server the line names (global flags typed, environment).
(( $+functions[_idalloc_pools] )) ||
_idalloc_pools() {{
    local valued=" {valued} " global=" {global} " w
    local -a typed args pools
    local -i i=2
    typed=( "${{(@Q)_idalloc_words}}" )
    (( $#typed )) || return 1
    while (( i <= $#typed )); do
        w="$typed[i]"
        if [[ "$w" == -* && "$global" == *" ${{w%%=*}} "* ]]; then
            args+=("$w")
            if [[ "$w" != *=* && "$valued" == *" $w "* ]]; then
                i+=1; args+=("$typed[i]")
            fi
        fi
        i+=1
    done
    pools=( ${{(f)"$("$typed[1]" "${{args[@]}}" __complete pools 2>/dev/null)"}} )
    compadd -a pools
}}
"#,
        valued = valued.join(" "),
        global = global.join(" "),
    );
    // `_idalloc` keeps the words before the cursor (a local: seen by the functions it calls).
    let script = script.replacen(
        "\n_idalloc() {\n",
        "\n_idalloc() {\n    local -a _idalloc_words; _idalloc_words=( \"${(@)words[1,CURRENT-1]}\" )\n",
        1,
    );
    // Defined before the lines that run or register `_idalloc`.
    match script.rfind("\nif [ \"$funcstack[1]\" = \"_idalloc\" ]") {
        Some(at) => format!("{}{function}{}", &script[..at], &script[at..]),
        None => format!("{function}{script}"),
    }
}

/// Fish: pool names completed from the store or server (`idalloc __complete pools`, with the
/// global flags typed on the line and the environment) as the first operand of the commands of
/// [`pool_operand_commands`], by the same walk over the words as bash's. clap's fish script
/// completes flags and commands only.
fn fish_pools() -> String {
    let (valued, global) = flag_words();
    let quote = |words: &[String]| -> String {
        words.iter().map(|w| format!("'{w}'")).collect::<Vec<_>>().join(" ")
    };
    format!(
        r#"
# Pool names: asked of the store or server the line names (global flags typed, environment).
# Prints the global flags typed (one per line) and succeeds if the word being completed is a
# pool operand.
function __fish_idalloc_pool_args
    set -l valued {valued}
    set -l global {global}
    set -l commands {commands}
    set -l words (commandline -opc)
    string match -q -- '-*' (commandline -ct); and return 1
    set -l path ''
    set -l operands 0
    set -l args
    set -l i 2
    while test $i -le (count $words)
        set -l w $words[$i]
        if string match -q -- '-*' $w
            set -l takes 0
            if not string match -q -- '*=*' $w; and contains -- $w $valued
                set takes 1
            end
            if contains -- (string split -m 1 -- = $w)[1] $global
                set -a args $w
            end
            if test $takes = 1
                set i (math $i + 1)
                test $i -le (count $words); or return 1
                contains -- (string split -m 1 -- = $w)[1] $global; and set -a args $words[$i]
            end
        else if contains -- (string trim -- "$path $w") $commands; or begin
                test -z "$path"; and string match -q -- "$w *" $commands
            end
            set path (string trim -- "$path $w")
        else if test -z "$path"
            return 1
        else
            set operands (math $operands + 1)
        end
        set i (math $i + 1)
    end
    contains -- "$path" $commands; and test $operands -eq 0; or return 1
    for a in $args
        echo $a
    end
    return 0
end

function __fish_idalloc_pools
    set -l args (__fish_idalloc_pool_args); or return
    set -l words (commandline -opc)
    $words[1] $args __complete pools 2>/dev/null
end

complete -c idalloc -n "__fish_idalloc_pool_args >/dev/null" -f -a "(__fish_idalloc_pools)" -d pool
"#,
        valued = quote(&valued),
        global = quote(&global),
        commands = quote(&pool_operand_commands()),
    )
}

/// Bash: pool names completed from the store or server (`idalloc __complete pools`, with the
/// global flags typed on the line and the environment), wrapped around clap's static
/// completion. A pool name is completed as the first operand of the commands of
/// [`pool_operand_commands`]; everything else is clap's.
fn bash_pools() -> String {
    let (valued, global) = flag_words();
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

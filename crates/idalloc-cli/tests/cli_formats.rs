//! The output formats (`-o text|json|yaml|wide|name`, `--json`), the same on a store and through
//! `idalloc serve`; errors as JSON on stderr under `-o json`; the global flags under their own
//! help heading and `idalloc options`; `serve --config FILE` and the environment over it; bash,
//! zsh and fish completing pool names.

use std::path::Path;
use std::process::Command;

use idalloc_testkit::cli::Ran;
use idalloc_testkit::serve::Serve;
use serde_json::Value;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_idalloc")
}

/// `idalloc ARGS` in `dir` with `env` set (and the store and server variables cleared).
fn run(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Ran {
    idalloc_testkit::cli::run(bin(), dir, env, args)
}

/// The YAML documents of `text` (each starts with `---`), as JSON values.
fn yaml_docs(text: &str) -> Vec<Value> {
    assert!(text.starts_with("---\n"), "{text:?}");
    text.split("---\n")
        .skip(1)
        .map(|d| serde_yaml_ng::from_str::<Value>(d).expect("a YAML document"))
        .collect()
}

fn json_docs(text: &str) -> Vec<Value> {
    text.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect()
}

/// Every format of every command that prints results, on a file store and through serve: the
/// same output and exit code on both; YAML is the JSON documents; name prints the names; wide
/// adds columns; errors under -o json are `{"kind","message"}` on stderr, exit code unchanged.
#[test]
fn every_format_answers_alike_on_a_store_and_through_serve() {
    let direct = tempfile::tempdir().expect("tempdir");
    let served = tempfile::tempdir().expect("tempdir");
    let keys = direct.path().join("keys.txt");
    std::fs::write(&keys, "k1\nk2\n").expect("keys");
    let keys = keys.to_str().expect("utf-8").to_string();
    let direct_store = format!("file:{}", direct.path().join("ids.redb").display());
    let served_store = format!("file:{}", served.path().join("ids.redb").display());
    let serve = Serve::start(bin(), &["--store", &served_store], &[]);
    let url = format!("http://{}", serve.addr());
    let both = |args: &[&str]| -> Ran {
        let a = run(direct.path(), &[("IDALLOC_STORE", &direct_store)], args);
        let b = run(served.path(), &[("IDALLOC_SERVER", &url)], args);
        assert_eq!((a.code, &a.stdout, &a.stderr), (b.code, &b.stdout, &b.stderr), "{args:?}");
        a
    };

    let setup: Vec<Vec<&str>> = vec![
        vec!["pool", "create", "p", "--range", "1-100", "--strategy", "lowest"],
        vec!["pool", "create", "q", "--range", "1-10", "--reserve", "2"],
        vec!["acquire", "p", "a"],
        vec!["acquire", "p", "--from", &keys, "--holder", "bob"],
    ];
    for args in &setup {
        assert_eq!(both(args).code, 0, "{args:?}");
    }
    // Each command in every format: YAML holds the JSON documents, name the names.
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (vec!["pool", "list"], vec!["p", "q"]),
        (vec!["pool", "show", "p"], vec!["p"]),
        (vec!["list", "p"], vec!["a", "k1", "k2"]),
        (vec!["list", "p", "--holder", "bob"], vec!["k1", "k2"]),
        (vec!["list", "q"], vec![]),
        (vec!["get", "p", "k1"], vec!["k1"]),
        (vec!["lookup", "p", "1"], vec!["a"]),
        (vec!["acquire", "p", "a"], vec!["a"]),
        (vec!["acquire", "p", "--from", &keys], vec!["k1", "k2"]),
        (vec!["pool", "create", "p", "--range", "1-100", "--strategy", "lowest"], vec!["p"]),
    ];
    for (args, names) in &cases {
        let with = |f: &str| {
            let mut a = vec!["-o", f];
            a.extend(args.iter().copied());
            both(&a)
        };
        let json = with("json");
        let yaml = with("yaml");
        let name = with("name");
        let wide = with("wide");
        let text = both(args);
        for r in [&json, &yaml, &name, &wide, &text] {
            assert_eq!(r.code, 0, "{args:?}: {r:?}");
        }
        let j = json_docs(&json.stdout);
        let y = yaml_docs(&yaml.stdout);
        assert_eq!(y, j, "{args:?}: YAML is the JSON documents:\n{}", yaml.stdout);
        // --json is -o json.
        let mut old = vec!["--json"];
        old.extend(args.iter().copied());
        assert_eq!(both(&old).stdout, json.stdout, "{args:?}");
        assert_eq!(name.stdout.lines().collect::<Vec<_>>(), *names, "{args:?}");
        assert!(!text.stdout.is_empty(), "{args:?}");
    }
    // status (whose store and endpoint differ between the two): its pools' names.
    for env in [[("IDALLOC_STORE", direct_store.as_str())], [("IDALLOC_SERVER", url.as_str())]] {
        let r = run(direct.path(), &env, &["-o", "name", "status"]);
        assert_eq!((r.code, r.stdout.as_str()), (0, "p\nq\n"), "{r:?}");
        let y = yaml_docs(&run(direct.path(), &env, &["-o", "yaml", "status"]).stdout);
        assert_eq!(y[0]["pools"], serde_json::json!(["p", "q"]));
    }
    // wide: more columns than the text, with --no-headers honoured.
    let t = both(&["pool", "list"]).stdout;
    let w = both(&["-o", "wide", "pool", "list"]).stdout;
    assert!(t.starts_with("NAME  RANGE  BOUND  FREE  USED\n"), "{t}");
    assert!(
        w.starts_with("NAME  RANGE  BOUND  FREE  USED  CAPACITY  QUARANTINED  STRATEGY"),
        "{w}"
    );
    let q = w.lines().find(|l| l.starts_with("q ")).expect("q's row");
    assert_eq!(
        q.split_whitespace().collect::<Vec<_>>(),
        ["q", "1-10", "0", "9", "0.0%", "9", "0", "random", "0x0", "2", "0ms", "0ms"]
    );
    let w = both(&["-o", "wide", "--no-headers", "get", "p", "k1"]).stdout;
    assert_eq!(w.split_whitespace().collect::<Vec<_>>(), ["2", "k1"], "{w}");
    let w = both(&["-o", "wide", "acquire", "p", "k1"]).stdout;
    assert_eq!(w, "ID  KEY  NEW  HOLDER\n2   k1   no   alice\n");

    // Errors: under -o json a `{"kind","message"}` line on stderr, with the same exit code as
    // the text error; nothing on stdout.
    for (args, code, kind) in [
        (vec!["get", "p", "nokey"], 3, "not_found"),
        (vec!["get", "nopool", "k"], 3, "pool_not_found"),
        (vec!["acquire", "p", ""], 2, "invalid_input"),
        (vec!["pool", "create", "p", "--range", "1-5"], 1, "range_mismatch"),
        (vec!["get", "p"], 2, "invalid_input"),
    ] {
        let text = both(&args);
        assert_eq!(text.code, code, "{args:?}: {text:?}");
        assert!(text.stderr.starts_with("error: "), "{text:?}");
        let mut a = vec!["-o", "json"];
        a.extend(args.iter().copied());
        let r = both(&a);
        assert_eq!((r.code, r.stdout.as_str()), (code, ""), "{args:?}: {r:?}");
        let e: Value = serde_json::from_str(r.stderr.trim_end()).expect("a JSON error");
        assert_eq!(e["kind"], kind, "{args:?}: {e}");
        assert_eq!(
            format!("error: {}", e["message"].as_str().expect("message")),
            text.stderr.trim_end(),
            "{args:?}"
        );
    }
    // -o name of a command without names: refused before it runs.
    let r = both(&["-o", "name", "version"]);
    assert!(r.code == 2 && r.stderr.contains("-o name"), "{r:?}");
    // --json and another -o disagree: refused.
    let r = both(&["--json", "-o", "yaml", "pool", "list"]);
    assert_eq!(r.code, 2, "{r:?}");
}

/// `list` in each format, the same on a store and through serve: text `ID KEY HOLDERS`; wide
/// adds the hexadecimal ID, the number of references and how many are leased; `--no-headers`
/// drops the header line of both; name prints the keys; JSON and YAML one document; `--holder`
/// and `--key-prefix` apply to every format. Through serve, a client session's reference
/// counts as leased.
#[test]
fn list_in_each_format() {
    let direct = tempfile::tempdir().expect("tempdir");
    let served = tempfile::tempdir().expect("tempdir");
    let direct_store = format!("file:{}", direct.path().join("ids.redb").display());
    let served_store = format!("file:{}", served.path().join("ids.redb").display());
    let serve = Serve::start(bin(), &["--store", &served_store], &[]);
    let url = format!("http://{}", serve.addr());
    let both = |args: &[&str]| -> String {
        let a = run(direct.path(), &[("IDALLOC_STORE", &direct_store)], args);
        let b = run(served.path(), &[("IDALLOC_SERVER", &url)], args);
        assert_eq!((a.code, &a.stdout, &a.stderr), (b.code, &b.stdout, &b.stderr), "{args:?}");
        assert_eq!(a.code, 0, "{args:?}: {a:?}");
        a.stdout
    };
    both(&["pool", "create", "v", "--range", "1-300", "--strategy", "lowest"]);
    both(&["pool", "create", "empty", "--range", "1-9"]);
    for (key, holder) in [("a", "x"), ("a", "y"), ("b", "y")] {
        both(&["acquire", "v", key, "--holder", holder]);
    }
    // Keys are other people's data: escaped in the tables, as they are in JSON.
    both(&["acquire", "v", "tab\there", "--holder", "x"]);

    assert_eq!(
        both(&["list", "v"]),
        "ID  KEY        HOLDERS\n1   a          x,y\n2   b          y\n3   tab\\there  x\n"
    );
    // Without the header, the columns stay as wide as with it.
    assert_eq!(
        both(&["--no-headers", "list", "v"]),
        "1   a          x,y\n2   b          y\n3   tab\\there  x\n"
    );
    assert_eq!(
        both(&["-o", "wide", "list", "v"]),
        "ID  HEX  KEY        REFS  LEASED  HOLDERS\n\
         1   0x1  a          2     0       x,y\n\
         2   0x2  b          1     0       y\n\
         3   0x3  tab\\there  1     0       x\n"
    );
    assert_eq!(
        both(&["-o", "wide", "--no-headers", "list", "v", "--holder", "y"]),
        "1   0x1  a    2     0       x,y\n2   0x2  b    1     0       y\n"
    );
    assert_eq!(both(&["-o", "name", "list", "v"]), "a\nb\ntab\\there\n");
    assert_eq!(both(&["-o", "name", "list", "v", "--key-prefix", "t"]), "tab\\there\n");
    let json = both(&["-o", "json", "list", "v", "--holder", "x"]);
    assert_eq!(
        json_docs(&json),
        [serde_json::json!({"pool": "v", "bindings": [
            {"id": 1, "key": "a", "holders": ["x", "y"]},
            {"id": 3, "key": "tab\there", "holders": ["x"]},
        ]})]
    );
    assert_eq!(yaml_docs(&both(&["-o", "yaml", "list", "v", "--holder", "x"])), json_docs(&json));
    // An empty pool: the header alone, or nothing without it; empty documents.
    assert_eq!(both(&["list", "empty"]), "ID  KEY  HOLDERS\n");
    assert_eq!(both(&["-o", "wide", "list", "empty"]), "ID  HEX  KEY  REFS  LEASED  HOLDERS\n");
    assert_eq!(both(&["-o", "wide", "--no-headers", "list", "empty"]), "");
    assert_eq!(both(&["-o", "name", "list", "empty"]), "");
    assert_eq!(
        json_docs(&both(&["-o", "json", "list", "empty"])),
        [serde_json::json!({"pool": "empty", "bindings": []})]
    );
    assert_eq!(
        yaml_docs(&both(&["-o", "yaml", "list", "empty"])),
        [serde_json::json!({"pool": "empty", "bindings": []})]
    );

    // A client session's reference is leased: its holder is the `session:` name the service
    // gave it.
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let client =
        idalloc_client::Client::new([url.as_str()], idalloc_client::ClientOptions::default())
            .expect("client");
    let session = rt.block_on(async {
        let s = client.session(std::time::Duration::from_secs(30)).await.expect("session");
        let pool = client.pool("v").await.expect("pool");
        s.acquire(&pool, "b").await.expect("acquire");
        s
    });
    let r = run(served.path(), &[("IDALLOC_SERVER", &url)], &["-o", "wide", "list", "v"]);
    let b: Vec<&str> = r.stdout.lines().nth(2).expect("b's row").split_whitespace().collect();
    assert_eq!(b[..5], ["2", "0x2", "b", "2", "1"], "{r:?}");
    assert!(b[5].starts_with("session:lease-") && b[5].ends_with(",y"), "{r:?}");
    rt.block_on(session.end()).expect("end the session");
}

/// A command's --help shows its own flags first and the global ones under their own heading;
/// `idalloc options` lists the global ones.
#[test]
fn global_flags_have_their_own_heading_and_options_lists_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let r = run(dir.path(), &[], &["acquire", "--help"]);
    assert_eq!(r.code, 0, "{r:?}");
    let at = |s: &str| r.stdout.find(s).unwrap_or_else(|| panic!("{s:?} in {}", r.stdout));
    assert!(at("--holder") < at("Global options:"), "{}", r.stdout);
    assert!(at("Global options:") < at("--endpoints"), "{}", r.stdout);
    let r = run(dir.path(), &[], &["options"]);
    assert_eq!(r.code, 0, "{r:?}");
    for flag in ["--store", "--endpoints", "--server", "--output", "--timeout"] {
        assert!(r.stdout.contains(flag), "{flag}: {}", r.stdout);
    }
    assert!(!r.stdout.contains("--holder") && !r.stdout.contains("--listen"), "{}", r.stdout);
}

/// `serve --config FILE`: its keys are the long flags; flags and the environment override it;
/// an unknown key is an error naming it and the allowed ones.
#[test]
fn serve_reads_a_config_file_under_its_flags_and_environment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("file:{}", dir.path().join("ids.redb").display());
    let config = dir.path().join("serve.toml");
    let config_s = config.to_str().expect("utf-8");
    std::fs::write(&config, "sweep_interval = \"5s\"\n").expect("config");
    let r = run(dir.path(), &[], &["--store", &store, "serve", "--config", config_s]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(
        r.stderr.contains("unknown key \"sweep_interval\"") && r.stderr.contains("sweep-interval,"),
        "{r:?}"
    );
    std::fs::write(&config, "max-body = 10\nwatch-history = 5\n").expect("config");

    // A body over the file's limit is refused; a flag and the environment raise it.
    let body = r#"{"key":"a-key-of-some-length","holder":"h"}"#;
    let post = |s: &Serve| -> u16 {
        let agent = ureq::Agent::config_builder().http_status_as_error(false).build().new_agent();
        let r = agent
            .post(&s.http("/v1/pools/p/acquire"))
            .header("content-type", "application/json")
            .send(body)
            .expect("answer");
        r.status().as_u16()
    };
    let from_file = Serve::start(bin(), &["--store", "memory:"], &["--config", config_s]);
    assert_eq!(post(&from_file), 413);
    drop(from_file);
    let flag = Serve::start(
        bin(),
        &["--store", "memory:"],
        &["--config", config_s, "--max-body", "100000"],
    );
    assert_eq!(post(&flag), 404, "the pool does not exist: the body was read");
    drop(flag);
    std::env::set_var("IDALLOC_MAX_BODY", "100000");
    let env = Serve::start(bin(), &["--store", "memory:"], &["--config", config_s]);
    std::env::remove_var("IDALLOC_MAX_BODY");
    assert_eq!(post(&env), 404, "the environment overrides the file");
}

/// A store with pools `vni`, `vxlan` and `ids` in `dir`, and its URL.
fn store_with_pools(dir: &Path) -> String {
    let store = format!("file:{}", dir.join("ids.redb").display());
    for p in ["vni", "vxlan", "ids"] {
        let r = run(dir, &[], &["--store", &store, "pool", "create", p, "--range", "1-9"]);
        assert_eq!(r.code, 0, "{r:?}");
    }
    store
}

/// The script of `idalloc completions SHELL`, written to `dir/file`.
fn completion_script(dir: &Path, shell: &str, file: &str) -> String {
    let script = run(dir, &[], &["completions", shell]);
    assert_eq!(script.code, 0, "{script:?}");
    std::fs::write(dir.join(file), &script.stdout).expect("script");
    script.stdout
}

/// `shell ARGS` in `dir`, with this build's `idalloc` first on PATH and no store or server in
/// the environment: its stdout, trimmed.
fn in_shell(dir: &Path, shell: &str, args: &[&str]) -> String {
    let bin_dir = Path::new(bin()).parent().expect("bin dir");
    let o = Command::new(shell)
        .args(args)
        .env("PATH", format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default()))
        .env_remove("IDALLOC_STORE")
        .env_remove("IDALLOC_SERVER")
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{shell}: {e}"));
    assert!(o.status.success(), "{shell} {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// Whether `shell` can be run here (scripts/test.sh installs bash, zsh and fish).
fn have(shell: &str) -> bool {
    let found =
        Command::new(shell).arg("-c").arg("true").output().is_ok_and(|o| o.status.success());
    if !found {
        eprintln!("{shell} is not installed: only the script's text is checked");
    }
    found
}

/// Completion lines and the pool names (or other words) each completes to, the same in every
/// shell: a pool name as the first operand of the commands that take one, wherever the global
/// flags are; the key after the pool and flags are not pool names; `pool create` names a new
/// pool. `{st}` is `--store=URL`.
fn completion_cases(st: &str) -> Vec<(String, &'static str)> {
    vec![
        (format!("idalloc {st} get v"), "vni vxlan"),
        (format!("idalloc {st} pool show "), "ids vni vxlan"),
        (format!("idalloc {st} pool resize "), "ids vni vxlan"),
        (format!("idalloc {st} acquire --holder h i"), "ids"),
        (format!("idalloc list {st} vx"), "vxlan"),
        (format!("idalloc -o json {} get v", st.replace('=', " ")), "vni vxlan"),
        (format!("idalloc {st} acquire vni v"), ""),
        (format!("idalloc {st} pool create v"), ""),
        (format!("idalloc {st} acquire vni --ho"), "--holder"),
        ("idalloc sta".to_string(), "status"),
    ]
}

/// The bash completion script completes pool names from the store the line (or environment)
/// names, as the first operand of the commands that take a pool; elsewhere clap's completion.
#[test]
fn bash_completes_pool_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store_with_pools(dir.path());
    let script = completion_script(dir.path(), "bash", "idalloc.bash");
    assert!(script.contains("__complete pools"), "the script asks idalloc for the pools");
    let complete = |line: &str| -> String {
        let words: Vec<&str> = line.split(' ').collect();
        let cmd = format!(
            "source idalloc.bash; COMP_WORDS=({}); COMP_CWORD={}; COMPREPLY=(); \
             _idalloc_with_pools idalloc \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"; \
             echo \"${{COMPREPLY[*]}}\"",
            words.iter().map(|w| format!("'{w}'")).collect::<Vec<_>>().join(" "),
            words.len() - 1,
        );
        in_shell(dir.path(), "bash", &["--norc", "-c", &cmd])
    };
    for (line, want) in completion_cases(&format!("--store={store}")) {
        assert_eq!(complete(&line), want, "{line}");
    }
}

/// zsh: each pool operand's completion is `_idalloc_pools`, which asks `idalloc __complete
/// pools` with the global flags typed; run in a real interactive zsh (on a pseudo-terminal, by
/// tests/fixtures/zsh-complete.zsh), a TAB offers what bash offers.
#[test]
fn zsh_completes_pool_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store_with_pools(dir.path());
    let script = completion_script(dir.path(), "zsh", "_idalloc");
    assert!(script.contains("__complete pools"), "the script asks idalloc for the pools");
    // The pool operands of `get`, `pool show`, `check` ... complete with it, none with files.
    let operands: Vec<&str> = script
        .lines()
        .filter(|l| l.starts_with("':pool --") || l.starts_with("'::pool --"))
        .collect();
    assert!(operands.len() >= 8, "{operands:?}");
    for l in operands {
        assert!(l.ends_with(":_idalloc_pools' \\"), "{l}");
    }
    if !have("zsh") {
        return;
    }
    let driver = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/zsh-complete.zsh");
    let driver = driver.to_str().expect("utf-8");
    let mut cases = completion_cases(&format!("--store={store}"));
    // The command's own words, whatever comes before them on the line.
    cases.push((
        format!("true; IDALLOC_LOG_FORMAT=text idalloc --store={store} get v"),
        "vni vxlan",
    ));
    for (line, want) in cases {
        let got = in_shell(dir.path(), "zsh", &["-f", driver, &line]);
        assert_eq!(got.split_whitespace().collect::<Vec<_>>().join(" "), want, "{line}");
    }
}

/// fish: a completion for the pool operands that lists `idalloc __complete pools` with the
/// global flags typed; `complete -C` in a real fish offers what bash offers.
#[test]
fn fish_completes_pool_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store_with_pools(dir.path());
    let script = completion_script(dir.path(), "fish", "idalloc.fish");
    assert!(script.contains("__complete pools"), "the script asks idalloc for the pools");
    assert!(script.contains("-a \"(__fish_idalloc_pools)\""), "and offers what it says");
    if !have("fish") {
        return;
    }
    let mut cases = completion_cases(&format!("--store={store}"));
    // The command's own words, whatever comes before them on the line.
    cases.push((
        format!("true; IDALLOC_LOG_FORMAT=text idalloc --store={store} get v"),
        "vni vxlan",
    ));
    for (line, want) in cases {
        let cmd = format!("source idalloc.fish; complete -C '{line}'");
        let got = in_shell(dir.path(), "fish", &["--no-config", "-c", &cmd]);
        // fish prints `MATCH\tDESCRIPTION` lines.
        let names: Vec<&str> = got.lines().filter_map(|l| l.split('\t').next()).collect();
        assert_eq!(names.join(" "), want, "{line}");
    }
}

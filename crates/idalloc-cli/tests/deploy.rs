//! What operators load from `deploy/` names only what a running `idalloc serve` exports, and every
//! relative link of the documentation leads to a file that exists.
//!
//! The dashboard (`deploy/grafana/*.json`) and the alert rules (`deploy/prometheus/*.yml`) are
//! parsed; every PromQL expression in them is parsed with a real PromQL parser (a syntax error
//! fails), and every series it selects must be in the `/metrics` scrape of a real `serve` process
//! (file store, free loopback port) after one of each operation, with the labels the expression
//! matches on, groups by and prints in annotations. Histogram series are checked as the exporter
//! writes them (`…_bucket`, `…_sum`, `…_count` of a metric whose `# TYPE` is `histogram`), and
//! `rate()`/`increase()` must be given a counter or a histogram's series, never a gauge. The
//! remote-view metrics, which `serve` does not export (it runs no remote views), come from the
//! library with a remote view in this process, rendered by the same exporter.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{plain_agent, request};
use promql_parser::label::Matchers;
use promql_parser::parser::{self, Expr, LabelModifier};
use serde::Deserialize;
use serde_json::{json, Value};

fn repo_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}

/// Labels Prometheus adds to every scraped series (not in the scrape itself).
const TARGET_LABELS: &[&str] = &["instance", "job"];
/// Series Prometheus makes itself, not the exporter.
const PROMETHEUS_SERIES: &[&str] = &["up"];

// --- the scrape ---------------------------------------------------------------------------------

/// What `/metrics` exports: per series name, its label names; per metric family, its `# TYPE`.
#[derive(Debug, Default)]
struct Exported {
    series: BTreeMap<String, BTreeSet<String>>,
    types: BTreeMap<String, String>,
}

impl Exported {
    /// Parses Prometheus text format (label values are quoted and may hold `,`, `}` or `\"`).
    fn parse(text: &str) -> Exported {
        let mut out = Exported::default();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut it = rest.split_whitespace();
                if let (Some(name), Some(ty)) = (it.next(), it.next()) {
                    out.types.insert(name.to_string(), ty.to_string());
                }
                continue;
            }
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let name_end = line.find(['{', ' ']).unwrap_or(line.len());
            let name = &line[..name_end];
            let labels = out.series.entry(name.to_string()).or_default();
            if line[name_end..].starts_with('{') {
                let mut rest = &line[name_end + 1..];
                while let Some(eq) = rest.find('=') {
                    labels.insert(rest[..eq].trim_start_matches([',', ' ']).to_string());
                    // Skip the quoted value.
                    let v = &rest[eq + 2..];
                    let mut end = 0;
                    let mut escaped = false;
                    for (i, c) in v.char_indices() {
                        match (escaped, c) {
                            (true, _) => escaped = false,
                            (false, '\\') => escaped = true,
                            (false, '"') => {
                                end = i;
                                break;
                            }
                            _ => {}
                        }
                    }
                    rest = &v[end + 1..];
                    if rest.starts_with('}') {
                        break;
                    }
                }
            }
        }
        out
    }

    /// The `# TYPE` of the metric family that series `name` belongs to.
    fn type_of(&self, name: &str) -> Option<&str> {
        if let Some(t) = self.types.get(name) {
            return Some(t);
        }
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(base) = name.strip_suffix(suffix) {
                if let Some(t) = self.types.get(base) {
                    return (t == "histogram" || (t == "summary" && suffix != "_bucket"))
                        .then_some(t.as_str());
                }
            }
        }
        None
    }
}

// --- PromQL ---------------------------------------------------------------------------------------

/// One series selector of an expression.
#[derive(Debug)]
struct Selector {
    name: String,
    matched_labels: Vec<String>,
    /// Given to `rate`, `irate` or `increase`.
    rated: bool,
}

/// Everything an expression asks of the scrape.
#[derive(Debug, Default)]
struct Needs {
    selectors: Vec<Selector>,
    /// Labels in `by (...)`, `without (...)`, `on (...)`, `ignoring (...)`.
    grouping: Vec<String>,
}

fn matcher_names(m: &Matchers) -> Vec<String> {
    m.matchers
        .iter()
        .chain(m.or_matchers.iter().flatten())
        .map(|m| m.name.clone())
        .filter(|n| n != "__name__")
        .collect()
}

fn collect(e: &Expr, rated: bool, needs: &mut Needs) {
    match e {
        Expr::VectorSelector(vs) => needs.selectors.push(Selector {
            name: vs.name.clone().expect("every selector names its metric"),
            matched_labels: matcher_names(&vs.matchers),
            rated,
        }),
        Expr::MatrixSelector(ms) => needs.selectors.push(Selector {
            name: ms.vs.name.clone().expect("every selector names its metric"),
            matched_labels: matcher_names(&ms.vs.matchers),
            rated,
        }),
        Expr::Aggregate(a) => {
            if let Some(m) = &a.modifier {
                needs.grouping.extend(m.labels().labels.iter().cloned());
            }
            collect(&a.expr, false, needs);
            if let Some(p) = &a.param {
                collect(p, false, needs);
            }
        }
        Expr::Binary(b) => {
            if let Some(m) = &b.modifier {
                if let Some(card) = &m.matching {
                    needs.grouping.extend(card.labels().labels.iter().cloned());
                }
            }
            collect(&b.lhs, false, needs);
            collect(&b.rhs, false, needs);
        }
        Expr::Call(c) => {
            let rates = matches!(c.func.name, "rate" | "irate" | "increase");
            for a in &c.args.args {
                collect(a, rates, needs);
            }
        }
        Expr::Paren(p) => collect(&p.expr, rated, needs),
        Expr::Unary(u) => collect(&u.expr, rated, needs),
        Expr::Subquery(s) => collect(&s.expr, false, needs),
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => {}
    }
}

/// The labels an alert's result carries (what `$labels.X` in its annotations can print).
fn output_labels(e: &Expr, exported: &Exported) -> BTreeSet<String> {
    let with_target = |name: &Option<String>| -> BTreeSet<String> {
        let mut s = name.as_ref().and_then(|n| exported.series.get(n)).cloned().unwrap_or_default();
        s.extend(TARGET_LABELS.iter().map(|l| l.to_string()));
        s
    };
    match e {
        Expr::VectorSelector(vs) => with_target(&vs.name),
        Expr::MatrixSelector(ms) => with_target(&ms.vs.name),
        Expr::Aggregate(a) => match &a.modifier {
            Some(LabelModifier::Include(l)) => l.labels.iter().cloned().collect(),
            Some(LabelModifier::Exclude(l)) => {
                let mut s = output_labels(&a.expr, exported);
                for x in &l.labels {
                    s.remove(x);
                }
                s
            }
            None => BTreeSet::new(),
        },
        Expr::Binary(b) => match (&*b.lhs, &*b.rhs) {
            (Expr::NumberLiteral(_), r) => output_labels(r, exported),
            (l, _) => output_labels(l, exported),
        },
        Expr::Call(c) => {
            c.args.args.first().map(|a| output_labels(a, exported)).unwrap_or_default()
        }
        Expr::Paren(p) => output_labels(&p.expr, exported),
        Expr::Unary(u) => output_labels(&u.expr, exported),
        Expr::Subquery(s) => output_labels(&s.expr, exported),
        _ => BTreeSet::new(),
    }
}

/// Grafana's variables, replaced by values that keep the query valid PromQL.
fn expand_grafana(q: &str) -> String {
    let mut s = q.to_string();
    for (var, value) in [
        ("$__rate_interval", "5m"),
        ("$__interval", "1m"),
        ("$__range", "1h"),
        ("$instance", ".*"),
        ("$pool", ".*"),
    ] {
        s = s.replace(var, value);
    }
    assert!(!s.contains('$'), "an unknown Grafana variable in {q:?}");
    s
}

fn parse(what: &str, q: &str) -> Expr {
    parser::parse(q).unwrap_or_else(|e| panic!("{what}: PromQL does not parse: {e}\n  {q}"))
}

/// Checks what `expr` needs against the scrape; returns one line per problem.
fn check_expr(what: &str, expr: &Expr, exported: &Exported) -> Vec<String> {
    let mut needs = Needs::default();
    collect(expr, false, &mut needs);
    let mut problems = Vec::new();
    let mut labels_in_expr: BTreeSet<String> =
        TARGET_LABELS.iter().map(|l| l.to_string()).collect();
    for s in &needs.selectors {
        if PROMETHEUS_SERIES.contains(&s.name.as_str()) {
            continue;
        }
        let Some(labels) = exported.series.get(&s.name) else {
            problems.push(format!("{what}: {} is not exported", s.name));
            continue;
        };
        labels_in_expr.extend(labels.iter().cloned());
        for l in &s.matched_labels {
            if !labels.contains(l) && !TARGET_LABELS.contains(&l.as_str()) {
                problems.push(format!("{what}: {} has no label {l:?} (it has {labels:?})", s.name));
            }
        }
        let ty = exported.type_of(&s.name);
        if s.rated
            && !(ty == Some("counter")
                || s.name.ends_with("_count")
                || s.name.ends_with("_sum")
                || s.name.ends_with("_bucket"))
        {
            problems.push(format!(
                "{what}: rate/increase of {} which is a {} (a counter or a histogram's series is needed)",
                s.name,
                ty.unwrap_or("metric of unknown type")
            ));
        }
        if ["_bucket", "_sum", "_count"].iter().any(|x| s.name.ends_with(x))
            && !exported.types.contains_key(&s.name)
            && ty != Some("histogram")
            && ty != Some("summary")
        {
            problems.push(format!("{what}: {} is not a series of a histogram", s.name));
        }
    }
    for g in &needs.grouping {
        if !labels_in_expr.contains(g) {
            problems.push(format!("{what}: groups by {g:?}, a label none of its series has"));
        }
    }
    problems
}

// --- the files ------------------------------------------------------------------------------------

/// Every PromQL query of a Grafana dashboard, with where it is: panel targets (also inside rows)
/// and `label_values(SELECTOR, LABEL)` template variables (as the selector, plus the label).
fn dashboard_queries(dash: &Value) -> Vec<(String, String, Option<String>)> {
    fn panels<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
        for p in v.as_array().into_iter().flatten() {
            out.push(p);
            panels(&p["panels"], out);
        }
    }
    let mut all = Vec::new();
    panels(&dash["panels"], &mut all);
    let mut out = Vec::new();
    for p in all {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap_or_else(|| panic!("target without expr: {t}"));
            out.push((format!("panel {:?} {}", p["title"], t["refId"]), expr.to_string(), None));
        }
    }
    for v in dash["templating"]["list"].as_array().into_iter().flatten() {
        if v["type"] != "query" {
            continue;
        }
        let q = v["query"]["query"].as_str().or(v["query"].as_str()).expect("variable query");
        let inner =
            q.strip_prefix("label_values(").and_then(|r| r.strip_suffix(')')).unwrap_or_else(
                || panic!("variable {}: only label_values(...) is checked: {q}", v["name"]),
            );
        let (selector, label) = inner.rsplit_once(',').expect("label_values(SELECTOR, LABEL)");
        out.push((
            format!("variable {}", v["name"]),
            selector.trim().to_string(),
            Some(label.trim().to_string()),
        ));
    }
    out
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    groups: Vec<RuleGroup>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleGroup {
    name: String,
    #[serde(default)]
    interval: Option<String>,
    rules: Vec<Rule>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Rule {
    alert: String,
    expr: String,
    #[serde(rename = "for", default)]
    for_: Option<String>,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

fn files_in(dir: &str, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(repo_root().join(dir))
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no *.{ext} in {dir}");
    v
}

fn rule_files() -> Vec<(PathBuf, RuleFile)> {
    files_in("deploy/prometheus", "yml")
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("read rules");
            let f: RuleFile = serde_yaml_ng::from_str(&text)
                .unwrap_or_else(|e| panic!("{}: not a Prometheus rule file: {e}", p.display()));
            (p, f)
        })
        .collect()
}

/// `$labels.NAME` references in a template.
fn label_refs(t: &str) -> Vec<String> {
    t.split("$labels.")
        .skip(1)
        .map(|r| r.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect())
        .collect()
}

// --- the serve process ----------------------------------------------------------------------------

/// A running `idalloc serve` on a file store in its own directory (the testkit's launcher);
/// SIGKILLed and reaped on drop.
struct Serve {
    process: idalloc_testkit::serve::Serve,
    _dir: tempfile::TempDir,
}

impl Serve {
    fn start() -> Serve {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = format!("file:{}", dir.path().join("ids.redb").display());
        let process = idalloc_testkit::serve::Serve::start(
            env!("CARGO_BIN_EXE_idalloc"),
            &["--store", &store],
            &[],
        );
        Serve { process, _dir: dir }
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, String) {
        let agent = plain_agent(Duration::from_secs(30));
        let body = body.map(|b| b.to_string());
        let r = request(&agent, method, &self.process.http(path), None, body.as_deref())
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        (r.status, r.text)
    }

    fn ok(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let (status, text) = self.call(method, path, body);
        assert!((200..300).contains(&status), "{method} {path}: {status} {text}");
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }
}

/// One of each operation, then the scrape (once the sweeper has run on the pool).
fn scrape_after_every_operation() -> Exported {
    let s = Serve::start();
    s.ok("GET", "/readyz", None);
    s.ok("POST", "/v1/pools", Some(json!({"name": "p", "min": 1, "max": 100})));
    s.ok("GET", "/v1/pools", None);
    s.ok("GET", "/v1/pools/p", None);
    let a = s.ok("POST", "/v1/pools/p/acquire", Some(json!({"key": "a", "holder": "h"})));
    let id = a["id"].as_u64().expect("id");
    s.ok("POST", "/v1/pools/p/acquire", Some(json!({"keys": ["b", "c"], "holder": "h"})));
    let sid = s.ok("POST", "/v1/sessions", Some(json!({"ttl": 10})))["session"]
        .as_str()
        .expect("session id")
        .to_string();
    s.ok("POST", "/v1/pools/p/acquire", Some(json!({"key": "s", "session": sid})));
    s.ok("PUT", &format!("/v1/sessions/{sid}/keepalive"), None);
    s.ok("GET", "/v1/pools/p/keys/a?consistent=true", None);
    s.ok("GET", &format!("/v1/pools/p/ids/{id}"), None);
    s.ok("GET", "/v1/pools/p/bindings", None);
    s.ok("POST", "/v1/pools/p/release", Some(json!({"key": "a", "holder": "h"})));
    s.ok("POST", "/v1/pools/p/release", Some(json!({"key": "s", "session": sid})));
    s.ok("POST", "/v1/pools/p/sweep", None);
    let (status, _) = s.call("POST", "/v1/pools/p/acquire", Some(json!({"key": "x"})));
    assert_eq!(status, 400);
    s.ok("DELETE", &format!("/v1/sessions/{sid}"), None);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, text) = s.call("GET", "/metrics", None);
        assert_eq!(status, 200, "{text}");
        let e = Exported::parse(&text);
        if e.series.contains_key("idalloc_pool_capacity") || Instant::now() > deadline {
            return e;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The library's remote-view metrics (DESIGN §12), which `serve` does not export (it runs no
/// remote views): a pool with a view of another store's pool, in this process, with the same
/// Prometheus exporter `serve` installs, rendered as `serve` renders `/metrics`.
fn scrape_of_a_library_with_a_remote_view() -> Exported {
    use idalloc::store::embedded::EmbeddedStore;
    use idalloc::store::Store;
    use idalloc::{Allocator, AllocatorOptions, PoolSpec, RemoteOptions};
    let handle = idalloc_server::install_prometheus().expect("the test's only recorder");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let local = Allocator::new(EmbeddedStore::memory(), AllocatorOptions::default())
            .expect("allocator");
        let pool =
            local.ensure_pool(&PoolSpec::new("r", 1, 0xffff).prefix(1 << 16)).await.expect("pool");
        let remote_store: Arc<dyn Store> = Arc::new(EmbeddedStore::memory());
        let remote =
            Allocator::from_arc(remote_store.clone(), AllocatorOptions::default()).expect("remote");
        let rpool =
            remote.ensure_pool(&PoolSpec::new("r", 1, 0xffff).prefix(2 << 16)).await.expect("pool");
        rpool.acquire_durable("k", "h").await.expect("remote acquire");
        let view = pool
            .watch_remote("b", remote_store, RemoteOptions::default())
            .await
            .expect("remote view");
        tokio::time::timeout(Duration::from_secs(10), view.wait_synced())
            .await
            .expect("the view syncs");
        let text = handle.render();
        let _ = local.close().await;
        let _ = remote.close().await;
        Exported::parse(&text)
    })
}

// --- the tests ------------------------------------------------------------------------------------

#[test]
fn the_dashboard_and_the_alert_rules_name_only_exported_metrics() {
    let mut exported = scrape_after_every_operation();
    let library = scrape_of_a_library_with_a_remote_view();
    assert!(library.series.contains_key("idalloc_remote_view_state"), "{library:?}");
    for (name, labels) in library.series {
        exported.series.entry(name).or_default().extend(labels);
    }
    exported.types.extend(library.types);
    // The scrape parser itself: a histogram's series, a counter and a gauge with their labels.
    assert_eq!(exported.type_of("idalloc_operation_duration_seconds_bucket"), Some("histogram"));
    assert!(exported.series["idalloc_operation_duration_seconds_bucket"].contains("le"));
    assert_eq!(exported.type_of("idalloc_store_requests_total"), Some("counter"));
    assert_eq!(exported.type_of("idalloc_pool_free_ids"), Some("gauge"));

    let mut problems = Vec::new();
    let mut used = BTreeSet::new();
    for path in files_in("deploy/grafana", "json") {
        let dash: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("read"))
            .unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()));
        let queries = dashboard_queries(&dash);
        assert!(queries.len() >= 15, "{}: only {} queries", path.display(), queries.len());
        for (what, q, label) in queries {
            let what = format!("{} {what}", path.display());
            let expr = parse(&what, &expand_grafana(&q));
            let mut needs = Needs::default();
            collect(&expr, false, &mut needs);
            used.extend(needs.selectors.iter().map(|s| s.name.clone()));
            problems.extend(check_expr(&what, &expr, &exported));
            if let (Some(label), Expr::VectorSelector(vs)) = (label, &expr) {
                let has = vs.name.as_ref().and_then(|n| exported.series.get(n));
                if !has.is_some_and(|l| l.contains(&label))
                    && !TARGET_LABELS.contains(&label.as_str())
                {
                    problems.push(format!(
                        "{what}: label_values of {label:?}, not a label of {:?}",
                        vs.name
                    ));
                }
            }
        }
    }
    for (path, file) in rule_files() {
        for g in &file.groups {
            for r in &g.rules {
                let what = format!("{} alert {}", path.display(), r.alert);
                let expr = parse(&what, &r.expr);
                let mut needs = Needs::default();
                collect(&expr, false, &mut needs);
                used.extend(needs.selectors.iter().map(|s| s.name.clone()));
                problems.extend(check_expr(&what, &expr, &exported));
                let out = output_labels(&expr, &exported);
                for t in r.annotations.values() {
                    for l in label_refs(t) {
                        if !out.contains(&l) {
                            problems.push(format!(
                                "{what}: an annotation prints $labels.{l}, which the expression's result does not have ({out:?})"
                            ));
                        }
                    }
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "deploy/ names what serve does not export:\n{}",
        problems.join("\n")
    );

    // Coverage the other way: every idalloc metric family is on the dashboard.
    for family in exported.types.keys().filter(|n| n.starts_with("idalloc_")) {
        let shown = used.iter().any(|u| {
            u == family
                || ["_bucket", "_sum", "_count"].iter().any(|x| *u == format!("{family}{x}"))
        });
        assert!(shown, "{family} is exported but neither the dashboard nor an alert uses it");
    }
}

#[test]
fn the_alert_rules_are_well_formed() {
    let mut names = BTreeSet::new();
    for (path, file) in rule_files() {
        let p = path.display();
        assert!(!file.groups.is_empty(), "{p}: no groups");
        for g in &file.groups {
            assert!(!g.name.is_empty(), "{p}: a group without a name");
            if let Some(i) = &g.interval {
                promql_parser::util::parse_duration(i)
                    .unwrap_or_else(|e| panic!("{p}: group {}: interval {i:?}: {e}", g.name));
            }
            assert!(!g.rules.is_empty(), "{p}: group {} has no rules", g.name);
            for r in &g.rules {
                let a = &r.alert;
                assert!(names.insert(a.clone()), "{p}: alert {a} twice");
                assert!(
                    a.starts_with("Idalloc") && a.chars().all(|c| c.is_ascii_alphanumeric()),
                    "{p}: alert name {a:?}: CamelCase starting with Idalloc"
                );
                if let Some(f) = &r.for_ {
                    promql_parser::util::parse_duration(f)
                        .unwrap_or_else(|e| panic!("{p}: {a}: for {f:?}: {e}"));
                }
                let sev = r.labels.get("severity").map(String::as_str);
                assert!(
                    matches!(sev, Some("warning" | "critical")),
                    "{p}: {a}: severity label {sev:?}: warning or critical"
                );
                for k in ["summary", "description"] {
                    assert!(
                        r.annotations.get(k).is_some_and(|v| !v.trim().is_empty()),
                        "{p}: {a}: no {k} annotation"
                    );
                }
                // Alerts compare: an expression without a comparison or a set operation would
                // fire on every series it returns.
                assert!(
                    [" < ", " > ", " == ", " != ", " >= ", " <= "]
                        .iter()
                        .any(|o| r.expr.contains(o)),
                    "{p}: {a}: the expression compares nothing"
                );
            }
        }
    }
    assert!(names.len() >= 8, "{names:?}");
}

/// Every Markdown page under `dir`, its subdirectories included (the book's parts).
fn md_pages_under(dir: &Path) -> Vec<PathBuf> {
    let mut pages = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                pages.push(p);
            }
        }
    }
    pages.sort();
    pages
}

/// Every relative link `[text](path)` in README.md and the Markdown pages under docs/ leads to
/// a file or directory that exists (anchors and URLs with a scheme are not checked here:
/// `scripts/check-links.py` checks anchors too).
#[test]
fn relative_links_in_the_docs_lead_to_existing_files() {
    let root = repo_root();
    let mut pages = vec![root.join("README.md")];
    pages.extend(md_pages_under(&root.join("docs")));
    assert!(pages.len() > 20, "only {} pages found under docs/", pages.len());
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).expect("read page");
        let mut in_code = false;
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("```") {
                in_code = !in_code;
                continue;
            }
            if in_code {
                continue;
            }
            let mut rest = line;
            while let Some(i) = rest.find("](") {
                let after = &rest[i + 2..];
                let Some(end) = after.find(')') else { break };
                let target = after[..end].split_whitespace().next().unwrap_or("");
                rest = &after[end..];
                let path = target.split('#').next().unwrap_or("");
                if path.is_empty() || path.contains("://") || path.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                let resolved = page.parent().expect("page dir").join(path);
                if !resolved.exists() {
                    broken.push(format!(
                        "{}:{}: {target} ({})",
                        page.strip_prefix(&root).unwrap_or(page).display(),
                        n + 1,
                        resolved.display()
                    ));
                }
            }
        }
    }
    assert!(checked > 10, "only {checked} links found: is the link parser broken?");
    assert!(broken.is_empty(), "links to files that do not exist:\n{}", broken.join("\n"));
}

// --- systemd and Kubernetes -----------------------------------------------------------------------

fn serve_help() -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_idalloc"))
        .args(["serve", "--help"])
        .output()
        .expect("run idalloc serve --help");
    assert!(out.status.success());
    String::from_utf8(out.stdout).expect("utf-8 help")
}

/// `--flag` and `--flag=value` tokens of a command line, as flag names.
fn flags_of<'a>(words: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    words
        .into_iter()
        .filter(|w| w.starts_with("--"))
        .map(|w| w.split('=').next().unwrap_or(w).to_string())
        .collect()
}

/// `IDALLOC_…` names in a text.
fn env_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("IDALLOC_") {
        let name: String = rest[i..]
            .chars()
            .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        rest = &rest[i + name.len()..];
        out.insert(name);
    }
    out
}

/// The systemd unit and its etcd drop-in use only flags and variables `serve` has, and every
/// credential path (`%d/NAME`) is one the unit loads.
#[test]
fn the_systemd_unit_uses_real_flags_and_loaded_credentials() {
    let help = serve_help();
    for f in ["idalloc.service", "idalloc-etcd.conf"] {
        let text =
            std::fs::read_to_string(repo_root().join("deploy/systemd").join(f)).expect("read unit");
        let mut exec = 0;
        for line in text.lines() {
            let Some(cmd) = line.strip_prefix("ExecStart=") else { continue };
            if cmd.is_empty() {
                continue; // resets the unit's ExecStart in a drop-in
            }
            exec += 1;
            let words: Vec<&str> = cmd.split_whitespace().collect();
            assert!(words.contains(&"serve"), "{f}: {cmd}");
            for flag in flags_of(words) {
                assert!(help.contains(&format!("{flag} ")), "{f}: {flag} is not a serve flag");
            }
        }
        assert_eq!(exec, 1, "{f}: one ExecStart");
        for name in env_names(&text) {
            assert!(help.contains(&format!("[env: {name}")), "{f}: {name} is not read by serve");
        }
        let loaded: BTreeSet<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("LoadCredential="))
            .map(|c| c.split(':').next().unwrap_or(c))
            .collect();
        for part in text.split("%d/").skip(1) {
            let id: String = part.chars().take_while(|c| !c.is_whitespace() && *c != '"').collect();
            assert!(loaded.contains(id.as_str()), "{f}: %d/{id} is not a LoadCredential");
        }
    }
}

/// The Deployment runs `serve` with real flags and variables, probes /healthz and /readyz on the
/// port it listens on, reads every file it names from the mounted Secret, and gives the drain
/// time to finish before Kubernetes kills the pod.
#[test]
fn the_kubernetes_deployment_is_consistent_with_serve() {
    let help = serve_help();
    let text = std::fs::read_to_string(repo_root().join("deploy/kubernetes/deployment.yaml"))
        .expect("read deployment.yaml");
    let docs: Vec<serde_json::Value> = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde_yaml_ng::with::singleton_map_recursive::deserialize(d).expect("YAML"))
        .collect();
    for d in &docs {
        assert!(d["apiVersion"].is_string() && d["kind"].is_string(), "{d}");
        assert!(d["metadata"]["name"].is_string(), "{d}");
    }
    let dep = docs.iter().find(|d| d["kind"] == "Deployment").expect("a Deployment");
    let pod = &dep["spec"]["template"]["spec"];
    assert_eq!(
        dep["spec"]["selector"]["matchLabels"], dep["spec"]["template"]["metadata"]["labels"],
        "the selector must match the pod labels"
    );
    let c = &pod["containers"][0];
    let args: Vec<&str> =
        c["args"].as_array().expect("args").iter().map(|a| a.as_str().expect("arg")).collect();
    assert_eq!(args.first(), Some(&"serve"));
    for flag in flags_of(args.iter().copied()) {
        assert!(help.contains(&format!("{flag} ")), "{flag} is not a serve flag");
    }
    let arg = |name: &str| {
        args.iter().find_map(|a| a.strip_prefix(&format!("{name}="))).map(str::to_string)
    };
    let listen = arg("--listen").expect("--listen");
    let port: u64 = listen.rsplit(':').next().and_then(|p| p.parse().ok()).expect("port");
    let ports = c["ports"].as_array().expect("ports");
    let http = ports.iter().find(|p| p["name"] == "http").expect("a port named http");
    assert_eq!(http["containerPort"].as_u64(), Some(port), "containerPort is the listen port");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    let tls = arg("--tls-cert").is_some() && arg("--tls-key").is_some();
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(c[probe]["httpGet"]["port"], "http", "{probe} probes the served port");
        let scheme = c[probe]["httpGet"]["scheme"].as_str().unwrap_or("HTTP");
        assert_eq!(scheme, if tls { "HTTPS" } else { "HTTP" }, "{probe} speaks what serve serves");
    }
    // serve refuses a non-loopback --listen without TLS and client authentication.
    let loopback = listen.starts_with("127.") || listen.starts_with("[::1]");
    let client_auth = arg("--auth-tokens").is_some() || arg("--client-ca").is_some();
    assert!(
        loopback || (tls && client_auth) || args.contains(&"--insecure-listen"),
        "--listen={listen} needs --tls-cert, --tls-key and --auth-tokens or --client-ca"
    );
    let drain = arg("--drain-timeout").expect("--drain-timeout");
    let drain: u64 = drain.trim_end_matches('s').parse().expect("seconds");
    let delay =
        arg("--shutdown-delay").expect("--shutdown-delay: readiness fails before the drain");
    let delay: u64 = delay.trim_end_matches('s').parse().expect("seconds");
    assert!(delay > 0, "a shutdown delay of 0 drains before the endpoints are updated");
    let grace = pod["terminationGracePeriodSeconds"].as_u64().expect("grace period");
    assert!(
        grace > delay + drain,
        "terminationGracePeriodSeconds {grace} must exceed the delay {delay} plus the drain {drain}"
    );
    // The Service must not pin clients to a pod: any instance serves any session.
    let svc = docs.iter().find(|d| d["kind"] == "Service").expect("a Service");
    assert!(svc["spec"]["sessionAffinity"].is_null(), "stale sessionAffinity: {svc}");

    let env = c["env"].as_array().expect("env");
    let mounts: Vec<(String, String)> = c["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .map(|m| {
            (
                m["name"].as_str().expect("name").into(),
                m["mountPath"].as_str().expect("path").into(),
            )
        })
        .collect();
    let secret_volumes: BTreeSet<&str> = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .filter(|v| v["secret"]["secretName"].is_string())
        .map(|v| v["name"].as_str().expect("volume name"))
        .collect();
    let in_secret = |path: &str| {
        mounts.iter().any(|(vol, dir)| {
            path.starts_with(&format!("{dir}/")) && secret_volumes.contains(vol.as_str())
        })
    };
    for flag in ["--tls-cert", "--tls-key", "--auth-tokens", "--client-ca"] {
        if let Some(path) = arg(flag) {
            assert!(in_secret(&path), "{flag}={path} is not in a mounted Secret");
        }
    }
    let mut files = 0;
    for e in env {
        let name = e["name"].as_str().expect("env name");
        if name.starts_with("IDALLOC_") {
            assert!(help.contains(&format!("[env: {name}")), "{name} is not read by serve");
        }
        assert_ne!(name, "IDALLOC_PASSWORD", "the password comes from a file, not the env");
        if ["IDALLOC_CACERT", "IDALLOC_CERT", "IDALLOC_KEY", "IDALLOC_PASSWORD_FILE"]
            .contains(&name)
        {
            files += 1;
            let path = e["value"].as_str().expect("a path");
            assert!(in_secret(path), "{name}={path} is not in a mounted Secret");
        }
    }
    assert_eq!(files, 4, "CA, certificate, key and password files");
}

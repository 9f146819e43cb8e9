//! Turning results into text: aligned tables for people, JSON values with stable field names for
//! programs. Pure functions, so the shapes are unit-tested without a store.

use std::borrow::Cow;

use idalloc::{Binding, PoolSpec, SweepReport};
use serde_json::{json, Value};

/// True for characters a terminal may act on instead of showing: C0 and C1 controls and DEL
/// (`ESC [ ... m` rewrites colours, titles, the clipboard with OSC 52), and the bidirectional
/// overrides and isolates that reorder what is shown after them.
fn acts_on_terminal(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// A key, holder or other store-supplied string made safe for text output:
/// every character a terminal would act on is written as a Rust-style escape (`\n`, `\t`, `\r`,
/// `\u{1b}`), and a backslash as `\\` so the escaping stays reversible (two different keys never
/// print the same). Keys are data other people wrote; printed raw, `ESC ] 52 ;` or `ESC [ 2 J`
/// would act on the terminal of whoever runs `list`. `--json` output needs none of this: JSON
/// escapes control characters itself.
pub fn text(s: &str) -> Cow<'_, str> {
    escape(s, true)
}

/// Only the characters a terminal acts on escaped, backslashes kept: for error lines, whose values
/// are already quoted with `{:?}` (where doubling the backslashes would garble them) but whose
/// store-supplied reasons may still carry anything.
pub fn controls(s: &str) -> Cow<'_, str> {
    escape(s, false)
}

fn escape(s: &str, backslash: bool) -> Cow<'_, str> {
    if !s.chars().any(|c| (backslash && c == '\\') || acts_on_terminal(c)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' if backslash => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if acts_on_terminal(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Usage figures of one pool.
#[derive(Clone, Debug, PartialEq)]
pub struct Usage {
    pub spec: PoolSpec,
    /// Keys with an ID.
    pub bound: u64,
    /// IDs waiting out their reuse delay.
    pub quarantined: u64,
}

impl Usage {
    pub fn capacity(&self) -> u64 {
        self.spec.capacity()
    }
    pub fn free(&self) -> u64 {
        self.capacity().saturating_sub(self.bound.saturating_add(self.quarantined))
    }
    /// Percentage of the capacity bound or quarantined, rounded to one decimal.
    pub fn used_percent(&self) -> f64 {
        let cap = self.capacity();
        if cap == 0 {
            return 100.0;
        }
        let used = self.bound.saturating_add(self.quarantined) as f64;
        (used * 1000.0 / cap as f64).round() / 10.0
    }

    pub fn to_json(&self) -> Value {
        json!({
            "pool": self.spec.name(),
            "spec": spec_json(&self.spec),
            "capacity": self.capacity(),
            "bound": self.bound,
            "quarantined": self.quarantined,
            "free": self.free(),
            "used_percent": self.used_percent(),
        })
    }
}

/// The spec in its stored JSON form (the same field names as in the store).
pub fn spec_json(spec: &PoolSpec) -> Value {
    serde_json::to_value(spec).unwrap_or(Value::Null)
}

/// Spec records that cannot be used, as `[{"record","pool","problem"}]` (`pool` is null when the
/// record's name is not a valid pool name).
pub fn broken_json(broken: &[idalloc::records::SpecProblem]) -> Value {
    Value::Array(
        broken
            .iter()
            .map(|p| json!({"record": p.record, "pool": p.pool, "problem": p.to_string()}))
            .collect(),
    )
}

/// A finding as JSON: its fields under a `kind` tag, plus the sentence `check` prints.
pub fn finding_json(f: &idalloc::audit::Finding) -> Value {
    let mut v = serde_json::to_value(f).unwrap_or(Value::Null);
    if let Value::Object(m) = &mut v {
        m.insert("message".into(), Value::String(f.to_string()));
    }
    v
}

pub fn check_json(r: &idalloc::check::Report) -> Value {
    json!({
        "revision": r.revision,
        "breaches": r.breaches(),
        "pools": r.pools.iter().map(|p| json!({
            "pool": p.pool,
            "findings": p.findings.iter().map(finding_json).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "other": r.other.iter().map(finding_json).collect::<Vec<_>>(),
    })
}

/// `check` for people: a summary line, then one line per finding, `POOL: sentence`.
pub fn check_text(r: &idalloc::check::Report) -> String {
    let n = r.breaches();
    let mut out = format!(
        "checked {} pools at revision {}: {}\n",
        r.pools.len(),
        r.revision,
        if n == 0 { "no breaches".to_string() } else { format!("{n} breaches") }
    );
    for f in &r.other {
        out.push_str(&format!("-: {}\n", controls(&f.to_string())));
    }
    for p in &r.pools {
        for f in &p.findings {
            out.push_str(&format!("{}: {}\n", p.pool, controls(&f.to_string())));
        }
    }
    out
}

pub fn repair_json(r: &idalloc::check::RepairOutcome) -> Value {
    json!({"pool": r.pool, "finding": finding_json(&r.finding), "action": r.action,
           "applied": r.applied})
}

/// `check --repair` for people: what was fixed, what was not, what needs a person.
pub fn repairs_text(rs: &[idalloc::check::RepairOutcome]) -> String {
    let mut out = String::new();
    for r in rs {
        let pool = if r.pool.is_empty() { "-" } else { r.pool.as_str() };
        let line = match (&r.action, r.applied) {
            (Some(a), true) => format!("{pool}: fixed: {a}"),
            (Some(a), false) => {
                format!("{pool}: not fixed (its records changed since the scan; check again): {a}")
            }
            (None, _) => format!("{pool}: left for a person: {}", r.finding),
        };
        out.push_str(&controls(&line));
        out.push('\n');
    }
    out
}

/// Left-aligned columns separated by two spaces; the last column is not padded.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    table_block(header, rows, true)
}

/// [`table`] for one block of a table printed as it is read (`list`): the columns are as wide as
/// the header and this block's cells, and the header line is printed only with `show_header`.
pub fn table_block(header: &[&str], rows: &[Vec<String>], show_header: bool) -> String {
    let n = header.len();
    let mut width = vec![0usize; n];
    for (i, h) in header.iter().enumerate() {
        width[i] = h.chars().count();
    }
    for r in rows {
        for (i, c) in r.iter().enumerate().take(n) {
            width[i] = width[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<&str>, out: &mut String| {
        let mut l = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                l.push_str(c);
            } else {
                l.push_str(c);
                l.push_str(&" ".repeat(width[i] - c.chars().count() + 2));
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    if show_header {
        line(header.to_vec(), &mut out);
    }
    for r in rows {
        line(r.iter().map(String::as_str).collect(), &mut out);
    }
    out
}

pub fn pools_table(usages: &[Usage], header: bool) -> String {
    let rows: Vec<Vec<String>> = usages
        .iter()
        .map(|u| {
            vec![
                u.spec.name().to_string(),
                format!("{}-{}", u.spec.min(), u.spec.max()),
                u.bound.to_string(),
                u.free().to_string(),
                format!("{:.1}%", u.used_percent()),
            ]
        })
        .collect();
    table_block(&["NAME", "RANGE", "BOUND", "FREE", "USED"], &rows, header)
}

/// `pool list -o wide`: the table with the capacity, the quarantined IDs and the spec's other
/// fields.
pub fn pools_table_wide(usages: &[Usage], header: bool) -> String {
    let rows: Vec<Vec<String>> = usages
        .iter()
        .map(|u| {
            let s = &u.spec;
            vec![
                s.name().to_string(),
                format!("{}-{}", s.min(), s.max()),
                u.bound.to_string(),
                u.free().to_string(),
                format!("{:.1}%", u.used_percent()),
                u.capacity().to_string(),
                u.quarantined.to_string(),
                s.strategy_kind().to_string(),
                format!("{:#x}", s.prefix_bits()),
                reserved_list(s),
                format!("{}ms", s.idle_grace_duration().as_millis()),
                format!("{}ms", s.reuse_delay_duration().as_millis()),
            ]
        })
        .collect();
    table_block(
        &[
            "NAME",
            "RANGE",
            "BOUND",
            "FREE",
            "USED",
            "CAPACITY",
            "QUARANTINED",
            "STRATEGY",
            "PREFIX",
            "RESERVED",
            "IDLE-GRACE",
            "REUSE-DELAY",
        ],
        &rows,
        header,
    )
}

/// The reserved IDs as `5,7,10-20`, or `none`.
fn reserved_list(s: &PoolSpec) -> String {
    if s.reserved().is_empty() {
        return "none".to_string();
    }
    s.reserved()
        .iter()
        .map(|&(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") })
        .collect::<Vec<_>>()
        .join(",")
}

/// One YAML document of `v` (`-o yaml`), starting with `---` so that the documents of a stream
/// (watch, --from) stay apart and a single one reads the same.
pub fn yaml_doc(v: &Value) -> String {
    match serde_yaml_ng::to_string(v) {
        Ok(y) => format!("---\n{y}"),
        // A JSON value always has a YAML form; should the writer fail all the same, the JSON
        // (which is YAML too) is the document.
        Err(_) => format!("---\n{v}\n"),
    }
}

/// The names `-o name` prints of a result `v`: the keys of a listing's bindings, the pools of a
/// pool listing (or status), the key of a one-key result or event, else the pool it names.
/// A stream's notice without a key (`synced`, `lagged`) has none.
pub fn names(v: &Value) -> Vec<String> {
    let s = |v: &Value| v.as_str().map(str::to_string);
    if let Some(b) = v["bindings"].as_array() {
        return b.iter().filter_map(|b| s(&b["key"])).collect();
    }
    if let Some(p) = v["pools"].as_array() {
        return p.iter().filter_map(|p| s(p).or_else(|| s(&p["pool"]))).collect();
    }
    if let Some(k) = s(&v["key"]) {
        return vec![k];
    }
    if v.get("event").is_some() {
        return Vec::new();
    }
    s(&v["pool"]).into_iter().collect()
}

/// `pool show`: the spec one field per line, then the figures.
pub fn pool_show(u: &Usage) -> String {
    let s = &u.spec;
    let reserved = reserved_list(s);
    format!(
        "name:         {}\nrange:        {}-{}\nreserved:     {}\nprefix bits:  {:#x}\nstrategy:     {}\n\
         idle grace:   {}ms\nreuse delay:  {}ms\ncapacity:     {}\nbound:        {}\nquarantined:  {}\n\
         free:         {}\nused:         {:.1}%\n",
        s.name(),
        s.min(),
        s.max(),
        reserved,
        s.prefix_bits(),
        s.strategy_kind(),
        s.idle_grace_duration().as_millis(),
        s.reuse_delay_duration().as_millis(),
        u.capacity(),
        u.bound,
        u.quarantined,
        u.free(),
        u.used_percent()
    )
}

/// The header of `list`'s table.
pub const BINDINGS_HEADER: [&str; 3] = ["ID", "KEY", "HOLDERS"];

#[cfg(test)]
pub fn bindings_table(bindings: &[Binding]) -> String {
    table(&BINDINGS_HEADER, &bindings_rows(bindings))
}

/// `list`'s table rows: ID, key, holders (comma-separated, `-` for none), escaped.
pub fn bindings_rows(bindings: &[Binding]) -> Vec<Vec<String>> {
    bindings
        .iter()
        .map(|b| {
            vec![
                b.id.to_string(),
                text(&b.key).into_owned(),
                if b.holders.is_empty() {
                    "-".to_string()
                } else {
                    b.holders.iter().map(|h| text(h)).collect::<Vec<_>>().join(",")
                },
            ]
        })
        .collect()
}

/// The header of `list -o wide`'s table.
pub const BINDINGS_WIDE_HEADER: [&str; 6] = ["ID", "HEX", "KEY", "REFS", "LEASED", "HOLDERS"];

/// Whether `holder` is named as leased holders are: `lease:…` (the library names a process's
/// holder so) or `session:…` (`idalloc serve` names its client sessions so). Durable holders
/// may not take the first, nor the second through the service.
pub fn leased_name(holder: &str) -> bool {
    holder.starts_with(idalloc::pool::LEASED_HOLDER_PREFIX)
        || holder.starts_with(idalloc_server::sessions::SESSION_HOLDER_PREFIX)
}

/// `list -o wide`'s rows: [`bindings_rows`] with the ID in hexadecimal (where prefix bits
/// show), the number of references, and how many of them are leased by their holder's name
/// ([`leased_name`]): they go with their lease. All from the listing itself: no read per row.
pub fn bindings_rows_wide(bindings: &[Binding]) -> Vec<Vec<String>> {
    bindings
        .iter()
        .zip(bindings_rows(bindings))
        .map(|(b, mut row)| {
            let leased = b.holders.iter().filter(|h| leased_name(h)).count();
            let holders = row.pop().unwrap_or_default();
            let key = row.pop().unwrap_or_default();
            vec![
                b.id.to_string(),
                format!("{:#x}", b.id),
                key,
                b.holders.len().to_string(),
                leased.to_string(),
                holders,
            ]
        })
        .collect()
}

#[cfg(test)]
pub fn bindings_json(pool: &str, bindings: &[Binding]) -> Value {
    json!({
        "pool": pool,
        "bindings": bindings.iter().map(binding_json).collect::<Vec<_>>(),
    })
}

/// One binding of `list --json`.
pub fn binding_json(b: &Binding) -> Value {
    json!({"id": b.id, "key": b.key, "holders": b.holders})
}

/// `list --json` around its bindings, for printing them as they are read: what comes before the
/// first binding and what comes after the last, so that the whole is exactly
/// [`bindings_json`]'s document (same field order) with the bindings joined by commas.
pub fn bindings_json_frame(pool: &str) -> (String, String) {
    let whole = json!({"pool": pool, "bindings": []}).to_string();
    let mark = "\"bindings\":[";
    // The pool's name is a JSON string in `whole`: its quotes are escaped, so `mark` (which
    // starts with an unescaped quote) is found only as the field itself.
    match whole.find(mark) {
        Some(at) => {
            let split = at + mark.len();
            (whole[..split].to_string(), whole[split..].to_string())
        }
        None => (format!("{{\"pool\":{},\"bindings\":[", json!(pool)), "]}".to_string()),
    }
}

/// `list -o yaml` around its bindings: the document up to `bindings:`, and what follows the
/// sequence. Between them: a newline and each binding's [`binding_yaml`], or ` []` and a newline
/// when there is none. The whole is [`yaml_doc`] of [`bindings_json`]'s document.
pub fn bindings_yaml_frame(pool: &str) -> (String, String) {
    let whole = yaml_doc(&json!({"pool": pool, "bindings": []}));
    let mark = "\nbindings: []\n";
    // The pool's name is one line of its own (`pool: NAME`), never this one.
    match whole.find(mark) {
        Some(at) => {
            let split = at + "\nbindings:".len();
            (whole[..split].to_string(), whole[split + " []\n".len()..].to_string())
        }
        None => (format!("{}bindings:", yaml_doc(&json!({"pool": pool}))), String::new()),
    }
}

/// One binding of `list -o yaml`, as an item of the `bindings:` sequence.
pub fn binding_yaml(b: &Binding) -> String {
    serde_yaml_ng::to_string(&Value::Array(vec![binding_json(b)]))
        .unwrap_or_else(|_| format!("- {}\n", binding_json(b)))
}

pub fn sweep_json(pool: &str, r: &SweepReport) -> Value {
    json!({
        "pool": pool,
        "reclaimed": r.reclaimed.iter().map(|(id, key)| json!({"id": id, "key": key})).collect::<Vec<_>>(),
        "idle": r.idle,
        "bindings": r.bindings,
        "fence_records": r.fence_records,
        "folded": r.folded,
    })
}

/// `gc` for people: one line per reclaimed binding, then a summary per pool.
pub fn sweep_text(pool: &str, r: &SweepReport, dry_run: bool) -> String {
    let verb = if dry_run { "would reclaim" } else { "reclaimed" };
    let mut out = String::new();
    for (id, key) in &r.reclaimed {
        out.push_str(&format!("{pool}: {verb} {id} {}\n", text(key)));
    }
    out.push_str(&format!("{pool}: {verb} {} of {} bindings", r.reclaimed.len(), r.bindings));
    if r.idle > 0 {
        out.push_str(&format!("; {} unreferenced but within the idle grace", r.idle));
    }
    if r.folded > 0 {
        out.push_str(&format!("; folded {} holder fence records into the pool's floor", r.folded));
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_figures() {
        let u = Usage { spec: PoolSpec::new("p", 1, 10).reserve(1..=2), bound: 3, quarantined: 1 };
        assert_eq!(u.capacity(), 8);
        assert_eq!(u.free(), 4);
        assert_eq!(u.used_percent(), 50.0);
        let j = u.to_json();
        assert_eq!(j["pool"], "p");
        assert_eq!(j["spec"]["min"], 1);
        assert_eq!(j["free"], 4);
        let t = pools_table(&[u], true);
        assert_eq!(t, "NAME  RANGE  BOUND  FREE  USED\np     1-10   3      4     50.0%\n");
    }

    #[test]
    fn names_and_yaml() {
        let u = Usage { spec: PoolSpec::new("p", 1, 10), bound: 3, quarantined: 1 };
        let wide = pools_table_wide(std::slice::from_ref(&u), true);
        let rows: Vec<Vec<&str>> = wide.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(rows[0][5..8], ["CAPACITY", "QUARANTINED", "STRATEGY"]);
        assert_eq!(
            rows[1],
            ["p", "1-10", "3", "6", "40.0%", "10", "1", "random", "0x0", "none", "0ms", "0ms"]
        );
        assert_eq!(names(&json!({"pools": [u.to_json()], "broken": []})), ["p"]);
        assert_eq!(names(&json!({"pools": ["a", "b"]})), ["a", "b"]);
        assert_eq!(names(&json!({"pool": "p", "bindings": [{"id": 1, "key": "k"}]})), ["k"]);
        assert_eq!(names(&json!({"pool": "p", "key": "k", "id": 1})), ["k"]);
        assert_eq!(names(&json!({"pool": "p", "deleted": true})), ["p"]);
        assert!(names(&json!({"event": "synced", "pool": "p", "bindings": 3})).is_empty());
        let y = yaml_doc(&json!({"pool": "1", "id": 4}));
        assert!(y.starts_with("---\n") && y.contains("pool: '1'") && y.contains("id: 4"), "{y}");
    }

    #[test]
    fn bindings() {
        let b = vec![
            Binding { id: 3, key: "a".into(), holders: vec!["x".into(), "y".into()] },
            Binding { id: 10, key: "bb".into(), holders: vec![] },
        ];
        assert_eq!(bindings_table(&b), "ID  KEY  HOLDERS\n3   a    x,y\n10  bb   -\n");
        let j = bindings_json("p", &b);
        assert_eq!(j["bindings"][0]["holders"][1], "y");
        assert_eq!(j["bindings"][1]["id"], 10);
        // Printed a binding at a time, the document is the same, byte for byte.
        let (head, tail) = bindings_json_frame("p");
        let parts: Vec<String> = b.iter().map(|b| binding_json(b).to_string()).collect();
        assert_eq!(format!("{head}{}{tail}", parts.join(",")), j.to_string());
        let (head, tail) = bindings_json_frame("p");
        assert_eq!(format!("{head}{tail}"), bindings_json("p", &[]).to_string());
        // In YAML too, printed a binding at a time, the document is the whole one's.
        let (head, tail) = bindings_yaml_frame("p");
        let parts: String = b.iter().map(binding_yaml).collect();
        assert_eq!(format!("{head}\n{parts}{tail}"), yaml_doc(&j));
        assert_eq!(format!("{head} []\n{tail}"), yaml_doc(&bindings_json("p", &[])));
        // Blocks after the first have no header; each is as wide as the header at least.
        assert_eq!(table_block(&BINDINGS_HEADER, &bindings_rows(&b[1..]), false), "10  bb   -\n");
        // Wide: the hexadecimal ID, the references and the leased ones among them.
        let leased = Binding {
            id: 0x1000005,
            key: "k".into(),
            holders: vec!["alice".into(), "lease:h-0a0b0c0d".into(), "session:lease-7".into()],
        };
        assert_eq!(
            table(&BINDINGS_WIDE_HEADER, &bindings_rows_wide(&[b[1].clone(), leased])),
            "ID        HEX        KEY  REFS  LEASED  HOLDERS\n\
             10        0xa        bb   0     0       -\n\
             16777221  0x1000005  k    3     2       alice,lease:h-0a0b0c0d,session:lease-7\n"
        );
        assert!(!leased_name("leaser") && !leased_name("sessions") && leased_name("session:x"));
    }

    #[test]
    fn text_escapes_what_a_terminal_acts_on() {
        assert!(matches!(text("plain key/é 😀"), Cow::Borrowed(_)));
        assert_eq!(text("a\x1b[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(text("\x1b]52;c;aGk=\x07"), "\\u{1b}]52;c;aGk=\\u{7}");
        assert_eq!(text("l1\nl2\r\t"), "l1\\nl2\\r\\t");
        assert_eq!(text("\u{9b}31m\u{7f}"), "\\u{9b}31m\\u{7f}");
        assert_eq!(text("abc\u{202e}def"), "abc\\u{202e}def");
        // Reversible: a key that already spells an escape prints differently from the control.
        assert_eq!(text("\\n"), "\\\\n");
        assert_ne!(text("\\n"), text("\n"));
        for s in ["\x1b", "\u{85}", "\0", "x\u{2066}"] {
            assert!(!text(s).chars().any(acts_on_terminal), "{s:?}");
        }
    }

    #[test]
    fn tables_and_sweeps_escape_keys_and_holders() {
        let b = vec![Binding { id: 1, key: "k\x1b[31m".into(), holders: vec!["h\x07".into()] }];
        let t = bindings_table(&b);
        assert!(!t.contains('\x1b') && !t.contains('\x07'), "{t:?}");
        assert!(t.contains("k\\u{1b}[31m") && t.contains("h\\u{7}"), "{t:?}");
        let r = SweepReport {
            reclaimed: vec![(4, "\x1bk".into())],
            idle: 0,
            bindings: 1,
            revision: 1,
            ..Default::default()
        };
        assert!(sweep_text("p", &r, false).contains("reclaimed 4 \\u{1b}k\n"));
    }

    #[test]
    fn sweep_lines() {
        let r = SweepReport {
            reclaimed: vec![(4, "k".into())],
            idle: 1,
            bindings: 5,
            revision: 9,
            ..Default::default()
        };
        let t = sweep_text("p", &r, true);
        assert!(t.starts_with("p: would reclaim 4 k\n"), "{t}");
        assert!(t.contains("1 unreferenced"), "{t}");
        assert_eq!(sweep_json("p", &r)["reclaimed"][0]["key"], "k");
        assert!(!t.contains("folded"), "{t}");
        let r = SweepReport { fence_records: 120, folded: 120, ..r };
        assert!(sweep_text("p", &r, false).contains("; folded 120 holder fence records"));
        assert_eq!(sweep_json("p", &r)["folded"], 120);
    }
}

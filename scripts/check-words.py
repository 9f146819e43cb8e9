#!/usr/bin/env python3
"""The project's own words: no references to how the project was built.

Docs, comments, doc comments, test names, strings of generated pages, scripts and deployment files
name topics, guarantees, commits and measured figures. They never name the work around them: work
sessions ("session 9"), tracker numbers ("issue 21", "item 4", "issue #9"), branch names (`s9-a`),
team roles ("the lead", "reviewer") or the people at the machine ("six other engineers compiled",
"shared with other developers compiling"). Such words mean nothing to a reader outside; history
goes in commit messages.

Legitimate words stay legal: a client *session* is an API concept ("a session's lease", "session
ids", "Session 1000 holds k" in a test with a four-digit lease id); only "session" followed by a
one- or two-digit number, or in an identifier like `session_9`, is a build-history reference. The
word "helper" (a test helper, a recording helper) is legal too.

Usage: `python3 scripts/check-words.py` checks the tree and exits 1 listing every finding as
`path:line: text  [rule]`; `--self-test` plants each kind of reference (and the legal look-alikes)
in a temporary tree and fails unless exactly the planted ones are found, so the check is proven
able to fail.
"""
import os
import re
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# What is checked: these files and directories under the repository root.
TARGETS = ["README.md", "docs", "crates", "scripts", "deploy", "clients", "fuzz", "book.toml"]

# Text files by extension (and a few names without one).
EXTENSIONS = {
    ".md", ".rs", ".py", ".sh", ".toml", ".yaml", ".yml", ".json", ".csv", ".svg", ".txt",
    ".html", ".css", ".js", ".service", ".conf", ".proto", ".go", ".cfg", ".ini", ".in",
}
NAMES = {"Dockerfile", "Makefile"}

# Directories never looked into: build output, vendored or generated trees.
SKIP_DIRS = {"target", ".git", "node_modules", "__pycache__", "corpus", "artifacts", "book"}

# This file names the patterns it rejects; it is checked by its self-test instead.
SELF = os.path.normpath(os.path.abspath(__file__))

# Pages still written in work order, being split into docs/design/ and docs/benchmarks/ and
# rewritten: skipped until they are (each entry goes with its page).
PENDING = set()

RULES = [
    ("work session",
     re.compile(r"\b(?:work\s+)?sessions?\s+\d{1,2}(?:\s*(?:,|and|or|to|-|–)\s*\d{1,2})*\b(?!\s*(?:ms|s|seconds|minutes|%))",
                re.I)),
    ("work session", re.compile(r"(?<![A-Za-z])session[-_]?\d{1,2}(?:_|\b)", re.I)),
    ("issue number", re.compile(r"\bissues?\s*#?\s*\d+", re.I)),
    ("issue number", re.compile(r"(?<![A-Za-z])issue[-_]?\d+", re.I)),
    ("item number", re.compile(r"\bitems?\s+\d+\b(?!\s*(?:bytes|keys|ids|IDs|%))", re.I)),
    ("item number", re.compile(r"(?<![A-Za-z])item_?\d+(?:_|\b)", re.I)),
    ("branch name", re.compile(r"(?<![\w.-])s\d{1,2}-[a-z][a-z0-9-]*\b")),
    ("team role", re.compile(r"\bthe lead(?:'s)?\b(?!er)", re.I)),
    ("team role", re.compile(r"(?:(?<!\w)\(|;\s*)lead\s*[,)]", re.I)),
    ("team role", re.compile(r"\breviewers?\b", re.I)),
    ("branch name", re.compile(r"\bthis branch\b(?!\s+of\b)", re.I)),
    ("branch name", re.compile(r"\bmerg(?:e|ed|ing)\s+main\b", re.I)),
    ("work session", re.compile(r"\b(?:since|before|after|in)\s+this\s+session\b(?!'s\s+(?:lease|holder|id|keys?)\b)", re.I)),
    ("work session", re.compile(r"\bthis\s+session's\s+changes?\b", re.I)),
    ("work session", re.compile(r"(?<!\bon )(?<!\bof )\bthis\s+session\b(?!'s)", re.I)),
    ("branch name", re.compile(r"\b(?:on|merged)\s+main\b|\bmain's\b")),
    ("people at the machine", re.compile(r"\bengineers?\b", re.I)),
    ("people at the machine", re.compile(r"\bdevelopers?\s+compiling\b", re.I)),
    ("people at the machine", re.compile(r"\bother\s+developers\b", re.I)),
]


def wanted(name):
    base = os.path.basename(name)
    return base in NAMES or os.path.splitext(base)[1] in EXTENSIONS


def files_under(root, targets):
    for t in targets:
        path = os.path.join(root, t)
        if os.path.isfile(path):
            if wanted(path):
                yield path
            continue
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            for f in sorted(filenames):
                if wanted(f):
                    yield os.path.join(dirpath, f)


def check_text(text):
    """Every (line number, rule, matched text, line) of one file's text."""
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        for rule, rx in RULES:
            for m in rx.finditer(line):
                found.append((n, rule, m.group(0), line))
    return found


def check(root, targets=TARGETS, skip_self=True):
    findings = []
    for path in files_under(root, targets):
        if skip_self and os.path.normpath(os.path.abspath(path)) == SELF:
            continue
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError:
            continue
        rel = os.path.relpath(path, root)
        if skip_self and rel in PENDING:
            continue
        for n, rule, hit, line in check_text(text):
            findings.append((rel, n, rule, hit, line.strip()))
    return findings


# --- self-test ----------------------------------------------------------------------------------------

# (file, text, the hits the checker must report on it: a list of matched strings in order)
PLANTED = [
    ("docs/a.md", "Measured in session 9 on the shared machine.\n", ["session 9"]),
    ("docs/b.md", "Sessions 6 and 7 fixed it.\n", ["Sessions 6 and 7"]),
    ("docs/c.md", "See issue 21 item 4 for the fleet.\n", ["issue 21", "item 4"]),
    ("docs/d.md", "Late releases (issue #9) race binds.\n", ["issue #9"]),
    ("docs/e.md", "The branch `s9-a` and s10-c measured it (`s2-guarantees`).\n",
     ["s9-a", "s10-c", "s2-guarantees"]),
    ("docs/f.md", "A fix for the lead to decide; the lead's run.\n", ["the lead", "the lead's"]),
    ("docs/g.md", "(added by hand; lead)\n", ["; lead)"]),
    ("docs/h.md", "Taken while six other engineers compiled.\n", ["engineers"]),
    ("crates/x/src/lib.rs", "//! Fan-out (issue 20 item 1).\nfn f() {}\n", ["issue 20", "item 1"]),
    ("crates/x/tests/t.rs", "#[test]\nfn issue_21_item_4_paging() {}\n", ["issue_21", "item_4_"]),
    ("crates/x/tests/u.rs", "#[test]\nfn session9_regression() {}\n", ["session9_"]),
    ("crates/x/src/gen.rs",
     'const H: &str = "2 cores, shared with other developers compiling";\n',
     ["developers compiling", "other developers"]),
    ("crates/x/src/rev.rs", "/// so that a reviewer checks one file\n", ["reviewer"]),
    ("scripts/s.sh", "# Item 5: the scale run\n", ["Item 5"]),
    ("docs/i.md", "Passes on this branch after merging main; since this session it is faster.\n",
     ["this branch", "merging main", "since this session", "this session"]),
    ("docs/j.md", "Measured on main, against main's binaries; not made this session.\n",
     ["on main", "main's", "this session"]),
    # Legitimate words: nothing may be reported on these.
    ("docs/ok.md",
     "A client session holds a lease; session ids are `<lease><secret>`; the session lease\n"
     "expires. Session 1000 holds k. A test helper opens the pool. The leader of etcd.\n"
     "Sessions are usable on every replica. Items are listed 100 at a time.\n"
     "The else branch of this txn; this branch of the txn; in this session's lease; a key acquired on this session.\n"
     "fn main() {} // the main thread; the domain's main loop\n"
     "[a link](#anchor) and a colour &#38; and issue-free text; lead times; leads to.\n",
     []),
    ("crates/x/src/ok.rs",
     "/// A session's holder name; `session_id`; sessions_open.\nfn session_lease() {}\n"
     "let items = 3; // items in a page\n"
     "let rows = |page: &str, lead: &str| page.lines().filter(|l| l.starts_with(lead)).count();\n",
     []),
]


def self_test():
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for rel, text, _ in PLANTED:
            path = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        # A build directory is never read, whatever it holds.
        os.makedirs(os.path.join(tmp, "crates", "target"))
        with open(os.path.join(tmp, "crates", "target", "x.md"), "w") as f:
            f.write("session 9\n")
        findings = check(tmp, skip_self=False)
        by_file = {}
        for rel, _, _, hit, _ in findings:
            by_file.setdefault(rel, []).append(hit)
        for rel, _, expected in PLANTED:
            got = by_file.pop(os.path.normpath(rel), [])
            if sorted(got) != sorted(expected):
                print(f"self-test: {rel}: expected {expected}, found {got}")
                ok = False
        for rel, hits in by_file.items():
            print(f"self-test: unexpected findings in {rel}: {hits}")
            ok = False
    print("self-test: " + ("ok" if ok else "FAILED"))
    return ok


def main(argv):
    if "--self-test" in argv:
        return 0 if self_test() else 1
    findings = check(ROOT)
    for rel, n, rule, hit, line in findings:
        print(f"{rel}:{n}: {line[:160]}  [{rule}: {hit!r}]")
    if findings:
        print(f"\n{len(findings)} reference(s) to how the project was built rather than to the project: "
              "name the topic, guarantee, commit or figure instead (history belongs in commit messages).")
        return 1
    print("check-words: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""Every internal link of the book and the README leads somewhere: the file and the anchor.

mdbook checks neither anchors nor links outside SUMMARY.md, so this does, over the Markdown
sources (`docs/**/*.md` and `README.md`):

* a relative link `[text](path)`, `[text](path#anchor)`, `![alt](image)` or `<img src="...">`
  names a file or directory that exists;
* an anchor (`#anchor`, same page or another page) is the id of a heading of that page, as mdbook
  makes it (the heading's text, lower-cased, spaces to `-`, every character that is not a letter,
  digit, `-` or `_` dropped; a repeated heading gets `-1`, `-2`…), or an explicit `id="..."` /
  `{#id}` on the page;
* every Markdown page under `docs/` is in `docs/SUMMARY.md`, so no page is left out of the book
  (and so out of its search);
* every path `docs/….md` (or `.svg`, `.csv`) that code, tests, scripts, deployment files or clients
  name (in a comment, a message, a generated page's text) exists, so a moved page cannot leave
  them pointing at nothing.

URLs with a scheme (`https:`, `mailto:`) are not followed. Code blocks and inline code are skipped.

Usage: `python3 scripts/check-links.py` (exit 1 listing each broken link as `page:line: link:
why`); `--self-test` plants broken links, anchors, an orphan page and a code comment naming a
missing page in a temporary tree and fails
unless exactly those are reported, so the check is proven able to fail.
"""
import os
import re
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFDEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
IMG = re.compile(r"<img\b[^>]*\bsrc=\"([^\"]+)\"", re.I)
HREF = re.compile(r"<a\b[^>]*\bhref=\"([^\"]+)\"", re.I)
EXPLICIT_ID = re.compile(r"\bid=\"([^\"]+)\"|\{#([A-Za-z0-9_-]+)\}")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def strip_code(line):
    """The line without inline code spans (links inside them are not links)."""
    return re.sub(r"(`+)(?:(?!\1).)+\1", "", line)


def heading_text(raw):
    """The text mdbook renders for a heading's Markdown: code, emphasis, links and HTML reduced
    to their text."""
    t = raw
    t = re.sub(r"\{#[A-Za-z0-9_-]+\}\s*$", "", t)
    t = re.sub(r"!\[([^\]]*)\]\([^)]*\)", r"\1", t)
    t = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", t)
    t = re.sub(r"<[^>]+>", "", t)
    t = re.sub(r"(`+)((?:(?!\1).)+)\1", r"\2", t)
    t = t.replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"')
    t = re.sub(r"(\*\*|__|\*|_(?=\S)|(?<=\S)_)", lambda m: "" if m.group(0) in ("**", "*") else m.group(0), t)
    return t


def slug(text):
    """mdbook's id for a heading text (`normalize_id`)."""
    out = []
    for c in text.strip():
        if c.isalnum() or c in "_-":
            out.append(c.lower())
        elif c.isspace():
            out.append("-")
    return "".join(out)


def page_lines(text):
    """(line number, line) of the page outside fenced code blocks."""
    in_code = False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            in_code = not in_code
            continue
        if not in_code:
            yield n, line


def anchors_of(text):
    ids = set()
    counts = {}
    for _, line in page_lines(text):
        m = HEADING.match(line)
        if m:
            explicit = re.search(r"\{#([A-Za-z0-9_-]+)\}\s*$", m.group(2))
            base = explicit.group(1) if explicit else slug(heading_text(m.group(2)))
            n = counts.get(base, 0)
            counts[base] = n + 1
            ids.add(base if n == 0 else f"{base}-{n}")
        for e in EXPLICIT_ID.finditer(line):
            ids.add(e.group(1) or e.group(2))
    return ids


def links_of(text):
    for n, line in page_lines(text):
        plain = strip_code(line)
        for rx in (LINK, IMG, HREF):
            for m in rx.finditer(plain):
                yield n, m.group(1)
        m = REFDEF.match(plain)
        if m:
            yield n, m.group(1)


def markdown_pages(root):
    pages = []
    readme = os.path.join(root, "README.md")
    if os.path.isfile(readme):
        pages.append(readme)
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, "docs")):
        dirnames[:] = sorted(d for d in dirnames if d not in {"book", "target"})
        pages.extend(os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".md"))
    return pages


DOCS_PATH = re.compile(r"(?<![\w/.-])docs/[\w./-]*?\.(?:md|svg|csv)(?![\w-])")
CODE_DIRS = ["crates", "scripts", "deploy", "clients", "fuzz"]
# The two checkers plant made-up paths in their self-tests.
SELF_TESTED = {"check-links.py", "check-words.py"}
CODE_EXT = {".rs", ".py", ".sh", ".toml", ".yaml", ".yml", ".json", ".service", ".conf", ".txt"}


def code_files(root):
    for d in CODE_DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, d)):
            dirnames[:] = sorted(x for x in dirnames if x not in {"target", "corpus", "artifacts"})
            for f in sorted(filenames):
                if os.path.splitext(f)[1] in CODE_EXT and f not in SELF_TESTED:
                    yield os.path.join(dirpath, f)


def check(root):
    problems = []
    texts = {}

    def text_of(path):
        if path not in texts:
            with open(path, encoding="utf-8") as f:
                texts[path] = f.read()
        return texts[path]

    anchor_cache = {}

    def anchors(path):
        if path not in anchor_cache:
            anchor_cache[path] = anchors_of(text_of(path))
        return anchor_cache[path]

    pages = markdown_pages(root)
    for page in pages:
        rel_page = os.path.relpath(page, root)
        for n, target in links_of(text_of(page)):
            if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", target) or target.startswith("//"):
                continue
            path, _, anchor = target.partition("#")
            dest = page if not path else os.path.normpath(os.path.join(os.path.dirname(page), path))
            if not os.path.exists(dest):
                problems.append(f"{rel_page}:{n}: {target}: no such file")
                continue
            if anchor:
                if not dest.endswith(".md"):
                    continue
                if anchor not in anchors(dest):
                    problems.append(f"{rel_page}:{n}: {target}: no heading or id '{anchor}' in "
                                    f"{os.path.relpath(dest, root)}")
    for path in code_files(root):
        rel = os.path.relpath(path, root)
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(lines, 1):
            for m in DOCS_PATH.finditer(line):
                if not os.path.exists(os.path.join(root, m.group(0))):
                    problems.append(f"{rel}:{n}: {m.group(0)}: no such file")
    summary = os.path.join(root, "docs", "SUMMARY.md")
    if os.path.isfile(summary):
        listed = set()
        for _, target in links_of(text_of(summary)):
            listed.add(os.path.normpath(os.path.join(root, "docs", target.partition("#")[0])))
        for page in pages:
            if page.startswith(os.path.join(root, "docs") + os.sep) and page != summary \
                    and page not in listed:
                problems.append(f"{os.path.relpath(page, root)}: not in docs/SUMMARY.md")
    return problems


# --- self-test ----------------------------------------------------------------------------------------

PLANTED = {
    "README.md": "# R\n[book](docs/intro.md) [gone](docs/gone.md)\n",
    "docs/SUMMARY.md": "# Summary\n\n- [Intro](intro.md)\n- [Guide](guide/a.md)\n",
    "docs/intro.md": (
        "# Introduction\n\n## The `serve` command: HTTP/JSON\n\n## Limits & sizing\n\n## Twice\n\n## Twice\n"
        "[ok](#the-serve-command-httpjson) [ok](#limits--sizing) [ok](#twice-1) [bad](#twice-2)\n"
        "[ok](guide/a.md#pools-keys-and-holders) [bad](guide/a.md#no-such)\n"
        "`[not a link](nowhere.md)`\n```\n[in code](nowhere.md)\n```\n"
        "![img](guide/pic.svg) ![bad img](guide/none.svg) [web](https://example.com/x.md#y)\n"
        '<a id="custom"></a> [ok](#custom) <img src="guide/pic.svg">\n'
    ),
    "docs/guide/a.md": "# Pools, keys and holders\n[up](../intro.md#introduction) [bad](../intro.md#intro)\n",
    "docs/guide/pic.svg": "<svg/>\n",
    "docs/guide/orphan.md": "# Orphan\n",
    "crates/x/src/lib.rs": "//! See docs/guide/a.md and docs/cli.md.\nconst P: &str = \"docs/guide/pic.svg\";\n",
}

EXPECTED = {
    "README.md:2: docs/gone.md: no such file",
    "docs/intro.md:10: #twice-2: no heading or id 'twice-2' in docs/intro.md",
    "docs/intro.md:11: guide/a.md#no-such: no heading or id 'no-such' in docs/guide/a.md",
    "docs/intro.md:16: guide/none.svg: no such file",
    "docs/guide/a.md:2: ../intro.md#intro: no heading or id 'intro' in docs/intro.md",
    "docs/guide/orphan.md: not in docs/SUMMARY.md",
    "crates/x/src/lib.rs:1: docs/cli.md: no such file",
}


def self_test():
    with tempfile.TemporaryDirectory() as tmp:
        for rel, text in PLANTED.items():
            path = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        found = set(check(tmp))
    ok = found == EXPECTED
    for p in sorted(EXPECTED - found):
        print(f"self-test: not reported: {p}")
    for p in sorted(found - EXPECTED):
        print(f"self-test: reported but not planted: {p}")
    print("self-test: " + ("ok" if ok else "FAILED"))
    return ok


def main(argv):
    if "--self-test" in argv:
        return 0 if self_test() else 1
    problems = check(ROOT)
    for p in problems:
        print(p)
    if problems:
        print(f"\n{len(problems)} broken internal link(s) or page(s) missing from the book.")
        return 1
    print("check-links: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

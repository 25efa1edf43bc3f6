#!/usr/bin/env python3
"""The size rules (ARCHITECTURE.md, "Invariants"): where a mistake costs
most, code is read in pieces a reviewer can hold.

* no file under the product source trees over 1,000 lines (tests in it
  counted: a file is read whole);
* no function over 120 lines, from its `fn` line to its closing brace;
  functions in `#[cfg(test)]` (or `cfg(any(test, ...))`) items, in the
  files of modules so declared (`#[cfg(test)] mod tests;`), and `#[test]`
  functions are not counted;
* no test file over 1,500 lines: every crate's `tests/` tree, the shared
  test support and the fixtures (a test binary is split into one module
  per subject, as the activator's `tests/host/` is by phase).

    ci/lint/sizes.py                          (the source trees and the test trees)
    ci/lint/sizes.py --paths image/src builder/src --test-paths builder/tests

Every offender is printed as `FILE:LINE: ...` with its length; the exit
status is 1 when there is any. Comments, strings and character literals
are blanked before braces are counted, so a brace in a message or a
`'{'` never ends a function early.
"""

import argparse
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_PATHS = ["activator/src", "image/src", "builder/src"]
MAX_FILE_LINES = 1000
# every crate's `tests/` (found, so a new crate's are held too), the shared
# test support and the fixtures
DEFAULT_TEST_PATHS = sorted(
    str(d.relative_to(ROOT))
    for d in ROOT.glob("*/tests")
    if d.is_dir() and (d.parent / "Cargo.toml").is_file()
) + ["test-support/src", "fixtures"]
MAX_TEST_FILE_LINES = 1500
MAX_FN_LINES = 120

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
FN_NAME = re.compile(r"\s+([A-Za-z_][A-Za-z0-9_]*)")
MOD_DECL = re.compile(r"\s+([A-Za-z_][A-Za-z0-9_]*)\s*;")
TEST_ATTR = re.compile(r"^#\[\s*((tokio::)?test\b|cfg\s*\(\s*((all|any)\s*\(\s*)?test\b)")


def blank(text: str) -> str:
    """`text` with comments, string, byte-string, raw-string and character
    literals replaced by spaces (newlines kept, so line numbers hold)."""
    out = []
    i, n = 0, len(text)

    def keep_newlines(s: str) -> str:
        return "".join("\n" if c == "\n" else " " for c in s)

    while i < n:
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if c == "/" and nxt == "/":
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c == "/" and nxt == "*":
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(keep_newlines(text[i:j]))
            i = j
        elif c in "rb" and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.compile(r"b?r(#*)\"").match(text, i)
            if m:
                end = text.find('"' + m.group(1), m.end())
                j = n if end < 0 else end + 1 + len(m.group(1))
                out.append(keep_newlines(text[i:j]))
                i = j
            elif c == "b" and nxt in "\"'":
                out.append(" ")
                i += 1
            else:
                m = IDENT.match(text, i)
                out.append(m.group(0))
                i = m.end()
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(keep_newlines(text[i : j + 1]))
            i = j + 1
        elif c == "'":
            # a character literal ('a', '\n', '\u{7f}', '\''), or a lifetime
            if nxt == "\\":
                j = text.find("'", i + 3)
                j = n if j < 0 else j + 1
            elif i + 2 < n and text[i + 2] == "'":
                j = i + 3
            else:
                out.append(c)
                i += 1
                continue
            out.append(" " * (j - i))
            i = j
        elif c.isalpha() or c == "_":
            m = IDENT.match(text, i)
            out.append(m.group(0))
            i = m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


class Frame:
    def __init__(self, test: bool, fn=None):
        self.test = test
        self.fn = fn  # (name, start line) for a function body


def long_functions(path: pathlib.Path):
    """(line, name, length) of every non-test function over the limit."""
    return scan(path)[0]


def scan(path: pathlib.Path):
    """The non-test functions over the limit, as (line, name, length), and
    the names of the modules `path` declares out of line (`mod x;`) under a
    test attribute or inside test code."""
    code = blank(path.read_text())
    line_starts = [0]
    for m in re.finditer("\n", code):
        line_starts.append(m.end())

    def line_of(pos: int) -> int:
        lo, hi = 0, len(line_starts)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if line_starts[mid] <= pos:
                lo = mid
            else:
                hi = mid
        return lo + 1

    found = []
    test_mods = []
    stack = [Frame(test=False)]
    parens = 0
    pending_test = None  # paren depth at which a test attribute was seen
    pending_fn = None  # (name, line, paren depth) of a signature being read
    token = re.compile(r"#!?\[|[A-Za-z_][A-Za-z0-9_]*|[{}();,\[\]]")
    pos = 0
    while True:
        m = token.search(code, pos)
        if not m:
            break
        tok, pos = m.group(0), m.end()
        if tok in ("#[", "#!["):
            depth, j = 1, pos
            while j < len(code) and depth:
                depth += {"[": 1, "]": -1}.get(code[j], 0)
                j += 1
            attr = "#[" + code[pos:j]
            if tok == "#[" and TEST_ATTR.match(attr):
                pending_test = parens
            pos = j
        elif tok == "mod":
            decl = MOD_DECL.match(code, pos)
            if decl and (pending_test is not None or stack[-1].test):
                test_mods.append(decl.group(1))
        elif tok == "fn":
            name = FN_NAME.match(code, pos)
            if name:  # `fn(u32) -> u32` is a type, not an item
                pending_fn = (name.group(1), line_of(m.start()), parens)
        elif tok in ("(", "["):
            parens += 1
        elif tok in (")", "]"):
            parens -= 1
        elif tok in (";", ","):
            if pending_test is not None and parens <= pending_test:
                pending_test = None
            if tok == ";" and pending_fn and parens <= pending_fn[2]:
                pending_fn = None  # a declaration without a body
        elif tok == "{":
            test = stack[-1].test or pending_test is not None
            pending_test = None
            fn = None
            if pending_fn and parens <= pending_fn[2]:
                fn, pending_fn = pending_fn[:2], None
            stack.append(Frame(test=test, fn=fn))
        elif tok == "}":
            frame = stack.pop() if len(stack) > 1 else stack[0]
            if frame.fn and not frame.test:
                name, start = frame.fn
                length = line_of(m.start()) - start + 1
                if length > MAX_FN_LINES:
                    found.append((start, name, length))
    return found, test_mods


def test_only_dirs(files) -> set:
    """Where the modules declared as test-only (`#[cfg(test)] mod x;`, or
    under `cfg(any(test, ...))`) live: `x.rs` beside a `mod.rs`/`lib.rs`/
    `main.rs`, else in the declaring file's own directory, as a file or a
    directory with `mod.rs`. Returned as paths without `.rs`: a file is
    test-only when it or one of its directories is in the set."""
    out = set()
    for path in files:
        own = path.parent if path.name in ("mod.rs", "lib.rs", "main.rs") else path.with_suffix("")
        for name in scan(path)[1]:
            out.add(own / name)
    return out


def is_test_only(path: pathlib.Path, dirs: set) -> bool:
    stem = path.parent if path.name == "mod.rs" else path.with_suffix("")
    return stem in dirs or any(d in dirs for d in stem.parents)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--paths",
        nargs="+",
        default=DEFAULT_PATHS,
        help="source trees to check, relative to the repository root",
    )
    ap.add_argument(
        "--test-paths",
        nargs="*",
        default=DEFAULT_TEST_PATHS,
        help="test trees to hold to the test file limit, relative to the repository root",
    )
    args = ap.parse_args()
    offenders = 0
    files = 0
    for tree in args.test_paths:
        base = ROOT / tree
        if not base.is_dir():
            print(f"{tree}: no such directory", file=sys.stderr)
            return 2
        for path in sorted(base.rglob("*.rs")):
            if "target" in path.relative_to(ROOT).parts:
                continue
            files += 1
            lines = path.read_text().count("\n")
            if lines > MAX_TEST_FILE_LINES:
                offenders += 1
                rel = path.relative_to(ROOT)
                print(f"{rel}:1: test file is {lines} lines (limit {MAX_TEST_FILE_LINES})")
    for tree in args.paths:
        base = ROOT / tree
        if not base.is_dir():
            print(f"{tree}: no such directory", file=sys.stderr)
            return 2
        paths = sorted(base.rglob("*.rs"))
        test_dirs = test_only_dirs(paths)
        for path in paths:
            files += 1
            rel = path.relative_to(ROOT)
            lines = path.read_text().count("\n")
            if lines > MAX_FILE_LINES:
                offenders += 1
                print(f"{rel}:1: file is {lines} lines (limit {MAX_FILE_LINES})")
            if is_test_only(path, test_dirs):
                continue
            for line, name, length in long_functions(path):
                offenders += 1
                print(f"{rel}:{line}: fn {name} is {length} lines (limit {MAX_FN_LINES})")
    trees = " ".join(args.paths + args.test_paths)
    if offenders:
        print(f"sizes: {offenders} over the limits in {trees}", file=sys.stderr)
        return 1
    print(f"sizes: ok ({files} files in {trees})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

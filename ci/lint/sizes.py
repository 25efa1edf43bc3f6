#!/usr/bin/env python3
"""Size rules (issue 27): no source file over 1,000 lines, no function
outside tests over 120 lines, where a mistake costs most.

Every offender under the checked trees is listed; the exit code is 1 only
for the rules ENFORCED names (a tree whose split has not landed yet is
reported, not failed).

Test code is left out of the function rule: `#[test]` functions,
`#[cfg(test)] mod x { ... }` blocks and files of `#[cfg(test)] mod x;`
(and of the activator's `testing` fake). A function's length runs from its
`fn` line to its closing brace.

    ci/lint/sizes.py            (exit 1 naming each enforced offender)
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
TREES = ["activator/src", "image/src", "builder/src"]
MAX_FILE_LINES = 1000
MAX_FN_LINES = 120
# tree -> the rules that fail the check there
ENFORCED = {
    "activator/src": {"file", "fn"},
}
# modules compiled only for tests (besides `#[cfg(test)] mod x;`)
TEST_ONLY_FILES = {"activator/src/testing.rs"}

FN_RE = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?(?:extern\s+\"[^\"]*\"\s+)?fn\s+([A-Za-z_][A-Za-z0-9_]*)")


def blank_literals(text: str) -> str:
    """The text with comments, strings and char literals replaced by spaces
    (newlines kept), so braces can be counted."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and not (i and (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = len(re.match(r"r(#*)\"", text[i:]).group(1))
            end = '"' + "#" * hashes
            j = text.find(end, i + 2 + hashes)
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"' or (c == "b" and text.startswith('b"', i)):
            j = i + (2 if c == "b" else 1)
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "'":
            # a char literal ('x', '\n', '\u{..}'), not a lifetime ('a)
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:])
            if m:
                out.append(" " * len(m.group(0)))
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def block_end(lines: list, start: int) -> int:
    """The index of the line closing the first `{` at or after `start`;
    -1 when a `;` comes first (a declaration without a body)."""
    depth = 0
    opened = False
    for k in range(start, len(lines)):
        for ch in lines[k]:
            if ch == "{":
                depth += 1
                opened = True
            elif ch == "}":
                depth -= 1
                if opened and depth == 0:
                    return k
            elif ch == ";" and not opened:
                return -1
    return len(lines) - 1


def test_ranges(raw: list, code: list) -> list:
    """Line ranges of test code: `#[test]` functions and `#[cfg(test)]`
    items with a body."""
    ranges = []
    for i, line in enumerate(raw):
        s = line.strip()
        if s in ("#[test]", "#[cfg(test)]") or s.startswith("#[cfg(any(test"):
            k = i + 1
            while k < len(raw) and raw[k].strip().startswith("#["):
                k += 1
            if k < len(raw):
                end = block_end(code, k)
                if end >= 0:
                    ranges.append((i, end))
    return ranges


def test_module_files(path: pathlib.Path, raw: list) -> set:
    """Files of `#[cfg(test)] mod x;` declared in `path`."""
    files = set()
    for i, line in enumerate(raw[:-1]):
        if line.strip() in ("#[cfg(test)]",) or line.strip().startswith("#[cfg(any(test"):
            m = re.match(r"\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", raw[i + 1])
            if m:
                base = path.parent if path.name in ("mod.rs", "lib.rs", "main.rs") else path.with_suffix("")
                for cand in (base / f"{m.group(1)}.rs", base / m.group(1) / "mod.rs"):
                    files.add(cand.resolve())
    return files


def main() -> int:
    offenders = []  # (enforced, text)
    for tree in TREES:
        src = ROOT / tree
        files = sorted(src.rglob("*.rs"))
        test_files = {(ROOT / f).resolve() for f in TEST_ONLY_FILES}
        for f in files:
            test_files |= test_module_files(f, f.read_text().splitlines())
        rules = ENFORCED.get(tree, set())
        for f in files:
            rel = f.relative_to(ROOT)
            text = f.read_text()
            raw = text.splitlines()
            if len(raw) > MAX_FILE_LINES:
                offenders.append(("file" in rules, f"{rel}: {len(raw)} lines (at most {MAX_FILE_LINES})"))
            if f.resolve() in test_files:
                continue
            code = blank_literals(text).splitlines()
            tests = test_ranges(raw, code)
            for i, line in enumerate(code):
                m = FN_RE.match(line)
                if not m or any(a <= i <= b for a, b in tests):
                    continue
                end = block_end(code, i)
                if end < 0:
                    continue
                length = end - i + 1
                if length > MAX_FN_LINES:
                    offenders.append(("fn" in rules, f"{rel}:{i + 1}: fn {m.group(1)}: {length} lines (at most {MAX_FN_LINES})"))
    failed = False
    for enforced, text in offenders:
        print(f"ci/lint/sizes.py: {text}{'' if enforced else ' (reported, not enforced)'}", file=sys.stderr)
        failed |= enforced
    trees = ", ".join(f"{t} ({'+'.join(sorted(ENFORCED[t]))})" for t in ENFORCED)
    print(f"ci/lint/sizes.py: {len(offenders)} offender(s); enforced in {trees}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

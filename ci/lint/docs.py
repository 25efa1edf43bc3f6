#!/usr/bin/env python3
"""The documentation rules (README.md, "Where to read next"): the README is
a front door and ARCHITECTURE.md a map, so both stay short, and the docs
split by reader must not point into the void.

* README.md at most 400 lines, ARCHITECTURE.md at most 600;
* every relative link in README.md, ARCHITECTURE.md and docs/**/*.md names
  a file or directory that exists, and its `#anchor` (or a bare `#anchor`
  in the same file) a heading of the Markdown file it names, as GitHub
  makes anchors of headings.

    ci/lint/docs.py

Links in code blocks and code spans are not links; absolute URLs
(`https:`, `mailto:`) are not checked. Every offender is printed as
`FILE:LINE: ...`; the exit status is 1 when there is any.
"""

import pathlib
import re
import sys
from urllib.parse import unquote

ROOT = pathlib.Path(__file__).resolve().parents[2]
MAX_LINES = {"README.md": 400, "ARCHITECTURE.md": 600}

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def docs() -> list[pathlib.Path]:
    files = [ROOT / "README.md", ROOT / "ARCHITECTURE.md"]
    files += sorted((ROOT / "docs").rglob("*.md"))
    return [f for f in files if f.is_file()]


def prose_lines(text: str):
    """(line number, line) of the lines outside fenced code blocks; a fence
    line comes as an empty line (it ends a paragraph)."""
    fence = None
    for n, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1) == fence:
                fence = None
            yield n, ""
            continue
        if fence is None:
            yield n, line


def links(text: str):
    """(line number, target) of every link: inline links are matched in
    whole paragraphs, code spans blanked, since a link's text (or a code
    span) may wrap onto the next line."""
    block: list = []

    def flush():
        if block:
            start, joined = block[0][0], "\n".join(line for _, line in block)
            joined = CODE_SPAN.sub(lambda s: re.sub(r"[^\n]", " ", s.group(0)), joined)
            for m in INLINE_LINK.finditer(joined):
                yield start + joined.count("\n", 0, m.start()), m.group(1)
            block.clear()

    for n, line in prose_lines(text):
        ref = REF_DEF.match(line)
        if ref:
            yield n, ref.group(1)
        if line.strip():
            block.append((n, line))
        else:
            yield from flush()
    yield from flush()


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: links reduced to their text, lower
    case, everything but letters, digits, `_`, `-` and spaces dropped,
    spaces turned into hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in "_- ")
    return text.replace(" ", "-")


def anchors(path: pathlib.Path, cache: dict) -> set:
    if path not in cache:
        seen: dict = {}
        found = set()
        fence = None
        for line in path.read_text(encoding="utf-8").split("\n"):
            m = FENCE.match(line)
            if m:
                fence = m.group(1) if fence is None else (None if m.group(1) == fence else fence)
                continue
            h = HEADING.match(line) if fence is None else None
            if h:
                base = slug(h.group(2))
                k = seen.get(base, 0)
                seen[base] = k + 1
                found.add(base if k == 0 else f"{base}-{k}")
        cache[path] = found
    return cache[path]


def check_link(src: pathlib.Path, n: int, target: str, cache: dict) -> str | None:
    if SCHEME.match(target) or target.startswith("//"):
        return None
    path_part, _, anchor = target.partition("#")
    dest = src if not path_part else (src.parent / unquote(path_part)).resolve()
    rel = src.relative_to(ROOT)
    if not dest.exists():
        return f"{rel}:{n}: link {target}: no such file or directory"
    if anchor and dest.suffix == ".md":
        if unquote(anchor).lower() not in anchors(dest, cache):
            where = "this file" if dest == src else dest.relative_to(ROOT)
            return f"{rel}:{n}: link {target}: no heading for #{anchor} in {where}"
    return None


def main() -> int:
    problems = []
    for name, limit in MAX_LINES.items():
        path = ROOT / name
        count = len(path.read_text(encoding="utf-8").splitlines())
        if count > limit:
            problems.append(f"{name}: {count} lines, over the {limit} allowed (move the detail into docs/)")
    cache: dict = {}
    checked = 0
    for f in docs():
        for n, t in links(f.read_text(encoding="utf-8")):
            checked += 1
            p = check_link(f, n, t, cache)
            if p:
                problems.append(p)
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        return 1
    print(
        f"ci/lint/docs.py: README.md and ARCHITECTURE.md within their sizes, "
        f"{checked} links of {len(docs())} files resolve"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The module rules Cargo does not check (ARCHITECTURE.md, "Invariants"):

* no cycle between the top-level modules of a crate (an arrow is a
  `crate::X` path in code, comments and `#[cfg(test)]` parts left out);
* no library module of the builder refers to a command module
  (`crate::cmd`): commands call the library, never the reverse.

    ci/lint/modules.py          (exit 1 naming each cycle and arrow)
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
CRATES = {
    "image": ROOT / "image/src",
    "activator": ROOT / "activator/src",
    "builder": ROOT / "builder/src",
}
# binary-only entry points: their modules are the commands, not the library
ENTRY = {"main.rs"}
COMMAND_DIRS = {"cmd", "cli"}


def top_module(src: pathlib.Path, path: pathlib.Path) -> str:
    rel = path.relative_to(src)
    return rel.parts[0].removesuffix(".rs")


def code_of(path: pathlib.Path) -> str:
    """The file's code without comments and without `#[cfg(test)] mod`
    blocks (a test may reach anywhere)."""
    lines = []
    raw = path.read_text().splitlines()
    i = 0
    while i < len(raw):
        stripped = raw[i].strip()
        if stripped == "#[cfg(test)]":
            nxt = raw[i + 1].strip() if i + 1 < len(raw) else ""
            if nxt.startswith("mod ") and nxt.endswith("{"):
                # skip to the closing brace at the same indentation
                indent = len(raw[i + 1]) - len(raw[i + 1].lstrip())
                i += 2
                while i < len(raw) and not (
                    raw[i].strip() == "}" and len(raw[i]) - len(raw[i].lstrip()) == indent
                ):
                    i += 1
                i += 1
                continue
        if not stripped.startswith("//"):
            lines.append(raw[i].split("//", 1)[0])
        i += 1
    return "\n".join(lines)


def crate_paths(code: str):
    """First segments after `crate::`, including `crate::{a, b::c}` groups."""
    for m in re.finditer(r"\bcrate::([a-z_][a-z0-9_]*)", code):
        yield m.group(1)
    for m in re.finditer(r"\bcrate::\{([^}]*)\}", code):
        for part in m.group(1).split(","):
            name = part.strip().split("::", 1)[0]
            if re.fullmatch(r"[a-z_][a-z0-9_]*", name) and name != "self":
                yield name


def edges(src: pathlib.Path) -> dict:
    graph = {}
    for path in sorted(src.rglob("*.rs")):
        if path.name in ENTRY and path.parent == src:
            continue
        module = top_module(src, path)
        targets = graph.setdefault(module, set())
        for name in crate_paths(code_of(path)):
            if name != module:
                targets.add(name)
    return graph


def cycles(graph: dict) -> list:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main() -> int:
    problems = []
    for crate, src in CRATES.items():
        graph = edges(src)
        for comp in cycles(graph):
            arrows = [f"{a} -> {b}" for a in comp for b in sorted(graph[a]) if b in comp]
            problems.append(f"{crate}: module cycle {{{', '.join(comp)}}}: {'; '.join(arrows)}")
        for module, targets in sorted(graph.items()):
            if module in COMMAND_DIRS:
                continue
            for t in sorted(targets & COMMAND_DIRS):
                problems.append(f"{crate}: library module {module} refers to crate::{t} (commands call the library, not the reverse)")
    for p in problems:
        print(f"ci/lint/modules.py: {p}", file=sys.stderr)
    if not problems:
        counts = ", ".join(f"{c} {len(edges(s))}" for c, s in CRATES.items())
        print(f"ci/lint/modules.py: no module cycle, no library -> command arrow ({counts} modules)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

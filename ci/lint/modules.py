#!/usr/bin/env python3
"""The module rules Cargo does not check (ARCHITECTURE.md, "Invariants"):

* no cycle between the top-level modules of a crate (an arrow is a
  `crate::X` path in code, comments and `#[cfg(test)]` parts left out);
* no library module of the builder refers to a command module
  (`crate::cmd`): commands call the library, never the reverse;
* no upward arrow in the activator: its top-level modules stand in the
  layers of `LAYERS` (lowest first, the ground floor at the bottom, the
  binary's `cli` on top), a module refers only to its own layer and
  those below, and a module in no layer is refused (a new one is placed
  here on purpose). The table is printed.

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
# The activator's layers, lowest first (lib.rs says what each holds): the
# core path's folders stand on the ground floor in the order a run takes
# them, the periphery (`host`) above them, the run (`activate`) above all
# it drives. Within a layer arrows are free (the cycle rule still holds).
LAYERS = {
    "activator": [
        (
            "ground floor",
            {
                "config",
                "paths",
                "state",
                "lock",
                "slot",
                "systemd",
                "walk",
                "remove",
                "progress",
                "failpoint",
                "testing",
                "trusted",
            },
        ),
        ("fetch", {"fetch"}),
        ("slots", {"slots"}),
        ("render", {"render"}),
        # the Kubernetes API client (issue 38): the drain, the cluster gate
        # and the node's reports (gate, activate) stand on it
        ("cluster", {"cluster"}),
        ("gate", {"gate"}),
        ("rollout", {"rollout"}),
        ("host", {"host"}),
        ("activate", {"activate"}),
        ("cli", {"cli"}),
    ],
}
# the crate root declares the modules; it is no layer's
ROOTS = {"lib"}


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


def edges(src: pathlib.Path, where: dict | None = None) -> dict:
    """module -> the modules it refers to; `where`, when given, gets the
    first file of each arrow, keyed (module, target)."""
    graph = {}
    for path in sorted(src.rglob("*.rs")):
        if path.name in ENTRY and path.parent == src:
            continue
        module = top_module(src, path)
        targets = graph.setdefault(module, set())
        for name in crate_paths(code_of(path)):
            if name != module:
                targets.add(name)
                if where is not None:
                    where.setdefault((module, name), path.relative_to(ROOT))
    return graph


def layer_problems(crate: str, graph: dict, where: dict) -> list:
    """Each module in no layer, and each arrow to a higher layer."""
    rank = {}
    for i, (_, members) in enumerate(LAYERS[crate]):
        for m in members:
            rank[m] = i
    names = [name for name, _ in LAYERS[crate]]
    out = []
    for module in sorted(set(graph) - ROOTS):
        if module not in rank:
            out.append(f"{crate}: module {module} is in no layer (place it in LAYERS)")
    for module, targets in sorted(graph.items()):
        for t in sorted(targets):
            if module in rank and t in rank and rank[t] > rank[module]:
                out.append(
                    f"{crate}: upward arrow {module} -> {t} ({names[rank[module]]} below "
                    f"{names[rank[t]]}), crate::{t} in {where[(module, t)]}"
                )
    return out


def layer_table(crate: str, graph: dict) -> str:
    rows = []
    for i, (name, members) in reversed(list(enumerate(LAYERS[crate]))):
        present = sorted(m for m in members if m in graph)
        rows.append(f"  {i} {name:<13} {' '.join(present)}")
    return f"{crate} layers, top first:\n" + "\n".join(rows)


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
    tables = []
    for crate, src in CRATES.items():
        where = {}
        graph = edges(src, where)
        if crate in LAYERS:
            problems += layer_problems(crate, graph, where)
            tables.append(layer_table(crate, graph))
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
        for table in tables:
            print(table)
        counts = ", ".join(f"{c} {len(edges(s))}" for c, s in CRATES.items())
        print(
            "ci/lint/modules.py: no module cycle, no library -> command arrow, "
            f"no upward arrow ({counts} modules)"
        )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

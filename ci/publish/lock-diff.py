#!/usr/bin/env python3
"""lock-diff.py OLD NEW: the .deb changes between two kubeslot package-base
locks, per platform, as Markdown on stdout (used by ci/publish/lock.sh).

OLD may be a missing file (a first lock: every package is added). Packages
are keyed by name (name:architecture when a platform locks one name twice);
a package whose version stayed but whose sha256 changed is listed too.
Reads the lock format `kubeslot-builder lock` writes (version 1); anything
else is an error naming the file.
"""

import sys
import tomllib
from pathlib import Path


def load(path):
    p = Path(path)
    if not p.exists():
        return {}
    try:
        lock = tomllib.loads(p.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        sys.exit(f"lock-diff.py: {path}: {e}")
    if lock.get("version") != 1:
        sys.exit(f"lock-diff.py: {path}: lock format version {lock.get('version')!r}, expected 1")
    platforms = {}
    for platform in lock.get("platform", []):
        pkgs = platform.get("package", [])
        names = [p["name"] for p in pkgs]
        packages = {}
        for p in pkgs:
            key = p["name"] if names.count(p["name"]) == 1 else f"{p['name']}:{p['architecture']}"
            packages[key] = (p["version"], p["sha256"])
        platforms[platform["arch"]] = packages
    return platforms


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: lock-diff.py OLD NEW")
    old_path, new_path = sys.argv[1:]
    old, new = load(old_path), load(new_path)
    print(f"### {new_path}\n")
    if not old:
        print("A new lock (no earlier one).\n")
    for arch in sorted(set(old) | set(new)):
        a, b = old.get(arch, {}), new.get(arch, {})
        rows = []
        for name in sorted(set(a) | set(b)):
            va, vb = a.get(name), b.get(name)
            if va == vb:
                continue
            if va and vb and va[0] == vb[0]:
                rows.append((name, va[0], f"{vb[0]} (other sha256)"))
            else:
                rows.append((name, va[0] if va else "", vb[0] if vb else ""))
        added = sum(1 for r in rows if not r[1])
        removed = sum(1 for r in rows if not r[2])
        print(f"{arch}: {len(a)} → {len(b)} packages; {len(rows) - added - removed} changed, "
              f"{added} added, {removed} removed\n")
        if rows and a:
            print("| package | old | new |\n|---|---|---|")
            for name, va, vb in rows:
                print(f"| {name} | {va or '–'} | {vb or '–'} |")
            print()


main()

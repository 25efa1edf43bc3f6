#!/usr/bin/env python3
"""The host side of ci/bench/fleet.sh: simulated hosts and the numbers.

    fleet.py topology --name NAME --activator BIN --hosts-dir DIR --hosts N
        --parallel P --timeout SECS --layout DIR --image REPO (no tag)
        --key PUB [--identity REPO] --registries JSON --log FILE:ROLE ...
        --results FILE
    fleet.py table --results FILE

`topology` makes N host roots (a minimal root per host: the config, the
trusted key; the activator creates its state, store and slot under it),
then runs two rounds: every host `fetch`es tag v1, then every host is
pointed at v2 and `fetch`es again. At most P activator processes run at
once; each is killed after SECS. A round's numbers come from the access
logs (only the lines written during the round: the file size is noted
before it starts) and from every host's report.json. A host converged
when it exited 0 with outcome `staged` and its report names the round's
image: `digest` the platform manifest, `index_digest` (when present) the
index the tag points at. `table` prints the rounds of every topology and
the ratios, and exits 1 naming the first failure when any host of any
round failed.

Log roles: `origin` (the registry that holds the images: its bytes out are
what a fleet costs the origin), `hosts` (the server the hosts talk to: its
requests per host), `limiter` (nginx: its 429 answers). One file may have
several roles (topology 1: the origin is what the hosts talk to).
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

# Combined log format (docker-registry's access log and nginx's default):
# IP - USER [DATE] "METHOD PATH PROTO" STATUS BYTES "REFERER" "AGENT"
LINE = re.compile(r'^\S+ \S+ \S+ \[[^\]]*\] "(\S+) (\S+)[^"]*" (\d{3}) (\d+|-)')

CA = "-----BEGIN CERTIFICATE-----\nMIIBfleet\n-----END CERTIFICATE-----\n"

children = {}


def stop_children(signum, _frame):
    for p in list(children.values()):
        try:
            p.kill()
        except OSError:
            pass
    sys.exit(128 + signum)


def read_window(path, start):
    """Parsed access-log lines written after byte offset `start`."""
    out = []
    with open(path, "rb") as f:
        f.seek(start)
        for raw in f:
            m = LINE.match(raw.decode("utf-8", "replace"))
            if m:
                method, path_, status, size = m.groups()
                out.append((method, path_, int(status), 0 if size == "-" else int(size)))
    return out


def layout_digests(layout):
    """tag -> (the tag's digest: an index or a manifest, the amd64 platform
    manifest's digest, [(blob digest, size)] of that platform image)."""
    index = json.load(open(os.path.join(layout, "index.json")))

    def blob(d):
        return json.load(open(os.path.join(layout, "blobs", "sha256", d.split(":", 1)[1])))

    out = {}
    for entry in index["manifests"]:
        tag = entry.get("annotations", {}).get("org.opencontainers.image.ref.name")
        if tag not in ("v1", "v2"):
            continue
        top = blob(entry["digest"])
        manifest, manifest_digest = top, entry["digest"]
        if "manifests" in top:
            plat = [m for m in top["manifests"]
                    if m.get("platform", {}).get("architecture") == "amd64"]
            manifest_digest = plat[0]["digest"]
            manifest = blob(manifest_digest)
        blobs = [(manifest["config"]["digest"], manifest["config"]["size"])]
        blobs += [(l["digest"], l["size"]) for l in manifest["layers"]]
        out[tag] = (entry["digest"], manifest_digest, blobs)
    return out


def make_hosts(args, tag):
    os.makedirs(args.hosts_dir, exist_ok=True)
    registries = json.loads(args.registries)
    for i in range(args.hosts):
        root = os.path.join(args.hosts_dir, f"h{i:04d}")
        etc = os.path.join(root, "etc", "kubeslot")
        os.makedirs(etc, exist_ok=True)
        if not os.path.exists(os.path.join(etc, "trust.pub")):
            shutil.copyfile(args.key, os.path.join(etc, "trust.pub"))
        config = {
            "image": f"{args.image}:{tag}",
            "registries": registries,
            "trust": {"public_keys": ["/etc/kubeslot/trust.pub"]},
            "kubelet": {
                "api_server": "https://127.0.0.1:6443",
                "ca_data": CA,
                "bootstrap_token": "abcdef.0123456789abcdef",
                "node_name": f"fleet-{i:04d}",
            },
            "gpu": "off",
            "nameservers": ["192.0.2.53"],
        }
        if args.identity:
            config["trust"]["identity"] = args.identity
        if args.deadline:
            config["download"] = {"deadline_secs": args.deadline}
        tmp = os.path.join(etc, ".activator.json.tmp")
        with open(tmp, "w") as f:
            json.dump(config, f)
        os.rename(tmp, os.path.join(etc, "activator.json"))


def launch(args):
    """Runs `fetch` on every host, at most `parallel` at once (with
    --canary, the first host alone, then the others). Returns (seconds
    from the first start to the last end, per-host exit codes, seconds
    from the first start to each host's end)."""
    roots = sorted(os.listdir(args.hosts_dir))
    queue = list(roots)
    codes, ends = {}, {}
    t0 = time.monotonic()
    started = {}
    canary = roots[0] if args.canary else None
    logs = os.path.join(os.path.dirname(args.hosts_dir.rstrip("/")), "host-logs")
    os.makedirs(logs, exist_ok=True)
    while queue or children:
        while queue and len(children) < args.parallel and not (canary and canary in children):
            name = queue.pop(0)
            root = os.path.join(args.hosts_dir, name)
            err = open(os.path.join(logs, f"{name}.stderr"), "w")
            children[name] = subprocess.Popen(
                [args.activator, "fetch", "--json", "--root", root],
                stdout=subprocess.DEVNULL, stderr=err)
            err.close()
            started[name] = time.monotonic()
        time.sleep(0.02)
        now = time.monotonic()
        for name, p in list(children.items()):
            rc = p.poll()
            if rc is None and now - started[name] > args.timeout:
                p.kill()
                rc = p.wait()
                codes[name] = f"killed after {args.timeout}s"
            if rc is not None:
                codes.setdefault(name, rc)
                ends[name] = now - t0
                del children[name]
    return time.monotonic() - t0, codes, ends


def host_failure(code, report, index, manifest):
    """Why a host did not converge on the round's image, or None when it
    did: it exited 0, its outcome is `staged` and its report names the
    image the round expects. `digest` is the platform manifest the host
    verified (what the signature covers for it); `index_digest`, when the
    report has one, is the index the tag resolved to."""
    if code != 0 or report.get("outcome") != "staged":
        return f"exit {code}, outcome {report.get('outcome')}: {report.get('error', report.get('digest'))}"
    if report.get("digest") != manifest:
        return f"staged {report.get('digest')}, expected the platform manifest {manifest}"
    if report.get("index_digest", index) != index:
        return f"staged from index {report.get('index_digest')}, expected {index}"
    return None


def stderr_tail(args, name):
    """The last line of a host's stderr (its error), for failure messages."""
    path = os.path.join(os.path.dirname(args.hosts_dir.rstrip("/")), "host-logs", f"{name}.stderr")
    try:
        lines = [l.strip() for l in open(path, errors="replace") if l.strip()]
    except OSError:
        return ""
    return f" (stderr: {lines[-1]})" if lines else ""


def run_round(args, tag, digests, logs):
    make_hosts(args, tag)
    offsets = {path: os.path.getsize(path) for path, _ in logs}
    wall, codes, ends = launch(args)
    time.sleep(0.5)  # the registries flush their access log lines
    index, manifest = digests[tag][0], digests[tag][1]
    failures, converged = [], []
    waited_ms, throttled, sent = [], 0, 0
    for name in sorted(codes):
        report_path = os.path.join(args.hosts_dir, name, "var/lib/kubeslot/report.json")
        try:
            report = json.load(open(report_path))
        except (OSError, ValueError) as e:
            failures.append(f"{name}: exit {codes[name]}, no report ({e}){stderr_tail(args, name)}")
            continue
        wrong = host_failure(codes[name], report, index, manifest)
        if wrong:
            failures.append(f"{name}: {wrong}" + ("" if "error" in report else stderr_tail(args, name)))
            continue
        converged.append(ends[name])
        # Written by activators that count their registry requests.
        reg = report.get("registry_requests")
        if reg:
            waited_ms.append(reg.get("waited_ms", 0))
            throttled += reg.get("throttled", 0)
            sent += reg.get("sent", 0)
    row = {"topology": args.name, "round": tag, "hosts": args.hosts, "wall_s": wall,
           "converged": len(converged), "failures": len(failures),
           "failure_examples": failures[:3],
           "last_converged_s": max(converged) if converged else None}
    if waited_ms:
        row["waited_s_max"] = max(waited_ms) / 1000
        row["waited_s_mean"] = sum(waited_ms) / len(waited_ms) / 1000
        row["throttled"] = throttled
        row["reported_requests"] = sent
    for path, roles in logs:
        lines = read_window(path, offsets[path])
        if "origin" in roles:
            row["origin_bytes"] = sum(size for m, _, s, size in lines if m == "GET")
            row["origin_blob_bytes"] = sum(size for m, p, s, size in lines
                                           if m == "GET" and "/blobs/" in p)
            row["origin_requests"] = len(lines)
        if "hosts" in roles:
            row["host_requests"] = len(lines)
            row["host_bytes"] = sum(size for m, _, s, size in lines if m == "GET")
            row["host_blob_gets"] = sum(1 for m, p, s, _ in lines
                                        if m == "GET" and "/blobs/" in p and s in (200, 206))
        if "limiter" in roles:
            row["answered_429"] = sum(1 for _, _, s, _ in lines if s == 429)
    v1 = dict(digests["v1"][2])
    new = [(d, n) for d, n in digests[tag][2] if tag == "v1" or d not in v1]
    row["new_bytes"] = sum(n for _, n in new)
    with open(args.results, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(f"fleet: topology {args.name}, {tag}: {len(converged)}/{args.hosts} hosts converged, "
          f"last after {row['last_converged_s'] or 0:.1f} s, {len(failures)} failed", file=sys.stderr)
    for f_ in failures[:3]:
        print(f"fleet:   {f_}", file=sys.stderr)


def topology(args):
    signal.signal(signal.SIGTERM, stop_children)
    signal.signal(signal.SIGINT, stop_children)
    digests = layout_digests(args.layout)
    logs = {}
    for spec in args.log:
        path, role = spec.rsplit(":", 1)
        logs.setdefault(path, set()).add(role)
    logs = sorted(logs.items())
    for tag in ("v1", "v2"):
        run_round(args, tag, digests, logs)


def mb(n):
    return f"{n / 1e6:.2f}"


def table(args):
    rows = [json.loads(l) for l in open(args.results)]
    print("| topology | round | hosts | origin MB out | MB/host | requests/host | waited/host (max) "
          "| last host converged | failures | ratio (blobs only) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        n = r["hosts"]
        origin, blobs = r.get("origin_bytes", 0), r.get("origin_blob_bytes", 0)
        new = r["new_bytes"]
        if r["topology"].startswith("1"):
            ratio = f"{origin / (new * n):.3f} ({blobs / (new * n):.3f})"
        elif r["topology"].startswith("2"):
            ratio = f"{origin / new:.3f} ({blobs / new:.3f})"
        else:
            ratio = f"{r.get('answered_429', 0)} × 429"
        waited = "-"
        if "waited_s_max" in r:
            waited = f"{r['waited_s_mean']:.1f} s ({r['waited_s_max']:.1f} s)"
        last = r["last_converged_s"]
        print(f"| {r['topology']} | {r['round']} (new {mb(new)} MB) | {n} | {mb(origin)} | "
              f"{mb(r.get('host_bytes', 0) / n)} | {r.get('host_requests', 0) / n:.1f} | {waited} | "
              f"{'-' if last is None else f'{last:.1f} s'} | {r['failures']} | {ratio} |")
    print()
    print("ratio: origin bytes / (new bytes x hosts) for 1, origin bytes / new bytes for 2*;"
          " in brackets the same for blob GETs only (manifests and tags left out)")
    failed = [r for r in rows if r["failures"]]
    for r in failed:
        for f in r.get("failure_examples", [])[:1]:
            print(f"first failure ({r['topology']}, {r['round']}): {f}")
    if failed:
        r = failed[0]
        total = sum(r_["failures"] for r_ in failed)
        print(f"fleet: {total} host runs failed in {len(failed)} of {len(rows)} rounds; the first "
              f"({r['topology']}, {r['round']}): {r['failure_examples'][0]}", file=sys.stderr)
        sys.exit(1)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("topology")
    t.add_argument("--name", required=True)
    t.add_argument("--activator", required=True)
    t.add_argument("--hosts-dir", required=True)
    t.add_argument("--hosts", type=int, required=True)
    t.add_argument("--parallel", type=int, required=True)
    t.add_argument("--timeout", type=int, required=True)
    t.add_argument("--deadline", type=int, default=0)
    t.add_argument("--canary", action="store_true")
    t.add_argument("--layout", required=True)
    t.add_argument("--image", required=True)
    t.add_argument("--key", required=True)
    t.add_argument("--identity", default="")
    t.add_argument("--registries", default="{}")
    t.add_argument("--log", action="append", default=[])
    t.add_argument("--results", required=True)
    tb = sub.add_parser("table")
    tb.add_argument("--results", required=True)
    args = p.parse_args()
    {"topology": topology, "table": table}[args.cmd](args)


if __name__ == "__main__":
    main()

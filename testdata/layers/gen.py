#!/usr/bin/env python3
"""Generates the hostile (and a few benign) layer corpus for the unpacker.

    testdata/layers/gen.py        # rewrites testdata/layers/<scenario>/

Each scenario directory holds:
  layer-N.tar | layer-N.tar.gz | layer-N.tar.zst   layers applied in order
  expect        "rule: NAME" (or "rule: ok") and "layer: N" (the failing layer)
  policy        optional "key = value" overrides of the default Policy
                (max_layer_bytes, max_total_bytes, max_entries, max_path_bytes,
                max_depth, allow_fifos_and_sockets)
  diff_ids      optional, one digest per layer, replacing the computed ones
  tree          for "ok" scenarios: the expected tree, one line per path
                ("PATH TYPE MODE UID:GID [SYMLINK-TARGET|FILE-TEXT]", sorted;
                the file text without its final newline)

The test (activator/tests/unpack.rs) unpacks each into `TMP/target` beside
`TMP/sentinel` (a file `keep.txt`, a directory `sub/` with `inner.txt`, and a
symlink `link -> keep.txt`) and `TMP/into-sentinel -> sentinel`; hostile
entries aim at `../sentinel/...` and `../into-sentinel/...`. The
output is deterministic (fixed times, gzip mtime 0), so re-running the script
gives byte-identical files.
"""

import gzip
import io
import os
import shutil
import subprocess
import tarfile

HERE = os.path.dirname(os.path.abspath(__file__))
MTIME = 1700000000


def ti(name, type=tarfile.REGTYPE, mode=0o644, data=b"", linkname="", uid=0, gid=0, pax=None):
    t = tarfile.TarInfo(name)
    t.type = type
    t.mode = mode
    t.mtime = MTIME
    t.uid, t.gid = uid, gid
    t.uname = t.gname = ""
    t.linkname = linkname
    t.size = len(data) if type in (tarfile.REGTYPE, tarfile.AREGTYPE) else 0
    if pax:
        t.pax_headers = dict(pax)
    return (t, data)


def d(name, mode=0o755, **kw):
    return ti(name, tarfile.DIRTYPE, mode, **kw)


def f(name, data=b"x\n", mode=0o644, **kw):
    return ti(name, tarfile.REGTYPE, mode, data, **kw)


def sym(name, target, **kw):
    return ti(name, tarfile.SYMTYPE, 0o777, linkname=target, **kw)


def hard(name, target, **kw):
    return ti(name, tarfile.LNKTYPE, 0o644, linkname=target, **kw)


def tar_bytes(entries, fmt=tarfile.PAX_FORMAT, global_pax=None):
    buf = io.BytesIO()
    kw = {"format": fmt}
    if global_pax:
        kw["pax_headers"] = global_pax
    with tarfile.open(fileobj=buf, mode="w", **kw) as t:
        for info, data in entries:
            t.addfile(info, io.BytesIO(data) if info.size else None)
    return buf.getvalue()


def octal(n, width):
    return ("%0*o" % (width - 1, n)).encode() + b"\0"


def raw_header(name, typeflag=b"0", mode=0o644, size=0, linkname=b"", bad_checksum=False,
               gnu=False, sparse=None):
    """A ustar header built by hand, for what tarfile refuses to write."""
    h = bytearray(512)
    h[0:len(name)] = name
    h[100:108] = octal(mode, 8)
    h[108:116] = octal(0, 8)
    h[116:124] = octal(0, 8)
    h[124:136] = octal(size, 12)
    h[136:148] = octal(MTIME, 12)
    h[148:156] = b" " * 8
    h[156:157] = typeflag
    h[157:157 + len(linkname)] = linkname
    if gnu:
        h[257:265] = b"ustar  \0"
    if sparse:  # [(offset, numbytes)] and the real size
        chunks, realsize = sparse
        for i, (off, num) in enumerate(chunks):
            h[386 + 24 * i:398 + 24 * i] = octal(off, 12)
            h[398 + 24 * i:410 + 24 * i] = octal(num, 12)
        h[483:495] = octal(realsize, 12)
    else:
        h[257:263] = b"ustar\0"
        h[263:265] = b"00"
    s = sum(h)
    if bad_checksum:
        s += 1
    h[148:156] = ("%06o" % s).encode() + b"\0 "
    return bytes(h)


def raw_tar(*members):
    """members: (header, data) pairs; adds padding and the end marker."""
    out = b""
    for header, data in members:
        out += header + data + b"\0" * (-len(data) % 512)
    return out + b"\0" * 1024


def gz(b):
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=9) as g:
        g.write(b)
    return buf.getvalue()


def zst(b, *flags):
    return subprocess.run(["zstd", "-q", "-19", "-c", *flags], input=b, check=True,
                          capture_output=True).stdout


SCENARIOS = {}


def scenario(name, layers, rule, layer=None, policy=None, diff_ids=None, tree=None):
    """layers: list of (suffix, bytes) with suffix in tar, tar.gz, tar.zst."""
    assert name not in SCENARIOS, name
    if layer is None:
        layer = len(layers) - 1
    SCENARIOS[name] = (layers, rule, layer, policy, diff_ids, tree)


def t(entries, **kw):
    return ("tar", tar_bytes(entries, **kw))


def tgz(entries, **kw):
    return ("tar.gz", gz(tar_bytes(entries, **kw)))


# --- names -------------------------------------------------------------------
scenario("name-dotdot", [t([f("../sentinel/pwned")])], "dotdot")
scenario("name-dotdot-middle", [t([d("a"), f("a/../../sentinel/pwned")])], "dotdot")
scenario("name-dotdot-alone", [t([d("..")])], "dotdot")
scenario("name-absolute", [t([f("/tmp/kubeslot-unpack-pwned")])], "absolute")
scenario("name-empty", [("tar", raw_tar((raw_header(b""), b"")))], "empty-name")
scenario("name-nul-pax", [t([f("ok", pax={"path": "a\0b"})])], "nul-byte")
scenario("name-too-long", [t([f("a" * 5000)])], "path-too-long")
scenario("name-too-deep", [t([f("d/" * 200 + "f")])], "too-deep")
scenario("name-root-not-dir", [t([f("./")])], "root-entry")

# --- symlinks ----------------------------------------------------------------
scenario("symlink-parent-escape",
         [t([sym("esc", "../sentinel"), f("esc/pwned")])], "symlink-parent")
scenario("symlink-parent-absolute",
         [t([sym("r", "/tmp"), f("r/kubeslot-unpack-pwned")])], "symlink-parent")
scenario("symlink-parent-next-layer",
         [t([sym("esc", "../sentinel")]), t([f("esc/keep.txt", b"pwned\n")])],
         "symlink-parent", layer=1)
scenario("symlink-parent-deep",
         [t([d("a"), sym("a/b", "../../sentinel"), f("a/b/sub/inner.txt", b"pwned\n")])],
         "symlink-parent")
scenario("symlink-parent-via-outside-symlink",
         [t([sym("esc", "../into-sentinel"), f("esc/keep.txt", b"pwned\n")])], "symlink-parent")
scenario("hardlink-via-outside-symlink",
         [t([sym("esc", "../into-sentinel"), hard("h", "esc/keep.txt")])], "symlink-parent")
scenario("symlink-loop", [t([sym("a", "b"), sym("b", "a"), f("a/x")])], "symlink-parent")
scenario("symlink-self-loop", [t([sym("l", "l"), f("l/x")])], "symlink-parent")
scenario("symlink-dir-then-file-through",
         [t([sym("esc", "../sentinel")]), t([d("esc/sub")])],
         "symlink-parent", layer=1)
scenario("symlink-target-too-long", [t([sym("l", "a/" * 2100)])], "path-too-long")
scenario("parent-is-file", [t([f("f"), f("f/x")])], "parent-not-directory")

# --- hardlinks ---------------------------------------------------------------
scenario("hardlink-outside", [t([hard("h", "../sentinel/keep.txt")])], "hardlink-outside")
scenario("hardlink-absolute", [t([hard("h", "/etc/passwd")])], "hardlink-outside")
scenario("hardlink-to-dir", [t([d("d"), hard("h", "d")])], "hardlink-to-directory")
scenario("hardlink-missing", [t([hard("h", "nope")])], "hardlink-missing")
scenario("hardlink-forward", [t([hard("h", "f"), f("f")])], "hardlink-missing")
scenario("hardlink-to-symlink-outside",
         [t([sym("s", "../sentinel/keep.txt"), hard("h", "s")])], "hardlink-not-regular")
scenario("hardlink-through-symlink-parent",
         [t([sym("s", "../sentinel"), hard("h", "s/keep.txt")])], "symlink-parent")
scenario("hardlink-gnu-longlink-outside",
         [t([hard("h", "../" * 40 + "sentinel/keep.txt")], fmt=tarfile.GNU_FORMAT)],
         "hardlink-outside")
scenario("hardlink-to-setuid",
         [t([d("usr"), d("usr/bin"), f("usr/bin/su", mode=0o4755), d("tmp"), hard("tmp/su", "usr/bin/su")])],
         "setuid")

# --- special files -----------------------------------------------------------
scenario("special-char-device",
         [t([ti("null", tarfile.CHRTYPE, 0o666)])], "device")
scenario("special-block-device",
         [t([ti("sda", tarfile.BLKTYPE, 0o660)])], "device")
scenario("special-fifo", [t([ti("fifo", tarfile.FIFOTYPE, 0o644)])], "fifo-or-socket")
scenario("special-socket-mode",
         [("tar", raw_tar((raw_header(b"sock", mode=0o140755), b"")))], "fifo-or-socket")

# --- whiteouts ---------------------------------------------------------------
scenario("whiteout-bare", [t([d("a"), f("a/.wh.")])], "malformed-whiteout")
scenario("whiteout-dot", [t([d("a"), f("a/.wh..")])], "malformed-whiteout")
scenario("whiteout-dotdot", [t([d("a"), f("a/.wh...")])], "malformed-whiteout")
scenario("whiteout-aufs-meta", [t([f(".wh..wh.plnk")])], "malformed-whiteout")
scenario("whiteout-dir-component", [t([f(".wh.a/b")])], "malformed-whiteout")
scenario("whiteout-through-symlink",
         [t([sym("s", "../sentinel")]), t([f("s/.wh.keep.txt", b"")])],
         "symlink-parent", layer=1)
scenario("whiteout-opaque-through-symlink",
         [t([sym("s", "../sentinel")]), t([f("s/.wh..wh..opq", b"")])],
         "symlink-parent", layer=1)

# --- tar format tricks -------------------------------------------------------
scenario("tar-pax-global-header", [t([f("a")], global_pax={"comment": "x"})], "pax-global-header")
scenario("tar-gnu-sparse",
         [("tar", raw_tar((raw_header(b"sparse", typeflag=b"S", size=512, gnu=True,
                                      sparse=([(0, 512), (1 << 30, 0)], 1 << 30)), b"s" * 512)))],
         "sparse")
scenario("tar-pax-sparse",
         [t([f("s", pax={"GNU.sparse.major": "1", "GNU.sparse.minor": "0",
                         "GNU.sparse.name": "s", "GNU.sparse.realsize": "2"})])],
         "sparse")
scenario("tar-duplicate", [t([f("a", b"1"), f("a", b"2")])], "duplicate")
scenario("tar-duplicate-normalised", [t([d("a"), d("./a/")])], "duplicate")
scenario("tar-pax-path-dotdot",
         [t([f("harmless", pax={"path": "../sentinel/keep.txt"})])], "dotdot")
scenario("tar-gnu-longname-absolute",
         [t([f("/" + "x" * 150)], fmt=tarfile.GNU_FORMAT)], "absolute")
scenario("tar-volume-label",
         [("tar", raw_tar((raw_header(b"label", typeflag=b"V"), b"")))], "entry-type")
scenario("tar-bad-checksum",
         [("tar", raw_tar((raw_header(b"a", bad_checksum=True), b"")))], "malformed-archive")
scenario("tar-truncated", [("tar", tar_bytes([f("big", b"y" * 4096)])[:1536])], "malformed-archive")
scenario("tar-gzip-garbage", [("tar.gz", gz(tar_bytes([f("a")]))[:-12] + b"garbage!garbage!")],
         "malformed-archive")
scenario("tar-zstd-dotdot", [("tar.zst", zst(tar_bytes([f("../sentinel/pwned")])))], "dotdot")

def ext_member(typeflag, data, name=b"././@LongLink", gnu=True):
    return (raw_header(name, typeflag=typeflag, size=len(data), gnu=gnu), data)


def pax_record(key, value):
    """One "LEN KEY=VALUE\\n" record; LEN counts itself."""
    body = b" " + key + b"=" + value + b"\n"
    n = len(body) + len(str(len(body)))
    if len(str(n)) + len(body) != n:
        n += 1
    return str(n).encode() + body


scenario("tar-gnu-longname-huge",
         [("tar.zst", zst(raw_tar(ext_member(b"L", b"a" * (64 << 20)), (raw_header(b"x"), b""))))],
         "path-too-long")
scenario("tar-pax-header-huge",
         [("tar.zst", zst(raw_tar(ext_member(b"x", pax_record(b"comment", b"a" * (4 << 20)),
                                             name=b"PaxHeader/x", gnu=False),
                                  (raw_header(b"x"), b""))))],
         "malformed-archive")
scenario("tar-pax-size-disagrees",
         [("tar", raw_tar(ext_member(b"x", pax_record(b"size", b"1024"), name=b"PaxHeader/f", gnu=False),
                          (raw_header(b"f", size=4), b"abcd")))],
         "malformed-archive")
scenario("tar-two-gnu-longnames",
         [("tar", raw_tar(ext_member(b"L", b"first\0"), ext_member(b"L", b"second\0"),
                          (raw_header(b"x"), b"")))],
         "malformed-archive")
scenario("tar-longname-and-pax-path",
         [("tar", raw_tar(ext_member(b"x", pax_record(b"path", b"one"), name=b"PaxHeader/x", gnu=False),
                          ext_member(b"L", b"two\0"), (raw_header(b"x"), b"")))],
         "malformed-archive")
scenario("tar-pax-uid-minus-one", [t([f("f", pax={"uid": "4294967295"})])], "malformed-archive")
scenario("tar-pax-mtime-garbage", [t([f("f", pax={"mtime": "soon"})])], "malformed-archive")
scenario("tar-trailing-extension-header",
         [("tar", raw_tar(ext_member(b"L", b"dangling\0")))], "malformed-archive")
scenario("ok-pax-owner-and-long-names",
         [t([d("d"), f("d/" + "n" * 150, b"long\n", pax={"uid": "70000", "gid": "70001"}),
             sym("d/l", "t" * 150)], fmt=tarfile.PAX_FORMAT),
          t([f("g/" + "m" * 120, b"gnu\n")], fmt=tarfile.GNU_FORMAT)], "ok",
         tree=["d dir 0755 0:0", "d/" + "n" * 150 + " file 0644 70000:70001 long",
               "d/l symlink 0777 0:0 " + "t" * 150, "g dir 0755 0:0",
               "g/" + "m" * 120 + " file 0644 0:0 gnu"])

# --- resource exhaustion -----------------------------------------------------
scenario("limit-entries", [t([f("f%03d" % i) for i in range(100)])], "too-many-entries",
         policy={"max_entries": 50})
scenario("limit-zip-bomb", [tgz([f("zeros", b"\0" * (16 << 20))])], "layer-too-large",
         policy={"max_layer_bytes": 4 << 20})
scenario("limit-total-bytes",
         [tgz([f("a", b"\0" * (3 << 20))]), tgz([f("b", b"\0" * (3 << 20))])],
         "total-too-large", layer=1,
         policy={"max_layer_bytes": 4 << 20, "max_total_bytes": 5 << 20})
# a frame that asks the decoder for a 1 GiB window (streamed: no size to shrink it)
scenario("limit-zstd-window", [("tar.zst", zst(tar_bytes([f("a")]), "--long=30"))],
         "malformed-archive")
scenario("limit-path-bytes-policy", [t([f("a" * 300)])], "path-too-long",
         policy={"max_path_bytes": 255})
scenario("limit-depth-policy", [t([f("a/b/c/d/e")])], "too-deep", policy={"max_depth": 4})

# --- privileges --------------------------------------------------------------
scenario("setuid-not-allowlisted",
         [t([d("usr"), d("usr/bin"), f("usr/bin/evil", mode=0o4755)])], "setuid")
scenario("setgid-not-allowlisted",
         [t([d("usr"), d("usr/bin"), f("usr/bin/evil", mode=0o2755)])], "setuid")
scenario("capability-not-allowlisted",
         [t([d("usr"), d("usr/bin"),
             f("usr/bin/evil", mode=0o755,
               pax={"SCHILY.xattr.security.capability":
                    "\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"})])],
         "setuid")

# --- integrity ---------------------------------------------------------------
scenario("diff-id-mismatch", [tgz([f("a")])], "diff-id-mismatch",
         diff_ids=["sha256:" + "0" * 64])

# --- benign scenarios the sentinel must survive --------------------------------
scenario("ok-replace-symlink-with-file",
         [t([sym("esc", "../sentinel/keep.txt")]), t([f("esc", b"mine\n")])], "ok",
         tree=["esc file 0644 0:0 mine"])
scenario("ok-whiteout-symlink-to-outside",
         [t([sym("esc", "../sentinel")]), t([f(".wh.esc", b"")])], "ok", tree=[])
scenario("ok-opaque-root-with-symlink",
         [t([sym("esc", "../sentinel"), d("keep"), f("keep/a")]),
          t([f(".wh..wh..opq", b""), d("new")])], "ok",
         tree=["new dir 0755 0:0"])
scenario("ok-dir-replaces-symlink",
         [t([sym("esc", "../sentinel")]), t([d("esc"), f("esc/keep.txt", b"mine\n")])], "ok",
         tree=["esc dir 0755 0:0", "esc/keep.txt file 0644 0:0 mine"])
scenario("ok-fifo-allowed", [t([ti("fifo", tarfile.FIFOTYPE, 0o600)])], "ok",
         policy={"allow_fifos_and_sockets": "true"}, tree=["fifo fifo 0600 0:0"])
scenario("ok-socket-allowed",
         [("tar", raw_tar((raw_header(b"sock", mode=0o140750), b"")))], "ok",
         policy={"allow_fifos_and_sockets": "true"}, tree=["sock socket 0750 0:0"])
scenario("ok-setuid-allowlisted",
         [t([d("usr", mode=0o755), d("usr/bin"), f("usr/bin/su", mode=0o4755, uid=0, gid=0),
             f("usr/bin/wall", mode=0o2755, gid=5)])], "ok",
         tree=["usr dir 0755 0:0", "usr/bin dir 0755 0:0", "usr/bin/su file 4755 0:0 x",
               "usr/bin/wall file 2755 0:5 x"])


CAP_NET_RAW = ("\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00"
               "\x00\x00\x00\x00\x00\x00\x00\x00")
scenario("ok-capability-and-xattrs",
         [t([d("usr"), d("usr/bin"),
             f("usr/bin/ping", mode=0o755, pax={"SCHILY.xattr.security.capability": CAP_NET_RAW,
                                               "SCHILY.xattr.user.kubeslot": "yes",
                                               "SCHILY.xattr.trusted.overlay.opaque": "y",
                                               "SCHILY.xattr.security.selinux": "x_t"}),
             d("dir", pax={"SCHILY.xattr.user.dir": "1",
                           "SCHILY.xattr.system.posix_acl_access": "\x02\x00\x00\x00"})])],
         "ok",
         tree=["dir dir 0755 0:0", "usr dir 0755 0:0", "usr/bin dir 0755 0:0",
               "usr/bin/ping file 0755 0:0 x"])


def main():
    for entry in os.listdir(HERE):
        p = os.path.join(HERE, entry)
        if os.path.isdir(p):
            shutil.rmtree(p)
    for name, (layers, rule, layer, policy, diff_ids, tree) in sorted(SCENARIOS.items()):
        out = os.path.join(HERE, name)
        os.makedirs(out)
        for i, (suffix, data) in enumerate(layers):
            with open(os.path.join(out, "layer-%d.%s" % (i, suffix)), "wb") as fh:
                fh.write(data)
        with open(os.path.join(out, "expect"), "w") as fh:
            fh.write("rule: %s\n" % rule)
            if rule != "ok":
                fh.write("layer: %d\n" % layer)
        if policy:
            with open(os.path.join(out, "policy"), "w") as fh:
                for k, v in sorted(policy.items()):
                    fh.write("%s = %s\n" % (k, v))
        if diff_ids:
            with open(os.path.join(out, "diff_ids"), "w") as fh:
                fh.write("".join(x + "\n" for x in diff_ids))
        if tree is not None:
            with open(os.path.join(out, "tree"), "w") as fh:
                fh.write("".join(line + "\n" for line in sorted(tree)))
    print("%d scenarios" % len(SCENARIOS))


if __name__ == "__main__":
    main()

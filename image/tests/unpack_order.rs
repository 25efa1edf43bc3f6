//! Which error an unpacker reports when a layer is broken in two places,
//! and where the stream's own errors land: the decompressor runs ahead of
//! the tar parser on another thread (`image/src/unpack/pipe.rs`), and
//! neither may change what one thread reported. The first failure in
//! stream order wins, and a stream error (corruption, the uncompressed
//! budget) names the entry whose bytes the failing read call held, the
//! unpacker reading 256 KiB per call as it always did.

use std::io::Write;

use kubeslot_image::digest::Digest;
use kubeslot_image::oci::Compression;
use kubeslot_image::unpack::{Layer, Policy, Rule, UnpackError, Unpacker};

/// Bytes the unpacker asks its decompressor for per call.
const READ: u64 = 256 * 1024;

/// Bytes that do not compress (xorshift), so a layer's compressed size
/// tracks its tar and a truncation lands where it is put.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A tar of regular files `(name, size, mode)` with ustar headers (no
/// extension headers, so entry `i` is the `i`-th header), and where each
/// entry's data starts and ends.
fn tar_of(files: &[(&str, usize, u32)]) -> (Vec<u8>, Vec<(u64, u64)>) {
    let mut b = tar::Builder::new(Vec::new());
    let mut spans = Vec::new();
    let mut at = 0u64;
    for (i, (name, size, mode)) in files.iter().enumerate() {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(*mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_600_000_000);
        h.set_size(*size as u64);
        b.append_data(&mut h, name, &noise(*size, i as u64 + 1)[..])
            .unwrap();
        let start = at + 512;
        spans.push((start, start + *size as u64));
        at = start + (*size as u64).div_ceil(512) * 512;
    }
    (b.into_inner().unwrap(), spans)
}

fn zstd(raw: &[u8]) -> Vec<u8> {
    let mut e = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
    e.write_all(raw).unwrap();
    e.finish().unwrap()
}

/// Unpacks one layer `bytes` (of uncompressed `raw`) into a fresh directory.
fn unpack(bytes: &[u8], raw: &[u8], c: Compression, policy: Policy) -> Result<(), UnpackError> {
    let dir = tempfile::tempdir().unwrap();
    let mut u = Unpacker::new(dir.path(), policy).unwrap();
    u.apply(Layer {
        index: 0,
        digest: Digest::of(bytes),
        diff_id: Digest::of(raw),
        compression: c,
        reader: bytes,
    })?;
    u.finish().map(|_| ())
}

/// Many small files (slow to write, so the decompressor gets ahead), one
/// setuid file outside the allowlist, then 1.5 MiB more: a truncation
/// after it is read calls later.
fn setuid_then_more() -> Vec<u8> {
    let names: Vec<String> = (0..400).map(|i| format!("f{i:03}")).collect();
    let mut files: Vec<(&str, usize, u32)> =
        names.iter().map(|n| (n.as_str(), 700, 0o644)).collect();
    files.push(("suid", 10, 0o4755));
    files.push(("big", 3 << 19, 0o644));
    tar_of(&files).0
}

#[test]
fn a_rule_broken_before_a_corrupt_stream_wins() {
    let raw = setuid_then_more();
    let z = zstd(&raw);
    // cut inside "big": the stream fails about 1 MiB after the setuid
    // entry, far less than the decompressor may run ahead
    let cut = &z[..z.len() - (1 << 19)];
    let e = unpack(cut, &raw, Compression::Zstd, Policy::default()).unwrap_err();
    assert_eq!(e.rule, Rule::Setuid, "{e}");
    assert_eq!(e.entry, Some((400, "suid".into())), "{e}");
}

#[test]
fn a_corrupt_stream_before_a_rule_broken_wins() {
    let raw = setuid_then_more();
    let z = zstd(&raw);
    // cut about 100 KiB in: the small files before the setuid one
    let e = unpack(&z[..100_000], &raw, Compression::Zstd, Policy::default()).unwrap_err();
    assert_eq!(e.rule, Rule::MalformedArchive, "{e}");
}

#[test]
fn the_budget_fails_the_read_call_that_passes_it_naming_its_entry() {
    // Files of 300,000 bytes: read calls and entries do not line up.
    let names: Vec<String> = (0..40).map(|i| format!("f{i:02}")).collect();
    let files: Vec<(&str, usize, u32)> =
        names.iter().map(|n| (n.as_str(), 300_000, 0o644)).collect();
    let (raw, spans) = tar_of(&files);
    let mut checked = 0;
    for limit in [READ * 7 + 1, READ * 11 - 1, 5_000_000, 9_876_543] {
        let mut policy = Policy::default();
        policy.limits.max_layer_bytes = limit;
        let e = unpack(&raw, &raw, Compression::None, policy).unwrap_err();
        assert_eq!(e.rule, Rule::LayerTooLarge, "{e}");
        // An uncompressed layer gives every call all it asks for: the
        // call that passes the limit starts at this byte, and the tar
        // side meets the failure there.
        let failing = limit / READ * READ;
        let inside = spans.iter().position(|(s, e)| (*s..*e).contains(&failing));
        match inside {
            Some(i) => {
                assert_eq!(e.entry, Some((i as u64, names[i].clone())), "{e}");
                checked += 1;
            }
            // in a header or padding: reading the next header fails
            None => assert_eq!(e.entry, None, "{e}"),
        }
    }
    assert!(checked >= 3, "the limits should land in file data");
}

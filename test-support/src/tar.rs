//! Tar and gzip builders for test layers: regular files and directories
//! owned by root with a fixed mtime, deterministic noise for incompressible
//! content. Hostile tars (for the unpacker) are written by the tests that
//! need them, not here.

use std::io::{self, Read, Write};

/// The mtime every entry gets (any fixed value: tests compare digests).
pub const MTIME: u64 = 1_700_000_000;

/// A tar of directories (`dirs`, each ending in `/`, mode 0755) then
/// regular files (mode 0644), uid/gid 0, mtime [`MTIME`].
pub fn tar_with_dirs(dirs: &[&str], files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = ::tar::Builder::new(Vec::new());
    for dir in dirs {
        let mut h = header(::tar::EntryType::Directory, 0o755, 0);
        b.append_data(&mut h, dir, &[][..]).unwrap();
    }
    for (name, data) in files {
        let mut h = header(::tar::EntryType::Regular, 0o644, data.len() as u64);
        b.append_data(&mut h, name, *data).unwrap();
    }
    b.into_inner().unwrap()
}

/// A tar of regular files (mode 0644, uid/gid 0, mtime [`MTIME`]).
pub fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    tar_with_dirs(&[], files)
}

fn header(kind: ::tar::EntryType, mode: u32, size: u64) -> ::tar::Header {
    let mut h = ::tar::Header::new_ustar();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_mtime(MTIME);
    h.set_uid(0);
    h.set_gid(0);
    h
}

/// gzip at the fastest level (tests care about validity, not size).
pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// Deterministic pseudo-random bytes (xorshift; incompressible, unlike
/// zeros), `len` of them from `seed`.
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0; len];
    Noise::new(seed, len as u64).read_exact(&mut out).unwrap();
    out
}

/// [`noise`] as a reader, for content too large to hold in memory.
pub struct Noise {
    state: u64,
    left: u64,
}

impl Noise {
    pub fn new(seed: u64, len: u64) -> Noise {
        Noise {
            state: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            left: len,
        }
    }
}

impl Read for Noise {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        for chunk in buf[..n].chunks_mut(8) {
            self.state ^= self.state << 13;
            self.state ^= self.state >> 7;
            self.state ^= self.state << 17;
            chunk.copy_from_slice(&self.state.to_le_bytes()[..chunk.len()]);
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// sha256 of `bytes` as lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    kubeslot_image::Digest::of(bytes).hex()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tars_list_what_they_were_given() {
        let t = tar_with_dirs(&["etc/"], &[("etc/a", b"x")]);
        let mut a = ::tar::Archive::new(&t[..]);
        let names: Vec<String> = a
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(names, ["etc/", "etc/a"]);
    }

    #[test]
    fn noise_is_deterministic_and_not_constant() {
        assert_eq!(noise(1, 100), noise(1, 100));
        assert_ne!(noise(1, 100), noise(2, 100));
        assert!(noise(3, 64).windows(2).any(|w| w[0] != w[1]));
    }
}

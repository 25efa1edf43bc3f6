//! Content digests: the `sha256:<64 hex>` newtype every other module speaks,
//! and the streaming hashers that check bytes while they flow.
//!
//! A `Digest` can only be built by parsing (or by hashing), so a value of this
//! type is always well formed: lower-case hex of the right length, a known
//! algorithm. Only sha256 is accepted; an image that names another algorithm
//! is refused rather than half-supported.

use std::fmt;
use std::io::{self, Read, Write};
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest as _, Sha256};

/// A sha256 content digest, `sha256:<64 lower-case hex>`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest([u8; 32]);

/// Why a string is not a digest.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DigestError {
    #[error("digest {0:?}: only sha256 is supported")]
    Algorithm(String),
    #[error("digest {0:?}: expected 64 lower-case hex characters after \"sha256:\"")]
    Hex(String),
}

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Digest(Sha256::digest(bytes).into())
    }

    /// Builds a digest from a bare 64-character lower-case hex string.
    pub fn from_hex(hex_str: &str) -> Result<Self, DigestError> {
        let bad = || DigestError::Hex(hex_str.to_string());
        if hex_str.len() != 64 || hex_str.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(bad());
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(hex_str, &mut out).map_err(|_| bad())?;
        Ok(Digest(out))
    }

    /// The 64 hex characters, without the algorithm prefix (blob file names,
    /// the cosign `sha256-<hex>.sig` tag).
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }

    /// The cosign convention's tag for an artifact attached to this digest,
    /// e.g. `sha256-<hex>.sig`.
    pub fn attachment_tag(&self, kind: &str) -> String {
        format!("sha256-{}.{kind}", self.hex())
    }

    /// The inverse of [`Digest::attachment_tag`]: the subject digest and the
    /// kind (`sig`, `sbom`, `att`, …) of a tag `sha256-<hex>.<kind>`, or
    /// `None` when the tag is not of that shape (an image's own tag).
    pub fn parse_attachment_tag(tag: &str) -> Option<(Digest, &str)> {
        let (hex, kind) = tag.strip_prefix("sha256-")?.split_once('.')?;
        let kind_ok = !kind.is_empty()
            && kind
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        kind_ok.then_some(())?;
        Some((Digest::from_hex(hex).ok()?, kind))
    }

    /// The OCI referrers fallback tag of this digest, `sha256-<hex>`: an
    /// index of the manifests whose `subject` it is, for registries without
    /// the referrers API (distribution-spec 1.1).
    pub fn referrers_tag(&self) -> String {
        format!("sha256-{}", self.hex())
    }

    /// The inverse of [`Digest::referrers_tag`].
    pub fn parse_referrers_tag(tag: &str) -> Option<Digest> {
        Digest::from_hex(tag.strip_prefix("sha256-")?).ok()
    }

    /// The raw 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl FromStr for Digest {
    type Err = DigestError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once(':') {
            Some(("sha256", hex_str)) => {
                Digest::from_hex(hex_str).map_err(|_| DigestError::Hex(s.to_string()))
            }
            _ => Err(DigestError::Algorithm(s.to_string())),
        }
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// An incremental sha256 that also counts bytes.
#[derive(Clone, Default)]
pub struct Hasher {
    inner: Sha256,
    len: u64,
}

impl Hasher {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn update(&mut self, bytes: &[u8]) {
        self.inner.update(bytes);
        self.len += bytes.len() as u64;
    }
    /// Bytes hashed so far.
    pub fn len(&self) -> u64 {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn finish(self) -> Digest {
        Digest(self.inner.finalize().into())
    }
}

/// A reader that hashes what passes through it. The caller compares
/// [`HashingReader::finish`] with what it expected once the stream ends; the
/// reader itself never decides trust.
pub struct HashingReader<R> {
    inner: R,
    hasher: Hasher,
}

impl<R: Read> HashingReader<R> {
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            hasher: Hasher::new(),
        }
    }
    /// Bytes read so far.
    pub fn len(&self) -> u64 {
        self.hasher.len()
    }
    pub fn is_empty(&self) -> bool {
        self.hasher.is_empty()
    }
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }
    /// The digest and length of everything read.
    pub fn finish(self) -> (Digest, u64) {
        let len = self.hasher.len();
        (self.hasher.finish(), len)
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// A writer that hashes what passes through it (layer writers use it to get
/// the compressed digest and, one level down, the `diff_id`).
pub struct HashingWriter<W> {
    inner: W,
    hasher: Hasher,
}

impl<W: Write> HashingWriter<W> {
    pub fn new(inner: W) -> Self {
        Self {
            inner,
            hasher: Hasher::new(),
        }
    }
    pub fn len(&self) -> u64 {
        self.hasher.len()
    }
    pub fn is_empty(&self) -> bool {
        self.hasher.is_empty()
    }
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }
    /// The inner writer, the digest and the length of everything written.
    pub fn finish(self) -> (W, Digest, u64) {
        let len = self.hasher.len();
        (self.inner, self.hasher.finish(), len)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY: &str = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn hashes_and_round_trips() {
        let d = Digest::of(b"");
        assert_eq!(d.to_string(), EMPTY);
        assert_eq!(EMPTY.parse::<Digest>().unwrap(), d);
        let json = serde_json::to_string(&d).unwrap();
        assert_eq!(serde_json::from_str::<Digest>(&json).unwrap(), d);
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            "sha512:abcd",
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "sha256:E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855",
            "sha256:e3b0",
            "sha256:../../etc/passwd",
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b85z",
        ] {
            assert!(bad.parse::<Digest>().is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn hashing_reader_matches_of() {
        let data = vec![7u8; 100_000];
        let mut r = HashingReader::new(&data[..]);
        io::copy(&mut r, &mut io::sink()).unwrap();
        assert_eq!(r.finish(), (Digest::of(&data), 100_000));
    }

    #[test]
    fn attachment_tag_follows_cosign() {
        let d: Digest = EMPTY.parse().unwrap();
        assert_eq!(
            d.attachment_tag("sig"),
            "sha256-e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855.sig"
        );
    }

    #[test]
    fn attachment_tags_parse_back() {
        let d = Digest::of(b"x");
        assert_eq!(
            Digest::parse_attachment_tag(&d.attachment_tag("sig")),
            Some((d, "sig"))
        );
        assert_eq!(
            Digest::parse_attachment_tag(&d.attachment_tag("sbom")),
            Some((d, "sbom"))
        );
        for not in [
            "v1",
            "sha256-abc.sig",
            "latest.sig",
            &format!("sha256-{}", d.hex()),
        ] {
            assert_eq!(Digest::parse_attachment_tag(not), None, "{not}");
        }
        assert_eq!(
            Digest::parse_attachment_tag(&format!("sha256-{}.", d.hex())),
            None
        );
        assert_eq!(
            Digest::parse_attachment_tag(&format!("sha256-{}.SIG", d.hex())),
            None
        );
    }
}

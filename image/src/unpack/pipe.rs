//! The bounded buffers between a layer's threads: the calling thread
//! decompresses and counts the uncompressed budget ([`produce`]), a hash
//! thread takes the `diff_id` of the same bytes ([`hash`]), and the tar
//! thread parses and writes, reading them through [`Chunks`]. The chunks
//! are shared, not copied: each is read by both and refilled once both
//! let go of it.
//!
//! Why three threads on two cores: decompressing a 371 MB Debian layer
//! took 0.45 s of CPU here, its sha256 0.2 s (SHA-NI) and parsing and
//! writing 0.37 s (more with the per-file hashes of
//! [`super::Unpacker::hash_files`]). The `diff_id` hash with either side
//! leaves the other idle part of the time; on a thread of its own the
//! scheduler gives whichever side lags the second core.
//!
//! Given: the budgeted reader of the layer (`mod.rs` builds it). It owns
//! only the hand-over: chunks, their order, and how the end of the stream
//! or its failure reaches the tar thread. It deliberately decides nothing
//! about what a failure means (`mod.rs` names it, from the tar thread's
//! position, as the single-threaded unpacker did) and reads no more than
//! the channels' bound ahead of the slower reader.
//!
//! Why the errors stay what they were: the single-threaded unpacker read
//! the decompressor through a `BufReader` of [`super::BUF_BYTES`], which
//! asks its reader for exactly that many bytes per call, and the tar side
//! saw each call's bytes, then its error, in stream order. [`produce`]
//! makes the same calls and sends each result, and [`Chunks`] hands the
//! bytes back in order, then the error, so the tar side meets a corrupt
//! stream or the budget at the same byte, in the same entry, and an error
//! the tar side finds first (an earlier byte) still wins: the decompressor's
//! later failure is never read. Chunks group calls, not bytes: a call's
//! bytes and its failure stay as they were.
//!
//! The one place this differs: the `BufReader` passed a read larger than
//! its capacity straight to the decompressor when its buffer was empty,
//! which only reading a PAX header of more than 256 KiB does (std's
//! `read_to_end` grows its reads to 512 KiB and more). Calls after such a
//! header split the stream at other bytes than they did, so a budget or
//! decompressor error later in that layer can name another entry nearby
//! (one to three entries apart, with an uncompressed layer, in the
//! comparison of both builds over the hostile corpus and 1,200 mutated
//! layers); the rule, the layer and the detail are the same. No tar writer
//! makes such a header; a hostile one gets the same refusal.

use std::io::{self, Read};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::Arc;

use super::BUF_BYTES;
use crate::digest::Hasher;

/// Chunks in each channel at once. The reader gets at most this many
/// ahead of the slower of the other two threads, so at most this plus two
/// chunks exist (6 MiB): enough for each side to ride out the other's
/// bursts (a directory of small files, a large file), small next to the
/// 64 MiB the unpacker is held to.
pub(super) const CHUNKS_IN_FLIGHT: usize = 4;

/// Read calls whose bytes make one chunk (1 MiB). Each chunk wakes a
/// sleeping thread or two; with one read to a chunk the 371 MB layer took
/// 3,000 context switches and 0.96 s of CPU against 0.86 s on one
/// thread (these VMs pay for each wake-up), with four 650 switches and
/// 0.86 s.
pub(super) const READS_PER_CHUNK: usize = 4;

/// The bytes of up to [`READS_PER_CHUNK`] read calls: the first `len`
/// (never 0) of the buffer, whose length stays the same so that filling it
/// again writes no zeros first.
pub(super) struct Chunk {
    buf: Arc<Vec<u8>>,
    len: usize,
}

impl Chunk {
    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// What the tar thread receives, in stream order.
pub(super) enum Msg {
    Data(Chunk),
    /// The call failed: the last message (the reader stops there).
    Fail(io::Error),
}

/// Reads `src` one call of [`BUF_BYTES`] at a time, [`READS_PER_CHUNK`]
/// calls to a chunk, and sends each chunk to the tar thread and the hash
/// thread, until the end of the stream (the senders are dropped), an error
/// (what came before it sent, then the error to the tar thread as its last
/// message), or the tar thread hanging up (it failed or finished: nothing
/// more is read). A buffer is filled again once both threads dropped it.
pub(super) fn produce(src: &mut impl Read, to_tar: SyncSender<Msg>, to_hash: SyncSender<Chunk>) {
    let mut pool: Vec<Arc<Vec<u8>>> = Vec::new();
    loop {
        // A buffer neither thread holds any more (the count is the pool's
        // own reference), or a new one: the channels' bounds cap how many.
        let mut buf = match pool.iter().position(|b| Arc::strong_count(b) == 1) {
            Some(i) => pool.swap_remove(i),
            None => Arc::new(vec![0; READS_PER_CHUNK * BUF_BYTES]),
        };
        // Unshared (nobody else can take a reference to it now), so this
        // never copies.
        let bytes = Arc::make_mut(&mut buf);
        let mut len = 0;
        // What stopped the chunk short: the end (`Ok`) or an error.
        let mut stop = None;
        let mut calls = 0;
        while calls < READS_PER_CHUNK {
            match src.read(&mut bytes[len..len + BUF_BYTES]) {
                Ok(0) => {
                    stop = Some(Ok(()));
                    break;
                }
                Ok(n) => {
                    len += n;
                    calls += 1;
                }
                // A signal, not the stream: the call is made again, as the
                // tar crate's reads did (and it does not count).
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    stop = Some(Err(e));
                    break;
                }
            }
        }
        if len > 0 {
            let chunk = |buf: &Arc<Vec<u8>>| Chunk {
                buf: buf.clone(),
                len,
            };
            // The hash thread only stops when its channel closes: its send
            // fails only if it panicked, and the caller sees that panic.
            if to_hash.send(chunk(&buf)).is_err() || to_tar.send(Msg::Data(chunk(&buf))).is_err() {
                return;
            }
        }
        match stop {
            None => pool.push(buf),
            Some(Ok(())) => return,
            Some(Err(e)) => {
                let _ = to_tar.send(Msg::Fail(e));
                return;
            }
        }
    }
}

/// The hash thread: the sha256 and length of every chunk, in order, until
/// the reader drops its sender.
pub(super) fn hash(from: Receiver<Chunk>) -> Hasher {
    let mut h = Hasher::new();
    for chunk in from {
        h.update(chunk.bytes());
    }
    h
}

/// The tar thread's reader: the chunks [`produce`] sent, in order, then
/// its error or the end.
pub(super) struct Chunks {
    from: Receiver<Msg>,
    chunk: Option<Chunk>,
    pos: usize,
    /// The stream's error, once received: read again, it fails again the
    /// same way (the decompressor is not asked twice).
    failed: Option<(io::ErrorKind, String)>,
}

impl Chunks {
    pub(super) fn new(from: Receiver<Msg>) -> Chunks {
        Chunks {
            from,
            chunk: None,
            pos: 0,
            failed: None,
        }
    }

    /// The unread bytes of the current chunk, taking the next one when it
    /// is used up; empty at the end of the stream.
    fn available(&mut self) -> io::Result<&[u8]> {
        let used_up = self.chunk.as_ref().is_none_or(|c| self.pos == c.len);
        if used_up {
            // Dropped before waiting: the reader can refill it meanwhile.
            self.chunk = None;
            self.pos = 0;
            if let Some((kind, msg)) = &self.failed {
                return Err(io::Error::new(*kind, msg.clone()));
            }
            match self.from.recv() {
                Ok(Msg::Data(c)) => self.chunk = Some(c),
                Ok(Msg::Fail(e)) => {
                    self.failed = Some((e.kind(), e.to_string()));
                    return Err(e);
                }
                // The reader returned at the end of the stream (or its
                // thread is unwinding, and the panic is what the caller
                // will see).
                Err(_) => return Ok(&[]),
            }
        }
        Ok(self.chunk.as_ref().map_or(&[], |c| &c.bytes()[self.pos..]))
    }
}

impl Read for Chunks {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let src = self.available()?;
        let n = buf.len().min(src.len());
        buf[..n].copy_from_slice(&src[..n]);
        self.pos += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A reader that gives `parts` one per call, then fails or ends.
    struct Scripted {
        parts: Vec<Vec<u8>>,
        fail: bool,
        calls: Vec<usize>,
    }

    impl Read for Scripted {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.calls.push(buf.len());
            if self.parts.is_empty() {
                return if self.fail {
                    Err(io::Error::other("corrupt"))
                } else {
                    Ok(0)
                };
            }
            let p = self.parts.remove(0);
            buf[..p.len()].copy_from_slice(&p);
            Ok(p.len())
        }
    }

    /// Runs `src` through the three threads, the tar side reading 7 bytes
    /// at a time: what it read, its error, the calls made of `src` and the
    /// hash thread's digest and length.
    fn through(
        mut src: Scripted,
    ) -> (
        Vec<u8>,
        Option<String>,
        Vec<usize>,
        (crate::digest::Digest, u64),
    ) {
        let (to_tar, from_reader) = mpsc::sync_channel(CHUNKS_IN_FLIGHT);
        let (to_hash, hash_rx) = mpsc::sync_channel(CHUNKS_IN_FLIGHT);
        let (got, err, hashed) = std::thread::scope(|s| {
            let hasher = s.spawn(move || hash(hash_rx));
            let reader = s.spawn(move || {
                let mut c = Chunks::new(from_reader);
                let mut got = Vec::new();
                let mut b = [0u8; 7];
                loop {
                    match c.read(&mut b) {
                        Ok(0) => return (got, None),
                        Ok(n) => got.extend_from_slice(&b[..n]),
                        Err(e) => {
                            // read again: the same error, no more bytes
                            let again = c.read(&mut b).unwrap_err().to_string();
                            assert_eq!(again, e.to_string());
                            return (got, Some(e.to_string()));
                        }
                    }
                }
            });
            produce(&mut src, to_tar, to_hash);
            let (got, err) = reader.join().unwrap();
            let h = hasher.join().unwrap();
            let len = h.len();
            (got, err, (h.finish(), len))
        });
        (got, err, src.calls, hashed)
    }

    #[test]
    fn bytes_arrive_in_order_then_the_end_and_are_hashed_once() {
        let parts: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; 1 + i as usize * 100]).collect();
        let want: Vec<u8> = parts.concat();
        let (got, err, calls, hashed) = through(Scripted {
            parts,
            fail: false,
            calls: Vec::new(),
        });
        assert_eq!(got, want);
        assert_eq!(err, None);
        assert_eq!(
            hashed,
            (crate::digest::Digest::of(&want), want.len() as u64)
        );
        // every call asks for what the old BufReader asked for
        assert!(calls.iter().all(|&c| c == BUF_BYTES), "{calls:?}");
        assert_eq!(calls.len(), 41);
    }

    #[test]
    fn the_error_comes_after_every_byte_before_it() {
        let (got, err, calls, _) = through(Scripted {
            parts: vec![vec![1; 10], vec![2; 3]],
            fail: true,
            calls: Vec::new(),
        });
        assert_eq!(got, [vec![1; 10], vec![2; 3]].concat());
        assert_eq!(err.as_deref(), Some("corrupt"));
        // nothing is read after the failure
        assert_eq!(calls.len(), 3);
    }

    #[test]
    fn a_reader_that_hangs_up_stops_the_producer() {
        let mut src = Scripted {
            parts: vec![vec![0; 10]; 1000],
            fail: false,
            calls: Vec::new(),
        };
        let (to_tar, from_reader) = mpsc::sync_channel(CHUNKS_IN_FLIGHT);
        let (to_hash, hash_rx) = mpsc::sync_channel(CHUNKS_IN_FLIGHT);
        std::thread::scope(|s| {
            s.spawn(move || hash(hash_rx));
            s.spawn(move || {
                let mut c = Chunks::new(from_reader);
                let mut b = [0u8; 10];
                c.read_exact(&mut b).unwrap();
            });
            produce(&mut src, to_tar, to_hash);
        });
        // the chunk read, the channel's bound and the one whose send found
        // it closed; never the 1,000 the source has
        assert!(
            src.calls.len() <= (CHUNKS_IN_FLIGHT + 2) * READS_PER_CHUNK,
            "{}",
            src.calls.len()
        );
    }
}

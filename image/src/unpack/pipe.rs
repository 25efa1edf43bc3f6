//! The bounded buffer between a layer's two threads: the calling thread
//! decompresses, counts the uncompressed budget and hashes the `diff_id`
//! ([`produce`]); the tar thread parses and writes, reading the same bytes
//! through [`Chunks`]. Both cores work, and memory stays at a few chunks.
//!
//! Given: the budgeted, hashing reader of the layer (`mod.rs` builds it).
//! It owns only the hand-over: chunks, their order, and how the end of the
//! stream or its failure reaches the tar thread. It deliberately decides
//! nothing about what a failure means (`mod.rs` names it, from the tar
//! thread's position, as the single-threaded unpacker did) and does not
//! read ahead of the bound.
//!
//! Why the errors stay what they were: the single-threaded unpacker read
//! the decompressor through a `BufReader` of [`super::BUF_BYTES`], which
//! asks its reader for exactly that many bytes per call, and the tar side
//! saw each call's bytes, then its error, in stream order. [`produce`]
//! makes the same calls and sends each result, and [`Chunks`] hands the
//! bytes back in order, then the error, so the tar side meets a corrupt
//! stream or the budget at the same byte, in the same entry, and an error
//! the tar side finds first (an earlier byte) still wins: the decompressor's
//! later failure is never read. The one call the single-threaded unpacker
//! made larger was the `BufReader` passing a read of more than its
//! capacity straight through (a PAX header of over 256 KiB read into an
//! empty buffer); there the decompressor's bytes are the same, but a
//! failure can show up one read earlier or later, at a neighbouring entry.

use std::io::{self, Read};
use std::sync::mpsc::{Receiver, Sender, SyncSender};

use super::BUF_BYTES;

/// Chunks in the channel at once: with one being filled and one being read,
/// at most this plus two of [`BUF_BYTES`] are in flight (1.5 MiB): enough
/// for each side to ride out the other's bursts (a directory of small files,
/// a large file), small next to the 64 MiB the unpacker is held to.
pub(super) const CHUNKS_IN_FLIGHT: usize = 4;

/// What the tar thread receives, in stream order.
pub(super) enum Msg {
    /// One read call's bytes: the first `len` (never 0) of the buffer,
    /// whose length stays [`BUF_BYTES`] so that filling it again writes
    /// no zeros first.
    Data(Vec<u8>, usize),
    /// The call failed: the last message (the reader stops there).
    Fail(io::Error),
}

/// Reads `src` one call of [`BUF_BYTES`] at a time and sends what each call
/// gave, until the end of the stream (the sender is dropped), an error
/// (sent as the last message), or the tar thread hanging up (it failed or
/// finished; nothing more is read). Buffers come back through `spare` to be
/// filled again, so the chunks in flight are all the memory it takes.
pub(super) fn produce(src: &mut impl Read, to_tar: SyncSender<Msg>, spare: Receiver<Vec<u8>>) {
    loop {
        let mut buf = spare.try_recv().unwrap_or_else(|_| vec![0; BUF_BYTES]);
        let msg = loop {
            match src.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => break Msg::Data(buf, n),
                // A signal, not the stream: the call is made again, as the
                // tar crate's reads did.
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => break Msg::Fail(e),
            }
        };
        let last = matches!(msg, Msg::Fail(_));
        if to_tar.send(msg).is_err() || last {
            return;
        }
    }
}

/// The tar thread's reader: the chunks [`produce`] sent, in order, then
/// its error or the end.
pub(super) struct Chunks {
    from: Receiver<Msg>,
    spare: Sender<Vec<u8>>,
    chunk: Vec<u8>,
    /// Bytes of `chunk` that are the stream's, and how many were read.
    len: usize,
    pos: usize,
    /// The stream's error, once received: read again, it fails again the
    /// same way (the decompressor is not asked twice).
    failed: Option<(io::ErrorKind, String)>,
}

impl Chunks {
    pub(super) fn new(from: Receiver<Msg>, spare: Sender<Vec<u8>>) -> Chunks {
        Chunks {
            from,
            spare,
            chunk: Vec::new(),
            len: 0,
            pos: 0,
            failed: None,
        }
    }

    /// Takes the next chunk; `false` at the end of the stream.
    fn next_chunk(&mut self) -> io::Result<bool> {
        if let Some((kind, msg)) = &self.failed {
            return Err(io::Error::new(*kind, msg.clone()));
        }
        match self.from.recv() {
            Ok(Msg::Data(data, len)) => {
                let done = std::mem::replace(&mut self.chunk, data);
                self.len = len;
                self.pos = 0;
                if done.capacity() > 0 {
                    // The producer may have finished and gone: the buffer
                    // is then simply dropped.
                    let _ = self.spare.send(done);
                }
                Ok(true)
            }
            Ok(Msg::Fail(e)) => {
                self.failed = Some((e.kind(), e.to_string()));
                Err(e)
            }
            // The producer returned at the end of the stream (or its thread
            // is unwinding, and the panic is what the caller will see).
            Err(_) => Ok(false),
        }
    }
}

impl Read for Chunks {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.pos == self.len && !self.next_chunk()? {
            return Ok(0);
        }
        let n = buf.len().min(self.len - self.pos);
        buf[..n].copy_from_slice(&self.chunk[self.pos..self.pos + n]);
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

    fn through(mut src: Scripted) -> (Vec<u8>, Option<String>, Vec<usize>) {
        let (tx, rx) = mpsc::sync_channel(CHUNKS_IN_FLIGHT);
        let (back_tx, back_rx) = mpsc::channel();
        let (got, err) = std::thread::scope(|s| {
            let reader = s.spawn(move || {
                let mut c = Chunks::new(rx, back_tx);
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
            produce(&mut src, tx, back_rx);
            reader.join().unwrap()
        });
        (got, err, src.calls)
    }

    #[test]
    fn bytes_arrive_in_order_then_the_end() {
        let parts: Vec<Vec<u8>> = (0..20u8).map(|i| vec![i; 1 + i as usize * 100]).collect();
        let want: Vec<u8> = parts.concat();
        let (got, err, calls) = through(Scripted {
            parts,
            fail: false,
            calls: Vec::new(),
        });
        assert_eq!(got, want);
        assert_eq!(err, None);
        // every call asks for what the old BufReader asked for
        assert!(calls.iter().all(|&c| c == BUF_BYTES), "{calls:?}");
        assert_eq!(calls.len(), 21);
    }

    #[test]
    fn the_error_comes_after_every_byte_before_it() {
        let (got, err, calls) = through(Scripted {
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
        let (tx, rx) = mpsc::sync_channel(CHUNKS_IN_FLIGHT);
        let (back_tx, back_rx) = mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(move || {
                let mut c = Chunks::new(rx, back_tx);
                let mut b = [0u8; 10];
                c.read_exact(&mut b).unwrap();
            });
            produce(&mut src, tx, back_rx);
        });
        // one read, the channel's bound and the send that found it closed
        assert!(
            src.calls.len() <= CHUNKS_IN_FLIGHT + 3,
            "{}",
            src.calls.len()
        );
    }
}

//! A few jobs at a time on plain threads: the layers of an image fetched
//! (and unpacked while they download) side by side, up to a small limit.
//!
//! Given a job count, a limit and a function of the job's index,
//! [`each`] runs the jobs on at most `limit` scoped threads, taking the
//! next index as each finishes, and returns the results in job order. Once
//! a job fails no new one starts (those under way finish, since nothing
//! here can stop a download half-way), and the error returned is that of
//! the failed job with the lowest index: with one thread, the one a loop
//! would have stopped at. No async runtime, no pool that outlives the
//! call; the threads' memory is what the jobs use.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread;

/// Layers fetched at once. Each holds one connection and, while it is
/// unpacked, the unpacker's bounded buffers (the chunks between its
/// threads and a decompressor's window): three keep a link busy when one
/// layer is slowed by its unpacking, and the memory three times that.
pub const LAYERS_AT_ONCE: usize = 3;

/// Runs `job(0..count)` on at most `limit` threads; the results in order,
/// or the lowest-indexed error (see the module's comment).
pub fn each<R: Send, E: Send>(
    count: usize,
    limit: usize,
    job: impl Fn(usize) -> Result<R, E> + Sync,
) -> Result<Vec<R>, E> {
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let results: Mutex<Vec<Option<Result<R, E>>>> = Mutex::new((0..count).map(|_| None).collect());
    let work = || loop {
        if failed.load(Ordering::Acquire) {
            return;
        }
        let i = next.fetch_add(1, Ordering::AcqRel);
        if i >= count {
            return;
        }
        let r = job(i);
        if r.is_err() {
            failed.store(true, Ordering::Release);
        }
        results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(r);
    };
    let threads = limit.clamp(1, count.max(1));
    thread::scope(|s| {
        for _ in 1..threads {
            s.spawn(work);
        }
        // The calling thread is one of them.
        work();
    });
    let mut out = Vec::with_capacity(count);
    let results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    let mut missing = false;
    for r in results {
        match r {
            Some(Ok(v)) if !missing => out.push(v),
            Some(Err(e)) => return Err(e),
            // Not started after a failure: an error follows.
            _ => missing = true,
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn results_come_in_job_order_and_at_most_limit_run_at_once() {
        let running = AtomicUsize::new(0);
        let most = AtomicUsize::new(0);
        let out: Result<Vec<usize>, ()> = each(10, 3, |i| {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            thread::sleep(Duration::from_millis(20 - 2 * i as u64));
            running.fetch_sub(1, Ordering::SeqCst);
            Ok(i * 10)
        });
        assert_eq!(out.unwrap(), (0..10).map(|i| i * 10).collect::<Vec<_>>());
        assert!(most.load(Ordering::SeqCst) <= 3);
        assert!(most.load(Ordering::SeqCst) >= 2, "nothing ran side by side");
    }

    #[test]
    fn the_lowest_failed_job_is_the_error_and_no_new_job_starts_after_one() {
        let started = AtomicUsize::new(0);
        let out: Result<Vec<()>, usize> = each(50, 2, |i| {
            started.fetch_add(1, Ordering::SeqCst);
            if i == 3 || i == 4 {
                thread::sleep(Duration::from_millis(if i == 3 { 30 } else { 1 }));
                return Err(i);
            }
            Ok(())
        });
        assert_eq!(out.unwrap_err(), 3);
        assert!(started.load(Ordering::SeqCst) < 10);
    }

    #[test]
    fn no_jobs_and_one_thread() {
        assert_eq!(each::<(), ()>(0, 3, |_| Ok(())).unwrap(), vec![]);
        let order = Mutex::new(Vec::new());
        each::<(), ()>(4, 1, |i| {
            order.lock().unwrap().push(i);
            Ok(())
        })
        .unwrap();
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3]);
    }
}

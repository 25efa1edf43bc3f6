//! Progress reporting for long work (downloads, layer compression): an
//! indicatif bar per task on a terminal, one plain line per finished task
//! otherwise (CI logs), or nothing.
//!
//! It is given the mode once (by `main`, from `--progress` and whether stderr
//! is a terminal) and is cloned into whatever does the work. It writes only
//! to stderr, so stdout stays machine-readable; it never decides anything.

use std::io::IsTerminal;
use std::time::Instant;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How progress is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ProgressMode {
    /// Bars on a terminal, plain lines otherwise.
    Auto,
    /// Animated bars (stderr).
    Bar,
    /// One line per finished task (stderr).
    Plain,
    /// Nothing.
    Quiet,
}

/// A handle to the progress display; cheap to clone.
#[derive(Clone)]
pub struct Progress {
    multi: Option<MultiProgress>,
    plain: bool,
}

impl Progress {
    pub fn new(mode: ProgressMode) -> Self {
        let mode = match mode {
            ProgressMode::Auto if std::io::stderr().is_terminal() => ProgressMode::Bar,
            ProgressMode::Auto => ProgressMode::Plain,
            other => other,
        };
        match mode {
            ProgressMode::Bar => Progress {
                multi: Some(MultiProgress::with_draw_target(ProgressDrawTarget::stderr())),
                plain: false,
            },
            ProgressMode::Plain => Progress {
                multi: None,
                plain: true,
            },
            _ => Progress::quiet(),
        }
    }

    /// Shows nothing (tests, `--json` pipelines that set it).
    pub fn quiet() -> Self {
        Progress {
            multi: None,
            plain: false,
        }
    }

    /// Starts a task of `total` bytes (unknown when `None`).
    pub fn task(&self, verb: &str, label: &str, total: Option<u64>) -> Task {
        let bar = self.multi.as_ref().map(|m| {
            let bar = match total {
                Some(t) => ProgressBar::new(t),
                None => ProgressBar::new_spinner(),
            };
            bar.set_style(
                ProgressStyle::with_template(
                    "{prefix:>9} {msg:40!} {bar:30} {bytes:>10}/{total_bytes:<10} {bytes_per_sec}",
                )
                .expect("static template")
                .progress_chars("=> "),
            );
            bar.set_prefix(verb.to_string());
            if total.is_none() {
                bar.enable_steady_tick(std::time::Duration::from_millis(150));
            }
            bar.set_message(label.to_string());
            m.add(bar)
        });
        Task {
            bar,
            plain: self.plain,
            verb: verb.to_string(),
            label: label.to_string(),
            start: Instant::now(),
            done: 0,
        }
    }

    /// Prints one line (above the bars on a terminal).
    pub fn line(&self, msg: &str) {
        match &self.multi {
            Some(m) => {
                let _ = m.println(msg);
            }
            None if self.plain => eprintln!("{msg}"),
            None => {}
        }
    }
}

/// One running task.
pub struct Task {
    bar: Option<ProgressBar>,
    plain: bool,
    verb: String,
    label: String,
    start: Instant,
    done: u64,
}

impl Task {
    pub fn inc(&mut self, n: u64) {
        self.done += n;
        if let Some(b) = &self.bar {
            b.inc(n);
        }
    }

    /// Sets the expected total once it is known (a Content-Length).
    pub fn set_total(&mut self, total: u64) {
        if let Some(b) = &self.bar {
            b.set_length(total);
        }
    }

    /// Restarts the byte count (a retried download).
    pub fn reset(&mut self) {
        self.done = 0;
        if let Some(b) = &self.bar {
            b.reset();
        }
    }

    /// Ends the task with a short outcome (`done`, `cached`, `failed`).
    pub fn finish(self, outcome: &str) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
        if self.plain {
            let secs = self.start.elapsed().as_secs_f64();
            if self.done > 0 {
                eprintln!(
                    "{} {}: {outcome} ({:.1} MB in {secs:.1} s)",
                    self.verb,
                    self.label,
                    self.done as f64 / 1e6
                );
            } else {
                eprintln!("{} {}: {outcome} ({secs:.1} s)", self.verb, self.label);
            }
        }
    }
}

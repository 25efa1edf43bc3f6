//! The builder's black-box tests, one binary: each file below was its own
//! test binary, linking the whole dependency tree again. They drive the
//! real `kubeslot-builder` binary (`CARGO_BIN_EXE_kubeslot-builder`) and
//! need no process setup of their own. Run one file's tests with
//! `cargo test -p kubeslot-builder --test tests workflow::`.

mod build;
mod debian;
mod diff;
mod help;
mod publish;
mod workflow;

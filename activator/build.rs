//! Link options for the activator's binary (and nothing else it builds).
//!
//! `-z pack-relative-relocs` stores the relative relocations of a PIE as a
//! bitmap (DT_RELR) instead of 24 bytes each: about 110 KB less binary,
//! the same position independence (ASLR) and the same code. The loader
//! must know DT_RELR: glibc 2.36 or newer, which every supported host has
//! (Debian 12: 2.36, Ubuntu 24.04: 2.39); the binary names the need
//! (`GLIBC_ABI_DT_RELR`), so an older glibc refuses to start it with that
//! name, and the .deb depends on `libc6 (>= 2.36)` (ci/deb/build.sh).
fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    println!("cargo:rerun-if-changed=build.rs");
}

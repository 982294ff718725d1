//! Build script: links the `gcp-sql` tool with packed relative relocations where the C library
//! can load them.
//!
//! The tool is a position-independent executable of about 140 MB of code and data. Linked the
//! usual way, its dynamic relocation table is 6 MB of `R_X86_64_RELATIVE` entries, which the
//! dynamic loader reads in full at every start: 6 MB of the tool's resident memory before it
//! does anything. `-z pack-relative-relocs` (GNU ld 2.38 and later, lld) stores the same
//! relocations as a bitmap of a few kilobytes (`DT_RELR`), which glibc 2.36 and later apply.
//! The binary stays position-independent, so address space layout randomisation is unchanged.
//! Measured in docs/benchmarks.md ("Where the tool's resident memory goes") and ADR 0079.
//!
//! An older glibc would fail to load such a binary, so the flag is passed only when the C
//! library that the link will use declares the `GLIBC_ABI_DT_RELR` version. Setting
//! `GCP_SQL_PACK_RELOCS=0` turns it off.
//!
//! `GCP_SQL_NO_PIE=1` links the tool as a position-dependent executable instead (`-no-pie`):
//! nothing is relocated at start, so the 4 MB of vtables and other pointer tables that a
//! position-independent tool copies into private memory stay clean pages of the file. That
//! gives up address space layout randomisation of the tool's own code, which is why it is not
//! the default.

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-env-changed=GCP_SQL_PACK_RELOCS");
    println!("cargo:rerun-if-env-changed=GCP_SQL_NO_PIE");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    if var("CARGO_CFG_TARGET_OS") != "linux" {
        return;
    }
    if var("GCP_SQL_NO_PIE") == "1" {
        println!("cargo:rustc-link-arg-bins=-no-pie");
        return;
    }
    // Only a native glibc build: the probe below reads the build machine's C library.
    if var("GCP_SQL_PACK_RELOCS") == "0"
        || var("CARGO_CFG_TARGET_ENV") != "gnu"
        || var("HOST") != var("TARGET")
    {
        return;
    }
    let arch = var("CARGO_CFG_TARGET_ARCH");
    let candidates = [
        format!("/lib/{arch}-linux-gnu/libc.so.6"),
        format!("/usr/lib/{arch}-linux-gnu/libc.so.6"),
        "/lib64/libc.so.6".to_string(),
        "/usr/lib64/libc.so.6".to_string(),
    ];
    let Some(libc) = candidates.iter().map(Path::new).find(|p| p.exists()) else {
        return;
    };
    println!("cargo:rerun-if-changed={}", libc.display());
    let Ok(bytes) = std::fs::read(libc) else {
        return;
    };
    let needle = b"GLIBC_ABI_DT_RELR";
    if bytes.windows(needle.len()).any(|w| w == needle) {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}

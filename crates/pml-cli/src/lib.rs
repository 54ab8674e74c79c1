//! Shared code of the `pmlc` and `pml` binaries: file discovery, diagnostic output.

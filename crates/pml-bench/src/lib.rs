//! The benchmarks and evaluations against the peers (llama.cpp, its server, the engine's own full
//! prefill), reached as `pml bench` and `pml eval`: measurement harnesses, kept out of the
//! binaries and the libraries a user's program links.
// A benchmark's or an evaluation's output is its report: tables on stdout, progress on stderr.
#![allow(clippy::print_stdout, clippy::print_stderr)]

pub mod bench;
pub mod eval;

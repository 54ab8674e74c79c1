//! `pml`: run prompts, generate, serve, bench.

fn main() {
    eprintln!("pml: not built yet");
    std::process::exit(2);
}

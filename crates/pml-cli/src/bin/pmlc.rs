//! `pmlc`: check and compile PML schemas and prompts.

fn main() {
    eprintln!("pmlc: not built yet");
    std::process::exit(2);
}

//! The first decode step after loading does no one-time work, on the default real model (skipped
//! when it is not fetched, unless `PML_REQUIRE_MODELS=1`). Kernels that set themselves up on
//! their first call (candle repacks Q4_K blocks into its x86 tile layout and keeps the copy) must
//! do it while the model loads: inside the first decode step that work (~37 MB of fresh pages,
//! ~250 ms on a busy 2-core machine) made a short answer's decode ms/token 1.3–1.5× the steady
//! rate. Measured in fresh pages the process touches (minor page faults), not in time, so the
//! check does not depend on the machine's load; the test is alone in its binary because the
//! count is the whole process's.
// The test reports what it measured or skipped.
#![allow(clippy::print_stderr)]

#[cfg(target_os = "linux")]
#[test]
fn decode_steps_touch_few_fresh_pages_from_the_first_on() {
    use pml_engine::device::default_device;
    use pml_engine::kv_cache::KvCache;
    use pml_engine::model::{Model, WeightFormat};
    use pml_testkit::fetched_model;

    /// Fresh pages a decode step may touch: its activations and the vocabulary's logits are
    /// well under a megabyte, and the allocator may map them anew.
    const MAX_STEP_PAGES: u64 = 1024;
    const DECODE_STEPS: usize = 3;

    let Some(path) = fetched_model("qwen2.5-0.5b") else {
        return;
    };
    let model = Model::load(&path, WeightFormat::default(), &default_device()).expect("loads");
    // More tokens than the few-row threshold, so the prefill takes the dense path and the
    // decode kernels are first called by the decode steps.
    let prompt: Vec<u32> = (0..32).map(|i| 1000 + i * 37).collect();
    let positions: Vec<u32> = (0..prompt.len() as u32).collect();
    let mut kv = KvCache::with_capacity(
        model.kv_layout(),
        model.device(),
        prompt.len() + DECODE_STEPS,
    )
    .expect("cache");
    let mut logits = model
        .forward(&prompt, &positions, &mut kv)
        .expect("prefill");
    let mut step_pages = Vec::new();
    for step in 0..DECODE_STEPS {
        let token = logits
            .argmax(0)
            .and_then(|token| token.to_scalar::<u32>())
            .expect("argmax");
        let before = minor_page_faults();
        logits = model
            .forward(&[token], &[(prompt.len() + step) as u32], &mut kv)
            .expect("decode");
        step_pages.push(minor_page_faults() - before);
    }
    eprintln!("fresh pages touched per decode step: {step_pages:?}");
    assert!(
        step_pages.iter().all(|&pages| pages <= MAX_STEP_PAGES),
        "a decode step touched more than {MAX_STEP_PAGES} fresh pages: {step_pages:?} (one-time \
         kernel setup belongs in loading)"
    );
}

/// Minor page faults of this process so far (`minflt`, field 10 of `/proc/self/stat`).
#[cfg(target_os = "linux")]
fn minor_page_faults() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name, which is in parentheses and may hold spaces; `minflt` is
    // the 8th of them (state, ppid, pgrp, session, tty_nr, tpgid, flags, minflt).
    let after_name = &stat[stat.rfind(')').expect("command name") + 1..];
    after_name
        .split_whitespace()
        .nth(7)
        .and_then(|field| field.parse().ok())
        .expect("minflt")
}

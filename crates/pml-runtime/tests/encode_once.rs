//! Two runs on one fresh store encode each unit once: two OS processes (this test binary
//! re-invoked in child mode) encode the same schema into one store at the same moment; a unit
//! one of them is encoding is waited for and reused by the other (`store::UnitLocks`), so the
//! units encoded by both add up to the schema's, and both end with every unit.
// The test reports what it measured or skipped.
#![allow(clippy::print_stderr)]

mod cached_support;

use std::path::Path;

use candle_core::Device;
use pml_compiler::plan::{EncodeMode, SchemaLayout, UnitId};
use pml_engine::model::tiny::random_model;
use pml_engine::model::{Arch, WeightFormat};
use pml_runtime::encode::{EncodeEvent, EncodeOptions, encode_schema};
use pml_runtime::store::{ModuleStore, StateSpec, StoreConfig};

use cached_support::{LayoutBuilder, spread_tokens};
use pml_testkit::child_process::{ChildTest, ready_then_wait_for_go, start_together};

/// Set in a child process to the store root it must encode into.
const CHILD_ENV: &str = "PML_ENCODE_ONCE_CHILD_ROOT";
const CHILD_TEST: &str = "two_processes_encode_each_unit_once";
const N_MODULES: u32 = 24;
const BOS: u32 = 1;

/// A root and `N_MODULES` sibling modules of 24 tokens each.
fn layout() -> SchemaLayout {
    let mut builder = LayoutBuilder::new();
    builder.text(UnitId::ROOT, &[BOS]);
    for index in 0..N_MODULES {
        let module = builder.open(&format!("m{index}"), UnitId::ROOT);
        builder.text(module, &spread_tokens(index * 24, 24));
        builder.close(module);
    }
    builder.build("siblings")
}

fn run_as_child(root: &Path) {
    let model = random_model(Arch::Qwen2, 5, WeightFormat::F32, &Device::Cpu).expect("model");
    let config = StoreConfig::local(root.to_path_buf(), 1 << 30);
    let store =
        ModuleStore::open(&config, StateSpec::new("tiny-once", model.kv_layout())).expect("store");
    let layout = layout();
    // Model loaded and store open in both processes before either encodes, so they overlap.
    ready_then_wait_for_go();
    let mut waits = 0;
    let options = EncodeOptions {
        mode: EncodeMode::Scaffolded,
        bos: Some(BOS),
        keep: None,
    };
    let report = encode_schema(&model, &layout, options, &store, &mut |event| {
        if let EncodeEvent::Waiting { .. } = event {
            waits += 1;
        }
    })
    .expect("encodes");
    let line = format!(
        "{} {} {waits}",
        report.n_encoded(),
        report.n_encoded() + report.n_reused()
    );
    std::fs::write(root.join(format!("report-{}", std::process::id())), line).expect("report");
}

fn spawn_child(root: &Path) -> ChildTest {
    ChildTest::spawn(CHILD_TEST, CHILD_ENV, root)
}

#[test]
fn two_processes_encode_each_unit_once() {
    if let Some(root) = std::env::var_os(CHILD_ENV) {
        run_as_child(Path::new(&root));
        return;
    }
    let root = tempfile::tempdir().expect("tempdir");
    let mut children = [spawn_child(root.path()), spawn_child(root.path())];
    start_together(&mut children);
    let mut reports = Vec::new();
    for mut child in children {
        let status = child.wait();
        assert!(status.success(), "child failed: {status}");
        let report = std::fs::read_to_string(root.path().join(format!("report-{}", child.id())))
            .expect("child report");
        let numbers: Vec<usize> = report
            .split_whitespace()
            .map(|n| n.parse().expect("a number"))
            .collect();
        reports.push((numbers[0], numbers[1], numbers[2]));
    }
    eprintln!("(encoded, units, waits) per process: {reports:?}");
    let units = N_MODULES as usize + 1;
    for &(_, done, _) in &reports {
        assert_eq!(done, units, "every unit encoded or reused");
    }
    let encoded: usize = reports.iter().map(|&(encoded, _, _)| encoded).sum();
    assert_eq!(encoded, units, "each unit encoded by one process only");
    let locks = root.path().join("locks");
    let left = std::fs::read_dir(&locks).map_or(0, |entries| entries.count());
    assert_eq!(left, 0, "lock files of stored units are removed");
}

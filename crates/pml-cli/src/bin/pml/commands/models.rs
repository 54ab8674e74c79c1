//! `pml models fetch [ID...] [--all]` and `pml models list`: download, verify and list the models
//! of the registry under `$PML_HOME`.

use anyhow::Context;
use clap::{Args, Subcommand};
use pml_models::{self as models, Fetcher, ModelSpec};

#[derive(Args)]
pub struct ModelsArgs {
    #[command(subcommand)]
    command: ModelsCommand,
}

#[derive(Subcommand)]
enum ModelsCommand {
    /// Download, assemble and verify models (default: the default model).
    Fetch {
        /// Model ids or aliases (see `pml models list`).
        ids: Vec<String>,
        /// Fetch every known model.
        #[arg(long, conflicts_with = "ids")]
        all: bool,
    },
    /// List the known models, whether each is fetched, and where.
    List,
}

pub fn run(args: ModelsArgs) -> anyhow::Result<()> {
    let fetcher = pml_commands::model_fetch::fetcher()?;
    match args.command {
        ModelsCommand::Fetch { ids, all } => fetch(&fetcher, &ids, all),
        ModelsCommand::List => {
            list(&fetcher);
            Ok(())
        }
    }
}

fn fetch(fetcher: &Fetcher, ids: &[String], all: bool) -> anyhow::Result<()> {
    let specs: Vec<&ModelSpec> = if all {
        models::MODELS.iter().collect()
    } else if ids.is_empty() {
        vec![models::default_model()]
    } else {
        ids.iter()
            .map(|id| models::resolve(id))
            .collect::<Result<_, _>>()?
    };
    for spec in specs {
        let path = fetcher
            .fetch(spec)
            .with_context(|| format!("fetching {}", spec.id))?;
        eprintln!("{}: ready at {}", spec.id, path.display());
    }
    Ok(())
}

fn list(fetcher: &Fetcher) {
    println!("{:<14} {:<10} {:>9}  PATH", "ID", "FETCHED", "SIZE");
    for spec in models::MODELS {
        let path = fetcher.home().model_file(spec);
        let fetched = if fetcher.is_verified_by_stamp(spec) {
            "yes"
        } else if path.is_file() {
            // Present without a valid stamp: the next use hashes it.
            "unverified"
        } else {
            "no"
        };
        let default_marker = if spec.id == models::DEFAULT_MODEL_ID {
            " (default)"
        } else {
            ""
        };
        println!(
            "{:<14} {:<10} {:>6.1} MB  {}{}",
            spec.id,
            fetched,
            spec.size as f64 / 1e6,
            path.display(),
            default_marker
        );
    }
    let recent = pml_commands::recent_models::recent(fetcher.home());
    if !recent.is_empty() {
        println!();
        println!("recently used files (--model PATH):");
        for file in recent {
            match std::fs::metadata(&file) {
                Ok(metadata) => println!(
                    "  {:>6.1} MB  {}",
                    metadata.len() as f64 / 1e6,
                    file.display()
                ),
                Err(_) => println!("  {:>9}  {} (gone)", "-", file.display()),
            }
        }
    }
}

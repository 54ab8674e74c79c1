//! The editor configurations in `editors/`: the Neovim one, `editors/nvim/pml.lua`,
//! is loaded as written into a headless Neovim (`nvim --headless --clean -u editors/nvim/pml.lua`)
//! that opens a prompt with an error; the `pml lsp` server it starts must publish the error
//! (PML205) to the buffer, whose file type must be `pml` (not Promela, as Neovim 0.7 detects
//! `*.pml`). It also attaches to an `.xml` prompt, leaves other XML files alone and serves all
//! of them from one client. Skipped with a notice when `nvim` is not installed, unless
//! `PML_REQUIRE_NVIM=1` (CI installs Debian's `neovim` and sets it). The VS Code extension's
//! manifest is checked as JSON (VS Code itself cannot run here).
// The test reports what it measured or skipped.
#![allow(clippy::print_stderr)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

/// Set to `1` to fail instead of skipping when `nvim` is missing.
const REQUIRE_NVIM_ENV: &str = "PML_REQUIRE_NVIM";

/// The longest a Neovim run may take before it is killed (the script itself waits 10 s at most
/// for each buffer's diagnostics).
const NVIM_TIMEOUT: Duration = Duration::from_secs(30);

fn editors_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../editors")
}

fn nvim_version() -> Option<String> {
    let output = Command::new("nvim")
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&output.stdout);
    Some(text.lines().next().unwrap_or("nvim").to_owned())
}

/// Run inside Neovim after `trip.pml` is loaded: waits for each buffer's diagnostics and writes
/// what it saw, one `key=value` or `diagnostic<TAB>…` line each, to `$PML_NVIM_OUT`.
const CHECK_LUA: &str = r#"
local out = {}
local function clients_of(buf)
  if vim.lsp.get_clients then
    return #vim.lsp.get_clients({ bufnr = buf })
  end
  return #vim.tbl_keys(vim.lsp.buf_get_clients(buf))
end
local function all_clients()
  if vim.lsp.get_clients then
    return #vim.lsp.get_clients({ name = "pml" })
  end
  return #vim.lsp.get_active_clients()
end
local function report(label, buf)
  local got = vim.wait(10000, function() return #vim.diagnostic.get(buf) > 0 end, 50)
  table.insert(out, label .. ".filetype=" .. vim.bo[buf].filetype)
  table.insert(out, label .. ".waited=" .. tostring(got))
  table.insert(out, label .. ".clients=" .. clients_of(buf))
  table.insert(out, label .. ".tagfunc=" .. vim.bo[buf].tagfunc)
  for _, d in ipairs(vim.diagnostic.get(buf)) do
    table.insert(out, string.format("diagnostic\t%s\t%s\t%d:%d\t%s", label, tostring(d.code),
      d.lnum, d.col, (d.message:gsub("\n", " "))))
  end
end

report("pml", vim.api.nvim_get_current_buf())
vim.cmd("edit trip.xml")
report("xml", vim.api.nvim_get_current_buf())
vim.cmd("edit other.xml")
local other = vim.api.nvim_get_current_buf()
table.insert(out, "other.filetype=" .. vim.bo[other].filetype)
table.insert(out, "other.clients=" .. clients_of(other))
table.insert(out, "servers=" .. all_clients())
table.insert(out, "version=" .. tostring(vim.version().major) .. "." .. tostring(vim.version().minor))
vim.fn.writefile(out, os.getenv("PML_NVIM_OUT"))
vim.cmd("qa!")
"#;

#[test]
fn neovim_config_starts_the_server_and_shows_diagnostics() {
    let Some(version) = nvim_version() else {
        assert!(
            std::env::var(REQUIRE_NVIM_ENV).as_deref() != Ok("1"),
            "nvim is required by this test ({REQUIRE_NVIM_ENV}=1; apt-get install -y neovim)"
        );
        eprintln!("skipped: nvim is not installed (apt-get install -y neovim)");
        return;
    };
    eprintln!("testing editors/nvim/pml.lua with {version}");

    let dir = tempfile::tempdir().expect("temporary folder");
    let root = dir.path();
    fs::write(
        root.join("travel.pml"),
        r#"<schema name="travel"><module name="plan">Plan.</module></schema>"#,
    )
    .unwrap();
    fs::write(
        root.join("trip.pml"),
        r#"<prompt schema="travel"><nosuch/></prompt>"#,
    )
    .unwrap();
    fs::write(
        root.join("trip.xml"),
        "<?xml version=\"1.0\"?>\n<!-- a prompt in an .xml file -->\n\
         <prompt schema=\"travel\">\n  <plan/>\n  <missing/>\n</prompt>\n",
    )
    .unwrap();
    fs::write(root.join("other.xml"), "<config><item/></config>\n").unwrap();
    fs::write(root.join("check.lua"), CHECK_LUA).unwrap();
    for sub in ["config", "data", "state", "cache"] {
        fs::create_dir_all(root.join("xdg").join(sub)).unwrap();
    }

    let config = editors_dir().join("nvim/pml.lua");
    let out_file = root.join("out.txt");
    let stdout_file = root.join("nvim.stdout");
    let stderr_file = root.join("nvim.stderr");
    // The server is named through vim.g before the configuration loads (`--cmd` runs first);
    // the paths go through the environment, so no quoting is involved.
    let mut child = Command::new("nvim")
        .args(["--headless", "--clean"])
        .args(["--cmd", "lua vim.g.pml_cmd = os.getenv('PML_NVIM_CMD')"])
        .args(["--cmd", "lua vim.g.pml_args = { '--no-model' }"])
        .arg("-u")
        .arg(&config)
        .args(["-c", "luafile check.lua", "trip.pml"])
        .env("PML_NVIM_CMD", env!("CARGO_BIN_EXE_pml"))
        .env("PML_NVIM_OUT", &out_file)
        .env("XDG_CONFIG_HOME", root.join("xdg/config"))
        .env("XDG_DATA_HOME", root.join("xdg/data"))
        .env("XDG_STATE_HOME", root.join("xdg/state"))
        .env("XDG_CACHE_HOME", root.join("xdg/cache"))
        .env("NO_COLOR", "1")
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(fs::File::create(&stdout_file).unwrap())
        .stderr(fs::File::create(&stderr_file).unwrap())
        .spawn()
        .expect("nvim starts");

    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for nvim") {
            break Some(status);
        }
        if started.elapsed() > NVIM_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(50));
    };
    let logs = format!(
        "nvim stdout:\n{}\nnvim stderr:\n{}",
        fs::read_to_string(&stdout_file).unwrap_or_default(),
        fs::read_to_string(&stderr_file).unwrap_or_default()
    );
    let Some(status) = status else {
        panic!("nvim did not finish within {NVIM_TIMEOUT:?} and was killed\n{logs}");
    };
    let report = fs::read_to_string(&out_file)
        .unwrap_or_else(|error| panic!("nvim ({status}) wrote no report: {error}\n{logs}"));
    eprintln!("{report}");
    let has = |line: &str| report.lines().any(|l| l == line);
    let context = format!("report:\n{report}\n{logs}");

    assert!(
        has("pml.filetype=pml"),
        "trip.pml must get the pml file type\n{context}"
    );
    assert!(
        has("pml.clients=1"),
        "the server must attach to trip.pml\n{context}"
    );
    assert!(
        report
            .lines()
            .any(|l| l.starts_with("pml.tagfunc=") && l != "pml.tagfunc="),
        "Ctrl-] goes through the server (tagfunc)\n{context}"
    );
    assert!(
        report
            .lines()
            .any(|l| l.starts_with("diagnostic\tpml\tPML205\t0:") && l.contains("nosuch")),
        "the server's PML205 for <nosuch/> must reach trip.pml\n{context}"
    );

    assert!(
        has("xml.filetype=xml"),
        "an .xml prompt keeps the xml file type\n{context}"
    );
    assert!(
        report
            .lines()
            .any(|l| l.starts_with("diagnostic\txml\tPML205\t4:") && l.contains("missing")),
        "the server must attach to an .xml prompt and report its <missing/> on line 5\n{context}"
    );
    assert!(
        !report
            .lines()
            .any(|l| l.starts_with("diagnostic\txml\t") && l.contains("plan")),
        "the .xml prompt's <plan/> import is valid\n{context}"
    );

    assert!(
        has("other.clients=0"),
        "an XML file that is neither a schema nor a prompt is left alone\n{context}"
    );
    assert!(
        has("servers=1"),
        "one server serves every buffer of the folder\n{context}"
    );
}

#[test]
fn vscode_extension_manifest_is_valid() {
    let dir = editors_dir().join("vscode");
    let read_json = |name: &str| -> Value {
        let text = fs::read_to_string(dir.join(name))
            .unwrap_or_else(|error| panic!("editors/vscode/{name}: {error}"));
        serde_json::from_str(&text)
            .unwrap_or_else(|error| panic!("editors/vscode/{name} is not valid JSON: {error}"))
    };
    let manifest = read_json("package.json");
    let main = manifest["main"]
        .as_str()
        .expect("package.json names its main script");
    assert!(dir.join(main).is_file(), "the main script {main} exists");
    assert!(
        manifest["dependencies"]["vscode-languageclient"].is_string(),
        "the extension depends on vscode-languageclient"
    );
    assert!(
        manifest["engines"]["vscode"].is_string(),
        "engines.vscode is set"
    );

    let contributes = &manifest["contributes"];
    let languages = contributes["languages"]
        .as_array()
        .expect("contributes.languages");
    let pml = languages
        .iter()
        .find(|language| language["id"] == "pml")
        .expect("a `pml` language");
    assert!(
        pml["extensions"]
            .as_array()
            .is_some_and(|extensions| extensions.iter().any(|e| e == ".pml")),
        "the pml language covers .pml files"
    );
    let language_configuration = pml["configuration"]
        .as_str()
        .expect("language configuration");
    read_json(language_configuration.trim_start_matches("./"));
    for grammar in contributes["grammars"]
        .as_array()
        .expect("contributes.grammars")
    {
        let path = grammar["path"].as_str().expect("grammar path");
        let grammar_json = read_json(path.trim_start_matches("./"));
        assert_eq!(grammar_json["scopeName"], grammar["scopeName"]);
    }
    assert!(
        manifest["activationEvents"]
            .as_array()
            .is_some_and(|events| events.iter().any(|e| e == "onLanguage:pml")),
        "activates on the pml language"
    );

    // The settings the extension reads exist, and its command is declared.
    let extension = fs::read_to_string(dir.join(main)).unwrap();
    let properties = &contributes["configuration"]["properties"];
    for (setting, key) in [
        ("server.path", "pml.server.path"),
        ("server.args", "pml.server.args"),
    ] {
        assert!(
            extension.contains(&format!("\"{setting}\"")),
            "extension.js reads {key}"
        );
        assert!(properties[key].is_object(), "package.json declares {key}");
    }
    let commands = contributes["commands"]
        .as_array()
        .expect("contributes.commands");
    for command in commands {
        let name = command["command"].as_str().expect("command name");
        assert!(extension.contains(name), "extension.js registers {name}");
    }
    assert!(
        extension.contains("\"lsp\""),
        "extension.js starts `pml lsp`"
    );
}

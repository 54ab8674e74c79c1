//! Schema rules `PML1xx`, each with sources that must and must not trigger it.

use super::{codes, primary_text, schema_diagnostics, schema_diagnostics_with};
use crate::source_loader::{MemorySourceLoader, RefuseSources};
use crate::test_sources::{TRAVEL, parse_schema};

fn assert_clean(source: &str) {
    let diagnostics = schema_diagnostics(source);
    assert!(
        diagnostics.is_empty(),
        "expected no diagnostics, got {diagnostics:#?}"
    );
}

#[test]
fn a_correct_schema_is_clean() {
    assert_clean(TRAVEL);
    assert_clean(
        r#"<schema name="s">
  Anonymous text <![CDATA[a < b]]>.
  <module name="unit.py">print(1)</module>
  <module name="_private:x-1">x</module>
</schema>"#,
    );
}

#[test]
fn pml101_missing_name() {
    let source = r#"<schema>
  <module>text</module>
  <module name="">text</module>
  <module name="m"><param len="2"/></module>
  <collection><module name="c">x</module></collection>
</schema>"#;
    let diagnostics = schema_diagnostics(source);
    assert_eq!(codes(&diagnostics), ["PML101"; 5]);
    assert_eq!(diagnostics[0].message, "schema without a name");
    assert_eq!(diagnostics[1].message, "module without a name");
    assert_eq!(diagnostics[2].message, "module with an empty name");
    assert_eq!(diagnostics[3].message, "parameter without a name");
    assert_eq!(diagnostics[4].message, "collection without a name");
}

#[test]
fn pml102_duplicate_names_in_one_scope() {
    let source = r#"<schema name="s">
  <module name="a">x</module>
  <union><module name="a">y</module><module name="b">z</module></union>
  <collection name="b"><module name="d">w</module></collection>
</schema>"#;
    let diagnostics = schema_diagnostics(source);
    assert_eq!(codes(&diagnostics), ["PML102", "PML102"]);
    assert_eq!(
        diagnostics[0].message,
        "`a` is declared twice at the schema root"
    );
    assert_eq!(
        diagnostics[0].labels.len(),
        2,
        "points at both declarations"
    );
    assert!(
        diagnostics[0]
            .help
            .as_deref()
            .is_some_and(|help| help.contains("enclosing module's scope"))
    );
    assert_eq!(
        diagnostics[1].message,
        "`b` is declared twice at the schema root"
    );
    assert!(diagnostics[1].labels[0].message.contains("collection"));
}

#[test]
fn pml102_same_name_in_different_scopes_is_fine() {
    assert_clean(
        r#"<schema name="s">
  <module name="a"><module name="intro">x</module></module>
  <module name="b"><module name="intro">y</module></module>
  <user><module name="c">z</module></user>
</schema>"#,
    );
    let nested = schema_diagnostics(
        r#"<schema name="s"><module name="a"><module name="x">1</module><user><module name="x">2</module></user></module></schema>"#,
    );
    assert_eq!(
        codes(&nested),
        ["PML102"],
        "role blocks are transparent for naming"
    );
    assert_eq!(nested[0].message, "`x` is declared twice in module `a`");
}

#[test]
fn pml103_duplicate_params() {
    let source = r#"<schema name="s"><module name="m">
  <param name="p" len="1"/> <param name="q" len="1"/> <param name="p" len="2"/>
  <module name="inner"><param name="p" len="1"/></module>
</module></schema>"#;
    let diagnostics = schema_diagnostics(source);
    assert_eq!(codes(&diagnostics), ["PML103"]);
    assert_eq!(
        diagnostics[0].message,
        "module `m` has two parameters named `p`"
    );
    assert_eq!(primary_text(source, &diagnostics[0]), "p");
    assert!(
        diagnostics[0]
            .primary_span()
            .is_some_and(|span| span.start > source.find("name=\"q\"").unwrap_or(0))
    );
}

#[test]
fn pml104_union_members_must_be_modules() {
    let source = r#"<schema name="s"><module name="m">
  <union>
    Pick one:
    <param name="p" len="1"/>
    <module name="a">x</module>
    <union><module name="b">y</module></union>
    <collection name="c"><module name="d">z</module></collection>
  </union>
</module></schema>"#;
    let diagnostics = schema_diagnostics(source);
    assert_eq!(codes(&diagnostics), ["PML104"; 4]);
    assert_eq!(diagnostics[0].message, "text directly inside a union");
    assert_eq!(primary_text(source, &diagnostics[0]).trim(), "Pick one:");
    assert_eq!(
        diagnostics[1].message,
        "a parameter directly inside a union"
    );
    assert_eq!(diagnostics[2].message, "a union directly inside a union");
    assert_eq!(
        diagnostics[3].message,
        "a collection directly inside a union"
    );
}

#[test]
fn pml104_whitespace_and_role_wrapped_text_in_unions() {
    assert_clean(
        "<schema name=\"s\"><union>\n   <module name=\"a\">x</module>\n\n</union></schema>",
    );
    let diagnostics =
        schema_diagnostics("<schema name=\"s\"><union><user>hi</user></union></schema>");
    assert_eq!(
        codes(&diagnostics),
        ["PML104", "PML104"],
        "the role block and the text inside it"
    );
}

#[test]
fn pml105_empty_union() {
    let diagnostics = schema_diagnostics("<schema name=\"s\"><union>  </union><union/></schema>");
    assert_eq!(codes(&diagnostics), ["PML105", "PML105"]);
    assert!(!diagnostics[0].is_error());
}

#[test]
fn pml106_params_only_inside_modules() {
    let source = r#"<schema name="s">
  Go to <param name="city" len="2"/>.
  <user>Stay <param name="nights" len="1"/>.</user>
  <module name="m"><user>In <param name="ok" len="1"/></user></module>
</schema>"#;
    let diagnostics = schema_diagnostics(source);
    assert_eq!(codes(&diagnostics), ["PML106", "PML106"]);
    assert!(primary_text(source, &diagnostics[0]).contains("city"));
    assert!(primary_text(source, &diagnostics[1]).contains("nights"));
}

#[test]
fn pml106_not_repeated_for_params_in_root_unions() {
    let diagnostics = schema_diagnostics(
        "<schema name=\"s\"><union><param name=\"p\" len=\"1\"/></union></schema>",
    );
    assert_eq!(codes(&diagnostics), ["PML104"]);
}

#[test]
fn pml107_invalid_len() {
    let source = r#"<schema name="s"><module name="m">
  <param name="a"/>
  <param name="b" len="ten"/>
  <param name="c" len="0"/>
  <param name="d" len="-3"/>
  <param name="e" len="2.5"/>
  <param name="f" len=""/>
  <parameter name="g" length="x"/>
</module></schema>"#;
    let diagnostics = schema_diagnostics(source);
    assert_eq!(codes(&diagnostics), ["PML107"; 7]);
    assert_eq!(diagnostics[0].message, "parameter without `len`");
    assert_eq!(diagnostics[1].message, "`ten` is not a whole number");
    assert_eq!(primary_text(source, &diagnostics[1]), "ten");
    assert_eq!(
        diagnostics[2].message,
        "a parameter must reserve at least one position"
    );
    assert!(
        diagnostics[6]
            .help
            .as_deref()
            .is_some_and(|help| help.starts_with("`length`"))
    );
}

#[test]
fn pml107_valid_lengths() {
    assert_clean(
        r#"<schema name="s"><module name="m">
  <param name="a" len="1"/> <param name="b" len=" 8 "/> <parameter name="c" length="32768"/>
  <param name="d" len="3">scaffold</param>
</module></schema>"#,
    );
}

#[test]
fn pml108_len_too_large() {
    let source = r#"<schema name="s"><module name="m">
  <param name="a" len="32769"/>
  <param name="b" len="99999999999999999999999999"/>
</module></schema>"#;
    let diagnostics = schema_diagnostics(source);
    assert_eq!(codes(&diagnostics), ["PML108", "PML108"]);
    assert_eq!(
        diagnostics[0].message,
        "`32769` is above the limit of 32768 tokens"
    );
}

#[test]
fn pml109_default_must_name_a_member() {
    let source = r#"<schema name="s">
  <union default="rom"><module name="tokyo">x</module><module name="rome">y</module></union>
  <union scaffold="b"><module name="a">x</module><module name="c">y</module></union>
  <union default="tokyo"><module name="d">x</module><user><module name="e">y</module></user></union>
</schema>"#;
    let diagnostics = schema_diagnostics(source);
    assert_eq!(
        codes(&diagnostics),
        ["PML109", "PML109", "PML109", "PML104"]
    );
    assert_eq!(diagnostics[0].help.as_deref(), Some("did you mean `rome`?"));
    assert_eq!(primary_text(source, &diagnostics[0]), "rom");
    assert!(diagnostics[1].labels[0].message.contains("scaffold"));
    assert_eq!(diagnostics[1].help.as_deref(), Some("members: `a`, `c`"));
    assert_eq!(
        diagnostics[2].message, "`tokyo` is not a member of this union",
        "a module elsewhere does not count"
    );
}

#[test]
fn pml109_valid_defaults() {
    assert_clean(
        r#"<schema name="s">
  <union default="b"><module name="a">x</module><module name="b">y</module></union>
  <union scaffold="c"><module name="c">x</module></union>
</schema>"#,
    );
}

#[test]
fn pml110_src_must_load() {
    let source = r#"<schema name="s">
  <module name="a" src="a.py"/>
  <module name="b" src="missing.py"/>
  <module name="c" src="latin1.txt"/>
  <module name="d" src=""/>
</schema>"#;
    let loader = MemorySourceLoader::new()
        .with_file("a.py", "print(1)")
        .with_bytes("latin1.txt", &[0xe9]);
    let diagnostics = schema_diagnostics_with(source, &loader);
    assert_eq!(codes(&diagnostics), ["PML110"; 3]);
    assert_eq!(
        diagnostics[0].labels[0].message,
        "`missing.py` does not exist"
    );
    assert_eq!(
        diagnostics[1].labels[0].message,
        "`latin1.txt` is not valid UTF-8"
    );
    assert_eq!(diagnostics[2].message, "empty `src` path");
}

#[test]
fn pml110_src_refused_by_host() {
    let diagnostics = schema_diagnostics_with(
        "<schema name=\"s\"><module name=\"a\" src=\"a.py\"/></schema>",
        &RefuseSources,
    );
    assert_eq!(codes(&diagnostics), ["PML110"]);
    assert!(diagnostics[0].labels[0].message.contains("does not allow"));
    let help = diagnostics[0].help.as_deref().unwrap_or_default();
    assert!(
        help.contains("inside the module instead of `src`"),
        "{help}"
    );
    assert!(!help.contains("relative to the schema's folder"), "{help}");
}

/// A `src` naming a FIFO in the schema's folder: the check returns at once with PML110, where it
/// used to wait for a writer for ever.
#[cfg(unix)]
#[test]
fn pml110_src_fifo_is_refused() {
    let dir = std::env::temp_dir().join(format!("pml-check-fifo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create temp dir");
    let made = std::process::Command::new("mkfifo")
        .arg(dir.join("notes.txt"))
        .status()
        .expect("run mkfifo");
    assert!(made.success(), "mkfifo failed");
    let (sender, receiver) = std::sync::mpsc::channel();
    let root = dir.clone();
    std::thread::spawn(move || {
        let loader = crate::FsSourceLoader::new(root);
        let source = r#"<schema name="s"><module name="a" src="notes.txt"/></schema>"#;
        let _ = sender.send(schema_diagnostics_with(source, &loader));
    });
    let diagnostics = receiver
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("the check returns instead of blocking on the FIFO");
    assert_eq!(codes(&diagnostics), ["PML110"]);
    assert_eq!(
        diagnostics[0].labels[0].message,
        "`notes.txt` is not a regular file (a FIFO)"
    );
    let help = diagnostics[0].help.as_deref().unwrap_or_default();
    assert!(help.contains("regular file"), "{help}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn src_text_is_returned() {
    let schema = parse_schema(
        "<schema name=\"s\"><module name=\"x\">t</module><module name=\"a\" src=\"a.py\"/></schema>",
    );
    let loader = MemorySourceLoader::new().with_file("a.py", "print(1)");
    let check = crate::check_schema(&schema, &loader);
    let id = check
        .index
        .lookup(crate::Scope::Root, "a")
        .expect("module a");
    assert_eq!(check.sources.get(&id).map(String::as_str), Some("print(1)"));
    assert_eq!(check.sources.len(), 1);
}

#[test]
fn pml111_src_must_stay_in_the_schema_folder() {
    let source = r#"<schema name="s">
  <module name="a" src="../secret.txt"/>
  <module name="b" src="/etc/passwd"/>
  <module name="c" src="sub/../ok.txt"/>
</schema>"#;
    let loader = MemorySourceLoader::new().with_file("ok.txt", "fine");
    let diagnostics = schema_diagnostics_with(source, &loader);
    assert_eq!(codes(&diagnostics), ["PML111", "PML111"]);
    assert_eq!(primary_text(source, &diagnostics[0]), "../secret.txt");
}

#[test]
fn pml112_src_with_content() {
    let source = r#"<schema name="s">
  <module name="a" src="a.py">print(2)</module>
  <module name="b" src="a.py"><param name="p" len="1"/></module>
  <module name="c" src="a.py">
  </module>
</schema>"#;
    let loader = MemorySourceLoader::new().with_file("a.py", "print(1)");
    let diagnostics = schema_diagnostics_with(source, &loader);
    assert_eq!(codes(&diagnostics), ["PML112", "PML112"]);
    assert_eq!(diagnostics[0].labels.len(), 2);
}

#[test]
fn pml113_unknown_attributes() {
    let source = r#"<schema name="s" version="2">
  <module name="m" scr="a.py">
    <param name="p" lenght="2" len="2"/>
  </module>
  <union defualt="m2"><module name="m2">x</module></union>
  <collection name="c" order="any"><module name="m3">y</module></collection>
</schema>"#;
    let diagnostics = schema_diagnostics(source);
    assert_eq!(codes(&diagnostics), ["PML113"; 5]);
    assert!(diagnostics.iter().all(|diagnostic| !diagnostic.is_error()));
    let helps: Vec<&str> = diagnostics
        .iter()
        .filter_map(|diagnostic| diagnostic.help.as_deref())
        .collect();
    assert_eq!(
        helps,
        [
            "`<schema>` takes `name`",
            "did you mean `src`?",
            "did you mean `length`?",
            "did you mean `default`?",
            "`<collection>` takes `name`",
        ]
    );
    assert_eq!(primary_text(source, &diagnostics[1]), "scr");
}

#[test]
fn pml114_collection_members_must_be_modules() {
    let source = r#"<schema name="s"><collection name="docs">
  Documents:
  <module name="a">x</module>
  <param name="p" len="1"/>
  <union><module name="b">y</module></union>
</collection></schema>"#;
    let diagnostics = schema_diagnostics(source);
    assert_eq!(codes(&diagnostics), ["PML114"; 3]);
    assert_eq!(diagnostics[0].message, "text directly inside a collection");
}

#[test]
fn pml115_role_names_are_reserved() {
    let diagnostics = schema_diagnostics(
        "<schema name=\"s\"><module name=\"user\">x</module><module name=\"system-prompt\">y</module></schema>",
    );
    assert_eq!(codes(&diagnostics), ["PML115"]);
    assert_eq!(
        diagnostics[0].message,
        "module named after the role tag `user`"
    );
}

#[test]
fn pml116_names_must_be_tag_names() {
    let source = r#"<schema name="s">
  <module name="day one">x</module>
  <module name="2024-report">x</module>
  <module name="a+b">x</module>
  <module name="ok_2024.report:v-1">x</module>
  <module name="überblick">x</module>
</schema>"#;
    let diagnostics = schema_diagnostics(source);
    assert_eq!(codes(&diagnostics), ["PML116"; 3]);
    assert_eq!(
        diagnostics[0].labels[0].message,
        "a tag name cannot hold whitespace"
    );
    assert_eq!(
        diagnostics[1].labels[0].message,
        "a tag name starts with a letter or `_`"
    );
}

#[test]
fn pml117_schema_names_are_bounded() {
    use crate::schema_index::MAX_SCHEMA_NAME_CHARS;
    let at_limit = "é".repeat(MAX_SCHEMA_NAME_CHARS);
    assert_clean(&format!("<schema name=\"{at_limit}\">x</schema>"));
    let long = "n".repeat(300);
    let source = format!("<schema name=\"{long}\">x</schema>");
    let diagnostics = schema_diagnostics(&source);
    assert_eq!(codes(&diagnostics), ["PML117"]);
    assert_eq!(primary_text(&source, &diagnostics[0]), long);
    assert_eq!(
        diagnostics[0].message,
        "the schema's name is 300 characters long, more than the 128 a name may have"
    );
    assert!(diagnostics[0].help.is_some());
    let summary = crate::rules::SCHEMA_NAME_TOO_LONG.summary;
    assert!(summary.contains(&MAX_SCHEMA_NAME_CHARS.to_string()));
    // Module names go into no file name: only the schema's is bounded.
    let long_module = format!("<schema name=\"s\"><module name=\"{long}\">x</module></schema>");
    assert_clean(&long_module);
}

#[test]
fn nested_roles_are_left_to_the_parser() {
    let parse = pml_syntax::parse("<schema name=\"s\"><user>a <system>b</system></user></schema>");
    let syntax_codes = codes(&parse.diagnostics);
    assert_eq!(syntax_codes, ["PML015"]);
    let pml_syntax::ast::SourceFile::Schema(schema) = parse.file else {
        panic!("schema expected")
    };
    let check = crate::check_schema(&schema, &MemorySourceLoader::new());
    assert!(
        check.diagnostics.is_empty(),
        "no second report: {:#?}",
        check.diagnostics
    );
}

#[test]
fn one_mistake_does_not_hide_the_next() {
    let source = r#"<schema>
  <module name="a"><param name="p"/></module>
  <module name="a">x</module>
  <union default="z"></union>
</schema>"#;
    let diagnostics = schema_diagnostics(source);
    assert_eq!(
        codes(&diagnostics),
        ["PML101", "PML107", "PML102", "PML105", "PML109"]
    );
}

//! The index of the travel schema: scopes, membership, parameters, lookups and paths.

use super::*;
use crate::test_sources::{TRAVEL, parse_schema};

fn travel() -> SchemaIndex {
    SchemaIndex::build(&parse_schema(TRAVEL))
}

fn id(index: &SchemaIndex, name: &str) -> ModuleId {
    let ids = index.modules_named(name);
    assert_eq!(ids.len(), 1, "exactly one module `{name}`");
    ids[0]
}

#[test]
fn modules_are_numbered_in_schema_order() {
    let index = travel();
    let names: Vec<&str> = index
        .modules()
        .map(|(_, module)| module.name_text())
        .collect();
    assert_eq!(
        names,
        [
            "travel-plan",
            "domestic",
            "overseas",
            "tokyo",
            "rome",
            "note-food",
            "note-sleep",
            "packing-list"
        ]
    );
    assert!(
        index
            .modules()
            .all(|(id, module)| index.module(id) == module)
    );
    assert_eq!(index.name().map(|name| name.text.as_str()), Some("travel"));
}

#[test]
fn scopes_skip_unions_collections_and_roles() {
    let index = travel();
    let plan = id(&index, "travel-plan");
    let overseas = id(&index, "overseas");
    assert_eq!(
        index.module(plan).scope,
        Scope::Root,
        "inside <user>, still the root scope"
    );
    assert_eq!(
        index.module(id(&index, "domestic")).scope,
        Scope::Module(plan),
        "union members live in the parent's scope"
    );
    assert_eq!(
        index.module(id(&index, "tokyo")).scope,
        Scope::Module(overseas)
    );
    assert_eq!(index.module(id(&index, "note-food")).scope, Scope::Root);
    let root: Vec<ModuleId> = index.children(Scope::Root).to_vec();
    assert_eq!(
        root,
        [
            plan,
            id(&index, "note-food"),
            id(&index, "note-sleep"),
            id(&index, "packing-list")
        ]
    );
    assert_eq!(
        index.children(Scope::Module(plan)),
        [id(&index, "domestic"), overseas]
    );
}

#[test]
fn lookup_is_by_scope() {
    let index = travel();
    let plan = id(&index, "travel-plan");
    assert_eq!(index.lookup(Scope::Root, "travel-plan"), Some(plan));
    assert_eq!(index.lookup(Scope::Root, "tokyo"), None);
    assert_eq!(
        index.lookup(Scope::Module(plan), "overseas"),
        Some(id(&index, "overseas"))
    );
    assert_eq!(index.lookup(Scope::Module(plan), "tokyo"), None);
    assert!(index.modules_named("nowhere").is_empty());
}

#[test]
fn unions_and_defaults() {
    let index = travel();
    assert_eq!(index.unions().len(), 2);
    let (outer_id, outer) = index.unions().next().expect("a union");
    assert_eq!(
        outer.members,
        [id(&index, "domestic"), id(&index, "overseas")]
    );
    assert_eq!(outer.default_member(&index), Some(id(&index, "domestic")));
    assert_eq!(index.module(id(&index, "domestic")).union, Some(outer_id));
    assert_eq!(
        index.union(UnionId(1)).default_member(&index),
        None,
        "the inner union has no default"
    );
    assert_eq!(index.module(id(&index, "travel-plan")).union, None);
}

#[test]
fn exclusivity_follows_unions_through_ancestors() {
    let index = travel();
    let (domestic, overseas, tokyo, rome) = (
        id(&index, "domestic"),
        id(&index, "overseas"),
        id(&index, "tokyo"),
        id(&index, "rome"),
    );
    assert!(index.are_exclusive(domestic, overseas));
    assert!(index.are_exclusive(tokyo, rome));
    assert!(
        index.are_exclusive(domestic, tokyo),
        "tokyo sits inside overseas"
    );
    assert!(
        !index.are_exclusive(overseas, tokyo),
        "a parent and its child go together"
    );
    assert!(!index.are_exclusive(tokyo, tokyo));
    assert!(!index.are_exclusive(id(&index, "travel-plan"), id(&index, "packing-list")));
}

#[test]
fn collections() {
    let index = travel();
    let (collection_id, collection) = index.collections().next().expect("a collection");
    assert_eq!(
        collection.name.as_ref().map(|name| name.text.as_str()),
        Some("notes")
    );
    assert_eq!(
        collection.members,
        [id(&index, "note-food"), id(&index, "note-sleep")]
    );
    assert_eq!(
        index.module(id(&index, "note-food")).collection,
        Some(collection_id)
    );
    assert_eq!(index.collection(collection_id).scope, Scope::Root);
}

#[test]
fn params_belong_to_their_nearest_module() {
    let index = travel();
    let plan = index.module(id(&index, "travel-plan"));
    assert_eq!(plan.params.len(), 1);
    let duration = plan.param("duration").expect("duration");
    assert_eq!(duration.len, Some(3));
    assert!(plan.param("city").is_none(), "city is domestic's");
    assert_eq!(
        index
            .module(id(&index, "domestic"))
            .param("city")
            .and_then(|param| param.len),
        Some(2)
    );
}

#[test]
fn paths_parents_and_ancestry() {
    let index = travel();
    let (plan, overseas, tokyo) = (
        id(&index, "travel-plan"),
        id(&index, "overseas"),
        id(&index, "tokyo"),
    );
    assert_eq!(index.path(tokyo), [plan, overseas, tokyo]);
    assert_eq!(index.parent(tokyo), Some(overseas));
    assert_eq!(index.parent(plan), None);
    assert_eq!(index.ancestors(tokyo).collect::<Vec<_>>(), [overseas, plan]);
    assert!(index.is_within(tokyo, Scope::Module(plan)));
    assert!(index.is_within(tokyo, Scope::Root));
    assert!(!index.is_within(plan, Scope::Module(tokyo)));
}

#[test]
fn open_roles_and_content() {
    let index = travel();
    let roles: Vec<Role> = index.open_roles().iter().map(|open| open.role).collect();
    assert_eq!(
        roles,
        [Role::User],
        "<system> is closed, <user> is left open"
    );
    assert!(index.module(id(&index, "tokyo")).has_inline_content);
}

#[test]
fn broken_schemas_still_index() {
    let parse = pml_syntax::parse(
        "<schema><module>a<module name=\"x\">b</module></module><module name=\"x\">c</module><param name=\"p\" len=\"1\"/></schema>",
    );
    let pml_syntax::ast::SourceFile::Schema(schema) = parse.file else {
        panic!("schema expected")
    };
    let index = SchemaIndex::build(&schema);
    assert_eq!(index.modules().len(), 3);
    assert!(index.name().is_none());
    let unnamed = ModuleId(0);
    assert_eq!(index.module(unnamed).name_text(), "");
    assert_eq!(index.lookup(Scope::Module(unnamed), "x"), Some(ModuleId(1)));
    assert_eq!(index.lookup(Scope::Root, "x"), Some(ModuleId(2)));
}

#[test]
fn len_parsing() {
    assert_eq!(parse_len("8"), Ok(8));
    assert_eq!(parse_len(" 8 "), Ok(8));
    assert_eq!(parse_len("32768"), Ok(32_768));
    assert_eq!(parse_len("32769"), Err(LenError::TooLarge));
    assert_eq!(
        parse_len("123456789012345678901234567890"),
        Err(LenError::TooLarge)
    );
    assert_eq!(parse_len("0"), Err(LenError::Zero));
    assert_eq!(parse_len("000"), Err(LenError::Zero));
    for bad in ["", " ", "-1", "+1", "1.0", "1e3", "ten", "٣"] {
        assert_eq!(parse_len(bad), Err(LenError::NotANumber), "{bad:?}");
    }
}

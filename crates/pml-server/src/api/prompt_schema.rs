//! Which loaded schema a PML prompt is bound to, decided once at the HTTP edge so the engine
//! thread never parses PML: the schema its `<prompt schema="…">` names, else the only one loaded
//! (binding then reports the missing name as `pmlc check` does, PML201, with that schema's
//! context). With several loaded and none named, the request is refused with the same 400 every
//! time, listing them (the registry is ordered by name), rather than bound to whichever a hash
//! map yields first.

use pml_syntax::ast::SourceFile;

use super::error::ApiError;
use crate::engine::schemas::SchemaRegistry;

/// The name of the schema `source` is bound to.
pub fn prompt_schema(source: &str, registry: &SchemaRegistry) -> Result<String, ApiError> {
    if let SourceFile::Prompt(prompt) = pml_syntax::parse(source).file
        && let Some(name) = prompt.schema
    {
        // A name that is not loaded is the engine's 404, answered where the schema is looked up.
        return Ok(name.text);
    }
    let loaded: Vec<String> = registry.list().into_iter().map(|info| info.name).collect();
    match loaded.as_slice() {
        [only] => Ok(only.clone()),
        [] => Err(ApiError::bad_field(
            "prompt",
            "the prompt names no schema and none is loaded: upload one (POST /v1/schemas) \
             or start the server with --schemas DIR",
        )
        .with_code("schema_not_found")),
        several => Err(ApiError::bad_field(
            "prompt",
            format!(
                "the prompt names no schema and {} are loaded ({}): name one with \
                 <prompt schema=\"NAME\">",
                several.len(),
                several.join(", ")
            ),
        )
        .with_code("schema_ambiguous")),
    }
}

#[cfg(test)]
mod tests {
    use super::prompt_schema;
    use crate::engine::schemas::{SchemaInfo, SchemaRegistry, SchemaStatus};

    fn registry(names: &[&str]) -> SchemaRegistry {
        let registry = SchemaRegistry::default();
        for name in names {
            registry.insert(SchemaInfo {
                name: name.to_string(),
                status: SchemaStatus::Ready,
                units_total: 0,
                units_done: 0,
                units_encoded: 0,
                error: None,
                source: "".into(),
            });
        }
        registry
    }

    #[test]
    fn a_named_schema_is_taken_as_named() {
        let source = r#"<prompt schema="travel"><user>Hi</user></prompt>"#;
        assert_eq!(prompt_schema(source, &registry(&[])).unwrap(), "travel");
        assert_eq!(
            prompt_schema(source, &registry(&["a", "b"])).unwrap(),
            "travel"
        );
    }

    #[test]
    fn an_unnamed_schema_is_the_only_one_loaded() {
        let source = "<prompt><user>Hi</user></prompt>";
        assert_eq!(
            prompt_schema(source, &registry(&["docqa"])).unwrap(),
            "docqa"
        );
        let none = prompt_schema(source, &registry(&[])).unwrap_err();
        assert_eq!(none.status, axum::http::StatusCode::BAD_REQUEST);
        assert_eq!(none.code, Some("schema_not_found"));
    }

    #[test]
    fn several_loaded_and_none_named_is_the_same_400_every_time() {
        let source = "<prompt><user>Hi</user></prompt>";
        // Inserted in two orders: the answer lists them by name either way.
        let first = prompt_schema(source, &registry(&["zeta", "alpha", "mid"])).unwrap_err();
        let second = prompt_schema(source, &registry(&["mid", "zeta", "alpha"])).unwrap_err();
        assert_eq!(first.status, axum::http::StatusCode::BAD_REQUEST);
        assert_eq!(first.code, Some("schema_ambiguous"));
        assert!(
            first.message.contains("(alpha, mid, zeta)"),
            "{}",
            first.message
        );
        assert_eq!(first.message, second.message);
    }
}

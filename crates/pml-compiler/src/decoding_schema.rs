//! The JSON Schema constrained decoding holds an answer or a tool call's arguments to: the
//! client's schema with its numbers bounded ([`crate::json_bounds`]) and its objects closed. An
//! object schema that lists its `properties` and says nothing of others takes none, as llama.cpp's
//! JSON grammar reads it (and OpenAI's strict mode asks): JSON Schema's default, any other key,
//! lets a small model put its answer under a key of its own — a tool without parameters
//! (`{"type": "object", "properties": {}}`) then gets `{"properties": {"llm_version": "1.2.3"}}`
//! instead of `{}`. Objects that compose (`allOf`, `$ref`, pattern or unevaluated properties)
//! are left as written, since closing one part would refuse the keys of another.

use serde_json::Value;

use crate::json_bounds::bounded_numbers;

/// `schema` as constrained decoding takes it (see the module).
pub fn decoding_schema(schema: &Value) -> Value {
    let mut decoded = bounded_numbers(schema);
    close(&mut decoded, false);
    decoded
}

/// Keywords whose value is one schema.
const SCHEMA: [&str; 8] = [
    "items",
    "additionalProperties",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
];

/// Keywords whose value is a list of schemas.
const SCHEMA_LIST: [&str; 4] = ["anyOf", "oneOf", "allOf", "prefixItems"];

/// Keywords whose value maps names to schemas.
const SCHEMA_MAP: [&str; 5] = [
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
];

/// Keys beside which closing an object would refuse what they allow.
const COMPOSING: [&str; 5] = [
    "allOf",
    "$ref",
    "patternProperties",
    "unevaluatedProperties",
    "dependentSchemas",
];

/// Closes `schema`'s objects and its subschemas'; `in_all_of`: `schema` is one part of an
/// `allOf`, whose other parts may add properties.
fn close(schema: &mut Value, in_all_of: bool) {
    let Value::Object(object) = schema else {
        return;
    };
    if !in_all_of
        && object.get("properties").is_some_and(Value::is_object)
        && !object.contains_key("additionalProperties")
        && !COMPOSING.iter().any(|key| object.contains_key(*key))
    {
        object.insert("additionalProperties".into(), Value::Bool(false));
    }
    for (key, value) in object.iter_mut() {
        let key = key.as_str();
        if SCHEMA.contains(&key) {
            close(value, false);
        } else if SCHEMA_LIST.contains(&key) {
            if let Value::Array(parts) = value {
                parts
                    .iter_mut()
                    .for_each(|part| close(part, key == "allOf"));
            }
        } else if SCHEMA_MAP.contains(&key)
            && let Value::Object(named) = value
        {
            named.values_mut().for_each(|schema| close(schema, false));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn listed_properties_close_an_object_unless_it_says_otherwise_or_composes() {
        let schema = json!({"type": "object", "properties": {
            "none": {"type": "object", "properties": {}},
            "open": {"type": "object", "properties": {"a": {}}, "additionalProperties": true},
            "typed": {"type": "object", "properties": {}, "additionalProperties": {"type": "integer"}},
            "bare": {"type": "object"},
            "list": {"type": "array", "items": {"type": "object", "properties": {"x": {}}}},
            "parts": {"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]},
            "choice": {"anyOf": [{"properties": {"a": {}}}, {"type": "null"}]},
            "properties": {"type": "object", "properties": {"count": {"type": "number"}}},
        }, "$defs": {"point": {"type": "object", "properties": {"x": {}}}}});
        let closed = decoding_schema(&schema);
        let property = |name: &str| &closed["properties"][name];
        assert_eq!(closed["additionalProperties"], json!(false));
        assert_eq!(property("none")["additionalProperties"], json!(false));
        assert_eq!(property("open")["additionalProperties"], json!(true));
        assert_eq!(
            property("typed")["additionalProperties"]["type"],
            json!("integer")
        );
        assert!(property("bare").get("additionalProperties").is_none());
        assert_eq!(
            property("list")["items"]["additionalProperties"],
            json!(false)
        );
        for part in 0..2 {
            assert!(
                property("parts")["allOf"][part]
                    .get("additionalProperties")
                    .is_none()
            );
        }
        assert_eq!(
            property("choice")["anyOf"][0]["additionalProperties"],
            json!(false)
        );
        // A property named `properties` is a schema like any other, and its numbers are bounded.
        assert_eq!(property("properties")["additionalProperties"], json!(false));
        assert!(
            property("properties")["properties"]["count"]
                .get("maximum")
                .is_some()
        );
        assert!(closed["properties"].get("additionalProperties").is_none());
        assert_eq!(
            closed["$defs"]["point"]["additionalProperties"],
            json!(false)
        );
    }
}

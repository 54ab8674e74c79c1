//! Bounds on the numbers a JSON Schema lets constrained decoding write, as llama.cpp's JSON
//! grammar bounds them (it allows 16 integral and 16 fraction digits): an unbounded `number`
//! lets a small model write digits until the token limit (`6000000…`), an answer that is no JSON
//! at all, or an exponent no client expects (`6e+18`). Here an integral part of at most 15 digits
//! (the largest magnitude a double holds exactly) and a fraction of at most 8 (the finest
//! `multipleOf` llguidance's digit automaton computes without overflowing its `u32`), without
//! exponent. A schema's own bounds
//! are kept; only what it leaves open is closed.

use serde_json::{Value, json};

/// The largest magnitude a bounded number may have: 15 integral digits.
const MAX_MAGNITUDE: f64 = 999_999_999_999_999.0;

/// The smallest step of a bounded `number` that names no `multipleOf`: 8 fraction digits.
const FRACTION_STEP: f64 = 1e-8;

/// `schema` with every `integer` and `number` subschema bounded (see the module).
pub fn bounded_numbers(schema: &Value) -> Value {
    let mut bounded = schema.clone();
    bound(&mut bounded);
    bounded
}

fn bound(schema: &mut Value) {
    match schema {
        Value::Object(object) => {
            let types = |name: &str| match object.get("type") {
                Some(Value::String(kind)) => kind == name,
                Some(Value::Array(kinds)) => kinds.iter().any(|kind| kind == name),
                _ => false,
            };
            let (integer, number) = (types("integer"), types("number"));
            if integer || number {
                let lower = ["minimum", "exclusiveMinimum"];
                let upper = ["maximum", "exclusiveMaximum"];
                if !lower.iter().any(|key| object.contains_key(*key)) {
                    object.insert("minimum".into(), json!(-MAX_MAGNITUDE));
                }
                if !upper.iter().any(|key| object.contains_key(*key)) {
                    object.insert("maximum".into(), json!(MAX_MAGNITUDE));
                }
                if number && !integer && !object.contains_key("multipleOf") {
                    object.insert("multipleOf".into(), json!(FRACTION_STEP));
                }
            }
            for (key, value) in object.iter_mut() {
                // Values, not schemas: left as written.
                if !matches!(key.as_str(), "const" | "enum" | "default" | "examples") {
                    bound(value);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(bound),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_numbers_are_bounded_and_given_bounds_kept() {
        let schema = json!({"type": "object", "properties": {
            "population": {"type": "number"},
            "rank": {"type": "integer", "minimum": 1},
            "scores": {"type": "array", "items": {"type": ["number", "null"]}},
            "ratio": {"type": "number", "multipleOf": 0.5, "maximum": 3},
            "kind": {"const": {"type": "number"}},
        }});
        let bounded = bounded_numbers(&schema);
        let property = |name: &str| &bounded["properties"][name];
        assert_eq!(property("population")["maximum"], json!(MAX_MAGNITUDE));
        assert_eq!(property("population")["minimum"], json!(-MAX_MAGNITUDE));
        assert_eq!(property("population")["multipleOf"], json!(FRACTION_STEP));
        assert_eq!(property("rank")["minimum"], json!(1));
        assert_eq!(property("rank")["maximum"], json!(MAX_MAGNITUDE));
        assert!(property("rank").get("multipleOf").is_none());
        assert_eq!(
            property("scores")["items"]["multipleOf"],
            json!(FRACTION_STEP)
        );
        assert_eq!(property("ratio")["multipleOf"], json!(0.5));
        assert_eq!(property("ratio")["maximum"], json!(3));
        assert_eq!(property("kind"), &json!({"const": {"type": "number"}}));
    }
}

//! Rendering a model's Jinja chat template as Hugging Face transformers renders it (with Python's
//! jinja2): trim_blocks and lstrip_blocks, loop controls, dictionaries in insertion order,
//! Python's string and dict methods, `raise_exception`, `strftime_now`, and `tojson` as Python's
//! `json.dumps(…, ensure_ascii=False)` writes it (`{"a": 1, "b": [2, 3]}`, not minijinja's
//! compact form), since templates put tool schemas in the prompt that way and the model was
//! trained on those bytes. A construct minijinja cannot render is an error naming it, never a
//! silent fallback. `tests/chat_templates_jinja2.rs` checks real templates against jinja2.

use std::fmt::Write;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State, Value};

/// Which day `strftime_now` formats: today (UTC), or a fixed date (reproducible renders).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TemplateDate {
    Today,
    Fixed { year: i32, month: u32, day: u32 },
}

/// An environment holding the template `source` under the name [`TEMPLATE_NAME`].
pub fn template_environment(
    source: &str,
    date: TemplateDate,
) -> Result<Environment<'static>, Error> {
    let mut environment = Environment::new();
    environment.set_trim_blocks(true);
    environment.set_lstrip_blocks(true);
    environment.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    environment.add_function(
        "raise_exception",
        |message: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, message))
        },
    );
    environment.add_function("strftime_now", move |format: String| {
        let (year, month, day) = match date {
            TemplateDate::Today => today_utc(),
            TemplateDate::Fixed { year, month, day } => (year, month, day),
        };
        strftime(&format, year, month, day)
    });
    environment.add_filter("tojson", tojson);
    environment.add_template_owned(TEMPLATE_NAME, source.to_owned())?;
    Ok(environment)
}

/// The name the template is registered under.
pub const TEMPLATE_NAME: &str = "chat_template";

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent, sort_keys=sort_keys)`, as
/// transformers' `tojson` filter calls it.
fn tojson(_: &State, value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    // Python's `ensure_ascii=True` would escape every non-ASCII character; no template asks.
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    if ensure_ascii == Some(true) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson(ensure_ascii=true) is not supported",
        ));
    }
    let mut out = String::new();
    let style = JsonStyle {
        indent,
        sort_keys: sort_keys.unwrap_or(false),
    };
    write_json(&mut out, &value, &style, 0)?;
    // Marked safe, as jinja2's tojson result is used verbatim in the prompt.
    Ok(Value::from_safe_string(out))
}

struct JsonStyle {
    indent: Option<usize>,
    sort_keys: bool,
}

impl JsonStyle {
    /// Before an item at `depth` (Python: newline and indent with `indent`, else nothing).
    fn open_item(&self, out: &mut String, depth: usize) {
        if let Some(indent) = self.indent {
            out.push('\n');
            out.push_str(&" ".repeat(indent * depth));
        }
    }

    /// Between items: `", "` without indent, `","` with it (Python's default separators).
    fn separator(&self) -> &'static str {
        if self.indent.is_some() { "," } else { ", " }
    }
}

fn write_json(
    out: &mut String,
    value: &Value,
    style: &JsonStyle,
    depth: usize,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, value),
        ValueKind::String => write_string(out, value.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push_str(style.separator());
                }
                style.open_item(out, depth + 1);
                write_json(out, item, style, depth + 1)?;
            }
            style.open_item(out, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if style.sort_keys {
                keys.sort_by_key(|key| key.to_string());
            }
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (index, key) in keys.iter().enumerate() {
                if index > 0 {
                    out.push_str(style.separator());
                }
                style.open_item(out, depth + 1);
                match key.as_str() {
                    Some(text) => write_string(out, text),
                    // Python turns numeric and boolean keys into strings.
                    None => write_string(out, &key.to_string()),
                }
                out.push_str(": ");
                write_json(out, &value.get_item(key)?, style, depth + 1)?;
            }
            style.open_item(out, depth);
            out.push('}');
        }
        // Bytes, plain objects, invalid values, and kinds minijinja adds later.
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson cannot write a value of kind {}", value.kind()),
            ));
        }
    }
    Ok(())
}

/// Integers as they are; floats as Python's `repr` writes them (`1.0`, `0.1`, `1e-05`).
fn write_number(out: &mut String, value: &Value) {
    if value.is_integer()
        && let Ok(integer) = i128::try_from(value.clone())
    {
        let _ = write!(out, "{integer}");
        return;
    }
    let float = f64::try_from(value.clone()).unwrap_or(f64::NAN);
    if float.is_nan() {
        out.push_str("NaN");
    } else if float.is_infinite() {
        out.push_str(if float > 0.0 { "Infinity" } else { "-Infinity" });
    } else if float == float.trunc() && float.abs() < 1e16 {
        let _ = write!(out, "{float:.1}");
    } else {
        let exponent = float.abs().log10().floor() as i32;
        if (-4..16).contains(&exponent) {
            let _ = write!(out, "{float}");
        } else {
            // Python: shortest digits, then `e-05` / `e+16`.
            let text = format!("{float:e}");
            let (mantissa, power) = text.split_once('e').unwrap_or((&text, "0"));
            let power: i32 = power.parse().unwrap_or(0);
            let sign = if power < 0 { '-' } else { '+' };
            let _ = write!(out, "{mantissa}e{sign}{:02}", power.abs());
        }
    }
}

/// A JSON string as Python writes it with `ensure_ascii=False`: `"` and `\` escaped, the short
/// escapes for `\n \r \t \b \f`, other control characters as `\u00XX`, everything else as is.
fn write_string(out: &mut String, text: &str) {
    out.push('"');
    for character in text.chars() {
        match character {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            control if u32::from(control) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(control));
            }
            other => out.push(other),
        }
    }
    out.push('"');
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// Python's `strftime` for the date directives templates use (`%d %b %Y`, `%B`, `%m`, `%y`,
/// `%-d`); a time or another directive is an error naming it.
fn strftime(format: &str, year: i32, month: u32, day: u32) -> Result<String, Error> {
    let month_name = MONTHS[(month.clamp(1, 12) - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(character) = chars.next() {
        if character != '%' {
            out.push(character);
            continue;
        }
        let mut directive = chars.next();
        let unpadded = directive == Some('-');
        if unpadded {
            directive = chars.next();
        }
        match directive {
            Some('d') if unpadded => write!(out, "{day}"),
            Some('d') => write!(out, "{day:02}"),
            Some('m') if unpadded => write!(out, "{month}"),
            Some('m') => write!(out, "{month:02}"),
            Some('Y') => write!(out, "{year}"),
            Some('y') => write!(out, "{:02}", year.rem_euclid(100)),
            Some('b') => write!(out, "{}", &month_name[..3]),
            Some('B') => write!(out, "{month_name}"),
            Some('%') => write!(out, "%"),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "strftime_now: directive %{} is not supported",
                        other.unwrap_or(' ')
                    ),
                ));
            }
        }
        .map_err(|_| Error::new(ErrorKind::InvalidOperation, "strftime_now"))?;
    }
    Ok(out)
}

/// Today's civil date in UTC (Howard Hinnant's days-to-civil algorithm).
fn today_utc() -> (i32, u32, u32) {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_secs())
        .unwrap_or(0);
    let days = (seconds / 86_400) as i64 + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * shifted_month + 2) / 5 + 1) as u32;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    } as u32;
    let year = (year_of_era + era * 400 + i64::from(month <= 2)) as i32;
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use minijinja::context;

    use super::*;

    fn render(source: &str, value: serde_json::Value) -> String {
        let environment = template_environment(
            source,
            TemplateDate::Fixed {
                year: 2024,
                month: 7,
                day: 6,
            },
        )
        .expect("compiles");
        environment
            .get_template(TEMPLATE_NAME)
            .and_then(|template| template.render(context! { x => Value::from_serialize(&value) }))
            .expect("renders")
    }

    #[test]
    fn tojson_writes_what_pythons_json_dumps_writes() {
        let value = serde_json::json!({
            "name": "get_weather", "n": 3, "f": 1.0, "small": 0.00001, "ok": true,
            "none": null, "list": [1, "é \"q\" \n\t\u{1}"], "empty": {}, "nothing": []
        });
        assert_eq!(
            render("{{ x | tojson }}", value.clone()),
            r#"{"name": "get_weather", "n": 3, "f": 1.0, "small": 1e-05, "ok": true, "none": null, "list": [1, "é \"q\" \n\t\u0001"], "empty": {}, "nothing": []}"#
        );
        assert_eq!(
            render(
                "{{ x | tojson(indent=2) }}",
                serde_json::json!({"a": [1, 2], "b": {}})
            ),
            "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": {}\n}"
        );
        assert_eq!(
            render(
                "{{ x | tojson(sort_keys=true) }}",
                serde_json::json!({"b": 1, "a": 2})
            ),
            r#"{"a": 2, "b": 1}"#
        );
    }

    #[test]
    fn strftime_now_formats_the_date() {
        assert_eq!(
            render(
                r#"{{ strftime_now("%d %b %Y") }}|{{ strftime_now("%-d %B %y, %m") }}"#,
                serde_json::json!(null)
            ),
            "06 Jul 2024|6 July 24, 07"
        );
        let environment = template_environment(r#"{{ strftime_now("%H") }}"#, TemplateDate::Today)
            .expect("compiles");
        let error = environment
            .get_template(TEMPLATE_NAME)
            .and_then(|template| template.render(context! {}))
            .expect_err("hours are refused");
        assert!(error.to_string().contains("%H"), "{error}");
    }

    #[test]
    fn today_is_a_plausible_date() {
        let (year, month, day) = today_utc();
        assert!(
            (2024..2200).contains(&year) && (1..=12).contains(&month) && (1..=31).contains(&day)
        );
    }
}

//! Which kind of PML file a text is, read from its first element without parsing it: what a
//! caller needs to route a file or a request body (a schema to load, a PML prompt to bind, plain
//! text to answer as it is). Comments, the XML declaration and processing instructions may come
//! first, as they do at the top of files.

/// The name of the first element of `source` when only whitespace, comments and processing
/// instructions come before it; `None` for text that does not start with an element (or whose
/// leading comment is not closed).
pub fn root_tag(source: &str) -> Option<&str> {
    let mut rest = source.trim_start();
    loop {
        if let Some(after) = rest.strip_prefix("<!--") {
            rest = after.split_once("-->")?.1.trim_start();
        } else if let Some(after) = rest.strip_prefix("<?") {
            rest = after.split_once("?>")?.1.trim_start();
        } else {
            break;
        }
    }
    let name = rest.strip_prefix('<')?;
    let end = name
        .find(|c: char| c.is_whitespace() || c == '>' || c == '/')
        .unwrap_or(name.len());
    let name = &name[..end];
    let is_name = name
        .chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_');
    is_name.then_some(name)
}

/// Whether `source` is a PML prompt (`<prompt …>` first).
pub fn is_prompt(source: &str) -> bool {
    root_tag(source) == Some("prompt")
}

/// Whether `source` is a PML schema (`<schema …>` first).
pub fn is_schema(source: &str) -> bool {
    root_tag(source) == Some("schema")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_element_after_comments_and_declarations() {
        assert_eq!(root_tag("<schema name=\"a\">"), Some("schema"));
        assert_eq!(root_tag("  <prompt>hi</prompt>"), Some("prompt"));
        assert_eq!(
            root_tag(
                "<?xml version=\"1.0\"?>\n<!-- a note -->\n<!--two-->\n<prompt schema=\"x\"/>"
            ),
            Some("prompt")
        );
        assert_eq!(root_tag("<prompts>"), Some("prompts"));
        assert!(!is_prompt("<prompts>"));
        assert!(is_schema("<!-- about --><schema name=\"s\"></schema>"));
    }

    #[test]
    fn plain_text_has_no_root() {
        assert_eq!(root_tag("Tell me about <prompt> tags."), None);
        assert_eq!(root_tag("<!-- never closed <prompt>"), None);
        assert_eq!(root_tag("< prompt>"), None);
        assert_eq!(root_tag("<3 you"), None);
        assert_eq!(root_tag(""), None);
    }
}

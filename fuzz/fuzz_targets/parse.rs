//! Fuzz target: any bytes, read as UTF-8 (lossily), must parse without panicking and give label
//! spans inside the source on char boundaries; the first diagnostics are also rendered with miette.
#![no_main]

use libfuzzer_sys::fuzz_target;

/// Rendering costs several times more than parsing: render only the first few diagnostics so
/// the fuzzer spends most of its time in the parser while still exercising the renderer.
const RENDERED_DIAGNOSTICS: usize = 3;

fuzz_target!(|data: &[u8]| {
    let source = String::from_utf8_lossy(data);
    let parsed = pml_syntax::parse(&source);
    for diagnostic in &parsed.diagnostics {
        for label in &diagnostic.labels {
            assert!(label.span.start <= label.span.end && label.span.end <= source.len());
            assert!(
                source.is_char_boundary(label.span.start)
                    && source.is_char_boundary(label.span.end)
            );
        }
    }
    let rendered = &parsed.diagnostics[..parsed.diagnostics.len().min(RENDERED_DIAGNOSTICS)];
    let _ = pml_syntax::render(rendered, "fuzz.pml", &source, false);
});

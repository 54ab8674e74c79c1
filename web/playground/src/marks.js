// Diagnostics drawn on an editor's text: each label's span underlined (errors and warnings apart).

export function escapeHtml(text) {
  return text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

// The server's spans count UTF-8 bytes; the editor's text counts UTF-16 units.
function byteToIndex(text) {
  const map = new Map();
  let bytes = 0;
  let index = 0;
  for (const character of text) {
    map.set(bytes, index);
    const code = character.codePointAt(0);
    bytes += code < 0x80 ? 1 : code < 0x800 ? 2 : code < 0x10000 ? 3 : 4;
    index += character.length;
  }
  map.set(bytes, index);
  return (offset) => (map.has(offset) ? map.get(offset) : Math.min(offset, text.length));
}

// The text as HTML, with the spans of `diagnostics` (from the last check) marked.
export function markSpans(text, diagnostics) {
  const toIndex = byteToIndex(text);
  const marks = [];
  for (const diagnostic of diagnostics) {
    for (const label of diagnostic.labels) {
      let start = toIndex(label.span.start);
      let end = toIndex(label.span.end);
      if (start > text.length) continue;
      if (end <= start) end = Math.min(text.length, start + 1);
      if (end <= start) start = Math.max(0, end - 1);
      marks.push({ start, end, severity: diagnostic.severity, code: diagnostic.code });
    }
  }
  marks.sort((a, b) => a.start - b.start);
  let html = "";
  let at = 0;
  for (const mark of marks) {
    if (mark.start < at) continue;
    html += escapeHtml(text.slice(at, mark.start));
    html +=
      `<mark class="${mark.severity}" title="${escapeHtml(mark.code)}">` +
      `${escapeHtml(text.slice(mark.start, mark.end))}</mark>`;
    at = mark.end;
  }
  return html + escapeHtml(text.slice(at));
}

// The unlabelled samples of a Prometheus text exposition, by name (labelled series are summed).
export function parseMetrics(text) {
  const values = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const match = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (!match) continue;
    const value = Number(match[3]);
    if (Number.isFinite(value)) values[match[1]] = (values[match[1]] || 0) + value;
  }
  return values;
}

"""The gauges and counters of a running `pml serve` (`GET /metrics`), for the benchmark scripts."""
import http.client


def read(port, prefixes=("pml_",)):
    """Every sample whose name starts with one of `prefixes`, as {name with labels: value}."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", "/metrics")
    values = {}
    for line in conn.getresponse().read().decode().splitlines():
        if line.startswith(prefixes):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def kv_peak_mib(port):
    """The most KV the sequences held at once (`pml_kv_resident_peak_bytes`), in MiB."""
    peak = read(port, ("pml_kv_resident_peak_bytes",)).get("pml_kv_resident_peak_bytes")
    return None if peak is None else peak / 2**20


def passes_per_step(port):
    """Forward passes per engine step (`pml_forward_passes_total` / `pml_engine_steps_total`);
    None for a build that does not count them."""
    values = read(port, ("pml_forward_passes_total", "pml_engine_steps_total"))
    steps = values.get("pml_engine_steps_total")
    if not steps:
        return None
    return values.get("pml_forward_passes_total", 0.0) / steps


def drafts(port):
    """(drafted, accepted, model drafted, model accepted) tokens of speculative decoding
    (`pml_spec_draft_tokens_total`, `pml_spec_accepted_tokens_total`, and of those the draft
    model's, `pml_spec_model_*`); None for a build that does not count them."""
    names = ("pml_spec_draft_tokens_total", "pml_spec_accepted_tokens_total",
             "pml_spec_model_draft_tokens_total", "pml_spec_model_accepted_tokens_total")
    values = read(port, names)
    if "pml_spec_draft_tokens_total" not in values:
        return None
    return tuple(int(values.get(name, 0)) for name in names)

"""Server-sent events of a streamed OpenAI-style response, for the benchmark scripts beside
this one (each imports it from its own folder)."""
import json


def chunks(response):
    """Yields the JSON object of each `data:` event of `response` (an http.client response),
    skipping comments, blank lines and the closing `[DONE]`."""
    for raw in response:
        line = raw.decode(errors="replace").strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        yield json.loads(line[6:])

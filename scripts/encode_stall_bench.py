"""Does a schema's encoding stall the completions a server is answering? Starts `pml serve`,
streams a completion alone, then the same completion with a schema upload sent while it runs
(MODULES modules of about TOKENS tokens each, from the docqa example's paragraphs), and prints
each run's time to first token, longest gap between tokens and total time, over several rounds (each uploading new modules),
and the ratios of the rounds' medians: the encode must leave the stream's longest gap within 2x
of the longest without it.

Usage: python3 scripts/encode_stall_bench.py [--pml target/release/pml] [--model qwen2.5-0.5b]
       [--modules 24] [--tokens 60] [--rounds 5]
"""
import argparse
import http.client
import json
import os
import re
import socket
import threading
import time

import local_server
from sse import chunks

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def paragraphs():
    """The docqa example's module texts."""
    with open(os.path.join(HERE, "..", "schemas", "docqa", "docqa.pml"), encoding="utf-8") as f:
        source = f.read()
    return [re.sub(r"\s+", " ", text).strip()
            for text in re.findall(r"<module[^>]*>(.*?)</module>", source, re.S)]


def schema(name, modules, round_):
    texts = paragraphs()
    body = "".join(
        f'<module name="m{index}">{texts[index % len(texts)]} (copy {index}, round {round_})'
        '</module>'
        for index in range(modules))
    return f'<schema name="{name}"><system>Answer from the documents.</system>{body}</schema>'


def stream(port, tokens):
    """Time to first token, longest gap between tokens, total time and tokens of one streamed
    completion of `tokens` tokens."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = {"prompt": "Once upon a time, in a small village by the sea,", "max_tokens": tokens,
            "temperature": 0, "stream": True}
    started = time.perf_counter()
    connection.request("POST", "/v1/completions", json.dumps(body),
                       {"Content-Type": "application/json"})
    response = connection.getresponse()
    stamps = [time.perf_counter() for chunk in chunks(response)
              if chunk.get("choices") and chunk["choices"][0].get("text")]
    connection.close()
    gaps = sorted(later - earlier for earlier, later in zip(stamps, stamps[1:]))
    return {"ttft_s": stamps[0] - started, "longest_gap_s": max(gaps, default=0.0),
            "p90_gap_s": gaps[int(0.9 * (len(gaps) - 1))] if gaps else 0.0,
            "total_s": stamps[-1] - started, "tokens": len(stamps)}


def upload(port, source):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    connection.request("POST", "/v1/schemas", source.encode(), {"Content-Type": "text/plain"})
    answer = connection.getresponse()
    answer.read()
    connection.close()
    return answer.status


def wait_ready(port, name):
    started = time.perf_counter()
    while True:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        connection.request("GET", f"/v1/schemas/{name}")
        info = json.loads(connection.getresponse().read())
        connection.close()
        if info.get("status") in ("ready", "failed"):
            return time.perf_counter() - started, info
        time.sleep(0.2)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pml", default="target/release/pml")
    parser.add_argument("--model", default="qwen2.5-0.5b")
    parser.add_argument("--modules", type=int, default=24)
    parser.add_argument("--tokens", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=5,
                        help="alone / beside pairs; the ratios are of their medians")
    args = parser.parse_args()
    port = free_port()
    store = f"disk:{os.path.join('/tmp', f'encode-stall-{port}')}"
    server = local_server.start(
        [args.pml, "serve", "--port", str(port), "--model", args.model, "--store", store,
         "--no-ui"], port, "pml serve")
    try:
        stream(port, 4)  # warm-up
        rounds = []
        for round_ in range(args.rounds):
            alone = stream(port, args.tokens)
            name = f"stall{port}r{round_}"
            result = {}
            runner = threading.Thread(target=lambda: result.update(stream(port, args.tokens)))
            runner.start()
            time.sleep(0.5)
            status = upload(port, schema(name, args.modules, round_))
            runner.join()
            encode_s, info = wait_ready(port, name)
            rounds.append({"alone": alone, "beside_encode": result, "upload_status": status,
                           "units": info.get("units_total"),
                           "encode_left_after_stream_s": round(encode_s, 2)})

        def median(key, side):
            values = sorted(r[side][key] for r in rounds)
            return values[len(values) // 2]

        print(json.dumps({
            "model": args.model, "modules": args.modules, "rounds": rounds,
            "longest_gap_median_s": {side: median("longest_gap_s", side)
                                     for side in ("alone", "beside_encode")},
            "gap_ratio": round(median("longest_gap_s", "beside_encode")
                               / max(median("longest_gap_s", "alone"), 1e-9), 2),
            "p90_gap_ratio": round(median("p90_gap_s", "beside_encode")
                                   / max(median("p90_gap_s", "alone"), 1e-9), 2),
            "total_ratio": round(median("total_s", "beside_encode")
                                 / max(median("total_s", "alone"), 1e-9), 2)}, indent=1))
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()

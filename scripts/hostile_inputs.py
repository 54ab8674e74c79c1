#!/usr/bin/env python3
"""The hostile inputs that once stalled or broke PML, each run against the built binaries with its
wall time, peak memory and outcome: what the tests assert (tests/hostile_input.rs, http_api.rs,
pmlc_cli.rs, context_limits.rs), measured on the real default model.

    python3 scripts/hostile_inputs.py [--bin target/release]

Starts `pml serve` on a free loopback port with a store of its own, sends each request (a chat runs
beside the slow ones to show that it is not stalled), runs the CLI cases under /usr/bin/time, then
stops the server. Prints one line per case; exits 1 if a case took 2 s or more, or 1 GB or more, or
did not end in the expected status.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

LIMIT_SECONDS = 2.0
LIMIT_BYTES = 1 << 30


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def request(base, method, path, body=None, timeout=120):
    data = body.encode() if isinstance(body, str) else body
    headers = {"Content-Type": "application/json"}
    req = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def rss_bytes(pid):
    """The process's peak resident memory (VmHWM), in bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def timed_cli(args, cwd, env):
    """Runs `args` under /usr/bin/time: (seconds, peak bytes, exit code, stderr)."""
    with tempfile.NamedTemporaryFile("r") as report:
        started = time.monotonic()
        result = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", report.name, *args],
                                cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        seconds = time.monotonic() - started
        peak = int(report.read().strip().splitlines()[-1]) * 1024
    return seconds, peak, result.returncode, result.stderr


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", default="target/release")
    args = parser.parse_args()
    pml, pmlc = (os.path.abspath(os.path.join(args.bin, name)) for name in ("pml", "pmlc"))
    work = tempfile.mkdtemp(prefix="pml-hostile-")
    env = dict(os.environ, PML_STORE=os.path.join(work, "store"), NO_COLOR="1")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [pml, "serve", "--port", str(port), "--store", os.path.join(work, "store"),
         "--max-body-bytes", str(64 << 20), "--max-schema-units", "20000"],
        env=env, stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, "serve.log"), "w"))
    rows, failed = [], False
    try:
        for _ in range(600):
            try:
                if request(base, "GET", "/health", timeout=1)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)  # waiting for the model to load, not synchronising a test
        chat_body = json.dumps({"messages": [{"role": "user", "content": "Say hi."}],
                                "max_tokens": 4})

        def http_case(name, method, path, body, expected):
            nonlocal failed
            chat = {}

            def beside():
                started = time.monotonic()
                chat["status"] = request(base, "POST", "/v1/chat/completions", chat_body)[0]
                chat["seconds"] = time.monotonic() - started

            helper = threading.Thread(target=beside)
            started = time.monotonic()
            helper.start()
            status, answer = request(base, method, path, body)
            seconds = time.monotonic() - started
            helper.join()
            peak = rss_bytes(server.pid)
            ok = status == expected and seconds < LIMIT_SECONDS and peak < LIMIT_BYTES
            failed |= not ok
            code = ""
            try:
                error = json.loads(answer).get("error", {})
                code = error.get("code") or error.get("type") or ""
            except (ValueError, AttributeError):
                pass
            rows.append(f"{'ok  ' if ok else 'FAIL'} {name}: HTTP {status} {code} in {seconds:.2f} s, "
                        f"{len(answer)} bytes; server peak {peak / 2**20:.0f} MiB; chat beside: "
                        f"{chat.get('status')} in {chat.get('seconds', 0):.2f} s")

        def cli_case(name, command, expected):
            nonlocal failed
            seconds, peak, code, stderr = timed_cli(command, work, env)
            ok = code in expected and seconds < LIMIT_SECONDS and peak < LIMIT_BYTES
            failed |= not ok
            first = next((line for line in stderr.splitlines() if "PML" in line), "")
            rows.append(f"{'ok  ' if ok else 'FAIL'} {name}: exit {code} in {seconds:.2f} s, "
                        f"peak {peak / 2**20:.0f} MiB {first.strip()[:100]}")

        request(base, "POST", "/v1/schemas", "<schema name=\"x\">Notes.</schema>")
        comments = "<prompt schema=\"x\">" + "<!--" * 250_000
        http_case("1 MB of <!-- to /v1/completions", "POST", "/v1/completions",
                  json.dumps({"prompt": comments, "max_tokens": 2}), 400)
        union = "".join(f"<module name=\"m{i}\">Fact {i}.</module>" for i in range(10_000))
        http_case("a 10,000-module union uploaded", "POST", "/v1/schemas",
                  f"<schema name=\"many\"><union>{union}</union></schema>", 202)
        http_case("DELETE while it encodes", "DELETE", "/v1/schemas/many", None, 204)
        http_case("a 300-character schema name", "POST", "/v1/schemas",
                  f"<schema name=\"{'n' * 300}\">x</schema>", 400)
        http_case("response_format {$ref: #}", "POST", "/v1/chat/completions", json.dumps(
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
             "response_format": {"type": "json_schema",
                                 "json_schema": {"name": "x", "schema": {"$ref": "#"}}}}), 400)
        big = "<schema name=\"big\">" + "<module name=\"m\">x</module>" * 2_000_000 + "</schema>"
        http_case("a 50 MB upload (body limit raised)", "POST", "/v1/schemas", big, 413)
        http_case("a 32 MB prompt", "POST", "/v1/completions",
                  json.dumps({"prompt": "z" * (32 << 20), "max_tokens": 1}), 400)

        with open(os.path.join(work, "comments.pml"), "w") as file:
            file.write(comments)
        cli_case("pmlc check on 1 MB of <!--", [pmlc, "check", "comments.pml"], {1})
        with open(os.path.join(work, "small-modules.pml"), "w") as file:
            file.write("<schema name=\"s\">" + "".join(
                f"<module name=\"m{i}\">Small module {i}.</module>\n" for i in range(1_700_000))
                + "</schema>\n")
        cli_case("pmlc check on 100 MB of small modules", [pmlc, "check", "small-modules.pml"],
                 {2})
        with open(os.path.join(work, "huge-prompt.pml"), "w") as file:
            file.write("<prompt schema=\"s\">" + "w" * (100 << 20) + "</prompt>")
        cli_case("pml run on a 100 MB prompt", [pml, "run", "huge-prompt.pml"], {2})
        with open(os.path.join(work, "lib.pml"), "w") as file:
            file.write("<schema name=\"lib\"><collection name=\"docs\"><module name=\"note\">A short "
                       "note on the weather in spring.</module></collection></schema>\n")
        with open(os.path.join(work, "many-imports.pml"), "w") as file:
            file.write("<prompt schema=\"lib\">" + "<note/>" * 12_000 + "Why?</prompt>\n")
        cli_case("pml run importing a member 12,000 times", [pml, "run", "many-imports.pml"], {2})
        os.mkfifo(os.path.join(work, "pipe.txt"))
        with open(os.path.join(work, "fifo.pml"), "w") as file:
            file.write("<schema name=\"f\"><module name=\"m\" src=\"pipe.txt\"/></schema>\n")
        cli_case("pmlc check of a src= FIFO", [pmlc, "check", "fifo.pml"], {1})
        with open(os.path.join(work, "named.pml"), "w") as file:
            file.write(f"<schema name=\"{'n' * 250}\">x</schema>\n")
        cli_case("pmlc check of a 250-character name", [pmlc, "check", "named.pml"], {1})
    finally:
        server.terminate()
        server.wait(timeout=30)
    print(f"# {os.uname().machine}, load {os.getloadavg()[0]:.2f}; limits {LIMIT_SECONDS} s, "
          f"{LIMIT_BYTES >> 20} MiB")
    print("\n".join(rows))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

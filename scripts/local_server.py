"""A server process on a loopback port, for the benchmark scripts beside this one (each imports
it from its own folder): JSON requests to it, and its start, waiting for `/health`."""
import json
import subprocess
import sys
import time
import urllib.request


def post(port, path, body):
    """The JSON answer to `body` POSTed to `path`."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def start(command, port, name):
    """Starts `command` (output discarded) and returns its process once `/health` on `port`
    answers 200; exits naming `name` when it never does."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                if response.status == 200:
                    return process
        except OSError:
            pass
        time.sleep(0.5)
    process.kill()
    sys.exit(f"{name} did not start on port {port}")

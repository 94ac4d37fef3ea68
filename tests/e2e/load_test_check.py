#!/usr/bin/env python3
"""End-to-end test of scripts/load_test.py against `qforge serve` (standard library only).

Usage: load_test_check.py QFORGE_BINARY MODEL.qf

Starts the server on a free loopback port and runs the load test twice, one stream then four
(16 requests of at most 12 tokens each, --json, --pid): no errors, every request's tokens
counted (at most requests x max_tokens, at least one each), latencies and the server's resident
memory reported, and the server's step counters read from /health (tokens per step between 1
and the number of streams; above 1 at four streams: the requests were batched). Then against a
port nobody listens on, one that never answers (--timeout), one that answers nonsense, and
without the key a server wants: every request an error, exit status 1 (with the key, none).
Exits 0 when every check passes, 1 with the failures listed otherwise.
"""
import json
import os
import socket
import subprocess
import sys
import threading
import time

from e2e_support import Checks, free_port, start

LOAD_TEST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                         "load_test.py")


def strict_json(text):
    """One JSON object, refusing NaN and Infinity (not JSON: other parsers reject them)."""
    def refuse(name):
        raise ValueError(f"{name} in the output")
    return json.loads(text, parse_constant=refuse)


def load_test(port, *args):
    r = subprocess.run([sys.executable, LOAD_TEST, "--port", str(port), "--json", *args],
                       capture_output=True, text=True, timeout=300)
    return r.returncode, r.stdout, r.stderr


def main():
    qforge, model = sys.argv[1], sys.argv[2]
    check = Checks()

    requests, max_tokens = 16, 12
    proc, port = start(qforge, model)
    try:
        for streams in (1, 4):
            code, out, err = load_test(port, "--streams", str(streams), "--requests",
                                       str(requests), "--max-tokens", str(max_tokens), "--pid",
                                       str(proc.pid))
            check(code == 0, f"{streams} streams: exit {code}: {err[-500:]}")
            try:
                r = strict_json(out)
            except ValueError:
                check(False, f"{streams} streams: not one JSON object: {out[-500:]!r}")
                continue
            what = f"{streams} streams"
            check(r["errors"] == 0, f"{what}: {r['errors']} errors")
            check(requests <= r["completion_tokens"] <= requests * max_tokens,
                  f"{what}: completion_tokens {r['completion_tokens']}")
            check(r["tokens_per_s"] > 0 and r["seconds"] > 0, f"{what}: throughput {r}")
            check(0 < r["ttft_p50_ms"] <= r["ttft_p99_ms"], f"{what}: TTFT {r}")
            # Null when no request's text came in two chunks or more (stories260K writes 12
            # tokens in about a millisecond: the server's writer may find them all at once).
            itl = (r["itl_p50_ms"], r["itl_p99_ms"])
            check(itl == (None, None) or 0 <= itl[0] <= itl[1], f"{what}: ITL {r}")
            check(r["rss_after_mib"] > 0 and r["server_cpu_s"] >= 0, f"{what}: server {r}")
            check(r.get("server_steps", 0) > 0, f"{what}: server steps {r}")
            tps = r.get("tokens_per_step", 0)
            check(1 <= tps <= streams, f"{what}: tokens per step {tps}")
            if streams > 1:
                check(tps > 1, f"{what}: no step batched two requests ({tps} tokens per step)")
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0]
    check(proc.returncode == 0, f"server exit code {proc.returncode}: {out[-2000:]}")

    code, out, _ = load_test(free_port(), "--streams", "2", "--requests", "3")
    check(code == 1, f"no server: exit {code}")
    check(strict_json(out)["errors"] == 3 if out.strip() else False, f"no server: {out!r}")

    # A server that takes connections and never answers: each request fails once --timeout has
    # passed with nothing received.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        t0 = time.perf_counter()
        code, out, _ = load_test(silent.getsockname()[1], "--streams", "2", "--requests", "2",
                                 "--timeout", "0.5")
        took = time.perf_counter() - t0
    check(code == 1 and strict_json(out)["errors"] == 2, f"silent server: exit {code}, {out!r}")
    check(took < 10, f"silent server: {took:.1f} s")

    # A server that answers nonsense (no status line, then a line with no end): each request
    # an error, not a crash of the client.
    for reply in (b"garbage\r\n\r\n", b"HTTP/1.1 200 OK\r\n\r\ndata: " + b"a" * (2 << 20)):
        with socket.socket() as bad:
            bad.bind(("127.0.0.1", 0))
            bad.listen(8)

            def answer():
                for _ in range(4):  # /health twice, then the two requests
                    conn, _ = bad.accept()
                    with conn:
                        conn.recv(65536)
                        try:
                            conn.sendall(reply)
                        except OSError:
                            pass

            threading.Thread(target=answer, daemon=True).start()
            code, out, _ = load_test(bad.getsockname()[1], "--streams", "2", "--requests", "2",
                                     "--timeout", "5")
        check(code == 1 and strict_json(out)["errors"] == 2, f"nonsense: exit {code}, {out!r}")

    # HTTP errors: a server that wants a key refuses every request without it (401), none with.
    proc, port = start(qforge, model, "--api-key", "k3y")
    try:
        code, out, _ = load_test(port, "--streams", "2", "--requests", "3", "--max-tokens", "4")
        check(code == 1 and strict_json(out)["errors"] == 3, f"no key: exit {code}, {out!r}")
        code, out, _ = load_test(port, "--streams", "2", "--requests", "3", "--max-tokens", "4",
                                 "--api-key", "k3y")
        check(code == 0 and strict_json(out)["errors"] == 0, f"the key: exit {code}, {out!r}")
    finally:
        proc.terminate()
        proc.communicate(timeout=30)

    return check.report("load test e2e")


if __name__ == "__main__":
    sys.exit(main())

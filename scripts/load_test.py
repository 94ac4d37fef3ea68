#!/usr/bin/env python3
"""A bounded load test of `qforge serve` (or any OpenAI-compatible server) on loopback.

N concurrent streams send a fixed number of streaming /v1/completions (or chat) requests in all;
reported: errors, aggregate generated tokens per second, time to first token (TTFT) and
inter-token latency (ITL: the gaps between streamed chunks) at p50 / p99, this client's own CPU
time (on a machine of few cores it competes with the server), and with --pid the server's
resident memory before and after the run and its CPU time per generated token.

  scripts/load_test.py --port 8080 --streams 16 --requests 200 --max-tokens 64 --pid PID

Standard library only. One thread drives every stream's socket (selectors), parsing the chunked
event stream itself: on a machine of few cores the client competes with the server it measures,
and a thread per stream with http.client took 70-85 us of CPU per streamed token at 16 streams
(Zen 4, 2 cores: 8% of a core), where this takes a fraction of that (serve/README.md).
"""
import argparse
import http.client
import json
import os
import selectors
import socket
import sys
import time


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cpu_seconds(pid):
    """User + system CPU time of the process, all threads (/proc/PID/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile_ms(values, p):
    """The p-th percentile of `values` (seconds) in milliseconds; None (JSON null) for none."""
    if not values:
        return None
    s = sorted(values)
    return round(1000 * s[min(len(s) - 1, int(round(p / 100.0 * (len(s) - 1))))], 1)


def health(args):
    """The server's /health object, or {} (another server, or none there)."""
    try:
        conn = http.client.HTTPConnection(args.host, args.port, timeout=min(10.0, args.timeout))
        conn.request("GET", "/health")
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
        return json.loads(body) if resp.status == 200 else {}
    except (OSError, ValueError, http.client.HTTPException):
        return {}


MAX_HEAD = 1 << 16  # bytes of response headers, and of one event line, before the request fails
MAX_LINE = 1 << 20


class Request:
    """One streamed request on a non-blocking socket, driven by the event loop in run(): the
    response's status line and headers, its chunked (or connection-delimited) body, and the
    server-sent events in it. Records the time to the first text chunk, the gaps between text
    chunks and the completion tokens the final usage chunk reports."""

    def __init__(self, args, index):
        body = {"max_tokens": args.max_tokens, "stream": True, "temperature": args.temperature,
                "seed": index, "stream_options": {"include_usage": True}}
        if args.chat:
            path = "/v1/chat/completions"
            body["messages"] = [{"role": "user", "content": f"{args.prompt} ({index})"}]
        else:
            path = "/v1/completions"
            body["prompt"] = f"{args.prompt} ({index})"
        payload = json.dumps(body).encode()
        head = [f"POST {path} HTTP/1.1", f"Host: {args.host}:{args.port}",
                "Content-Type: application/json", f"Content-Length: {len(payload)}",
                "Connection: close"]
        if args.api_key:
            head.append("Authorization: Bearer " + args.api_key)
        self.out = ("\r\n".join(head) + "\r\n\r\n").encode() + payload
        self.raw = b""          # received, not yet parsed
        self.status = None      # HTTP status, once the headers are in
        self.chunked = False
        self.events = b""       # the body's bytes not yet split into lines
        self.done = False
        self.t0 = time.perf_counter()
        self.ttft, self.last, self.gaps, self.tokens = None, None, [], 0
        self.sock = socket.create_connection((args.host, args.port), timeout=args.timeout)
        self.sock.setblocking(False)

    def writable(self):
        """Sends what it can of the request; True once all is sent."""
        try:
            sent = self.sock.send(self.out)
        except BlockingIOError:  # the send buffer is full: later
            return False
        self.out = self.out[sent:]
        return not self.out

    def readable(self):
        """Takes what arrived; True once the response is complete (the [DONE] event, or the
        server closed the connection). Raises on an HTTP error or an error event."""
        try:
            data = self.sock.recv(65536)
        except BlockingIOError:  # nothing after all
            return False
        if not data:
            if self.status is None or (self.status == 200 and not self.done):
                raise RuntimeError("connection closed before the response ended")
            if self.status != 200:
                raise RuntimeError(f"HTTP {self.status}: {self.raw[:200]!r}")
            return True
        self.raw += data
        if self.status is None:
            end = self.raw.find(b"\r\n\r\n")
            if end < 0:
                if len(self.raw) > MAX_HEAD:
                    raise RuntimeError(f"no end of the response headers in {MAX_HEAD} bytes")
                return False
            lines = self.raw[:end].decode("latin-1").split("\r\n")
            self.status = int(lines[0].split()[1])
            self.chunked = any(l.lower().startswith("transfer-encoding:") and "chunked" in l.lower()
                               for l in lines[1:])
            self.raw = self.raw[end + 4:]
        if self.status != 200:
            return False  # the error body, until the server closes
        if not self.chunked:
            self.events += self.raw
            self.raw = b""
        else:
            while True:
                eol = self.raw.find(b"\r\n")
                if eol < 0:
                    break
                size = int(self.raw[:eol].split(b";")[0], 16)
                if len(self.raw) < eol + 2 + size + 2:
                    break
                self.events += self.raw[eol + 2:eol + 2 + size]
                self.raw = self.raw[eol + 2 + size + 2:]
                if size == 0:
                    break
        return self.parse_events()

    def parse_events(self):
        while not self.done:
            eol = self.events.find(b"\n")
            if eol < 0:
                if len(self.events) > MAX_LINE:
                    raise RuntimeError(f"an event line over {MAX_LINE} bytes")
                return False
            line = self.events[:eol].strip()
            self.events = self.events[eol + 1:]
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                self.done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            if chunk.get("usage"):
                self.tokens = chunk["usage"]["completion_tokens"]
            choices = chunk.get("choices") or []
            if not (choices and (choices[0].get("text") or
                                 (choices[0].get("delta") or {}).get("content"))):
                continue
            now = time.perf_counter()
            if self.ttft is None:
                self.ttft = now - self.t0
            else:
                self.gaps.append(now - self.last)
            self.last = now
        return True

    def close(self):
        self.sock.close()


def run(args):
    """args.requests requests, args.streams at a time, on one thread: (ttfts, gaps, tokens,
    errors)."""
    sel = selectors.DefaultSelector()
    ttfts, gaps, tokens, errors = [], [], 0, []
    started = 0

    def start_next():
        nonlocal started
        while started < args.requests and len(sel.get_map()) < args.streams:
            index = started
            started += 1
            try:
                r = Request(args, index)
            except OSError as e:  # counted and shown, the run goes on
                errors.append(str(e))
                continue
            sel.register(r.sock, selectors.EVENT_WRITE, r)

    start_next()
    while sel.get_map():
        ready = sel.select(timeout=args.timeout)
        if not ready:  # every stream silent that long: each open request fails
            for key in list(sel.get_map().values()):
                errors.append(f"nothing received for {args.timeout:g} s")
                sel.unregister(key.fileobj)
                key.data.close()
            start_next()
            continue
        for key, mask in ready:
            r = key.data
            try:
                if mask & selectors.EVENT_WRITE:
                    if r.writable():
                        sel.modify(r.sock, selectors.EVENT_READ, r)
                    continue
                if not r.readable():
                    continue
                ttfts.append(r.ttft if r.ttft is not None else time.perf_counter() - r.t0)
                gaps.extend(r.gaps)
                tokens += r.tokens
            except Exception as e:  # noqa: BLE001 -- whatever the server sent, that request failed
                errors.append(f"{type(e).__name__}: {e}")
            sel.unregister(r.sock)
            r.close()
        start_next()
    return ttfts, gaps, tokens, errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--streams", type=int, default=4, help="concurrent requests")
    ap.add_argument("--requests", type=int, default=16, help="requests in all")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--prompt", default="Once upon a time, in a small village,")
    ap.add_argument("--chat", action="store_true", help="/v1/chat/completions")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--pid", type=int, default=0, help="the server's pid: RSS before and after")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--timeout", type=float, default=300.0,
                    help="seconds without a byte on any stream before the open requests fail")
    args = ap.parse_args()

    health_before = health(args)
    rss_before = rss_kib(args.pid) if args.pid else 0
    cpu_before = cpu_seconds(args.pid) if args.pid else 0.0
    client_before = os.times()
    t0 = time.perf_counter()
    ttfts, gaps, tokens, errors = run(args)
    wall = time.perf_counter() - t0
    client_after = os.times()
    client_cpu = (client_after.user - client_before.user) + (client_after.system -
                                                            client_before.system)
    rss_after = rss_kib(args.pid) if args.pid else 0
    cpu_used = cpu_seconds(args.pid) - cpu_before if args.pid else 0.0

    result = {
        "streams": args.streams, "requests": args.requests, "errors": len(errors),
        "seconds": round(wall, 3), "completion_tokens": tokens,
        "tokens_per_s": round(tokens / wall, 2) if wall > 0 else 0.0,
        "ttft_p50_ms": percentile_ms(ttfts, 50),
        "ttft_p99_ms": percentile_ms(ttfts, 99),
        "itl_p50_ms": percentile_ms(gaps, 50),
        "itl_p99_ms": percentile_ms(gaps, 99),
        "client_cpu_s": round(client_cpu, 2),
    }
    if args.pid:
        result["rss_before_mib"] = round(rss_before / 1024, 1)
        result["rss_after_mib"] = round(rss_after / 1024, 1)
        # CPU time per generated token: how much work batching saves, even on a loaded machine
        # where wall-clock throughput depends on what else runs.
        result["server_cpu_s"] = round(cpu_used, 2)
        result["cpu_ms_per_token"] = round(1000 * cpu_used / max(tokens, 1), 2)
    # qforge serve's step counters: how full its batches ran (rows per step: decode tokens and
    # prompt chunks; sampled tokens per step: the sequences decoding together).
    health_after = health(args)
    if all(k in health_before and k in health_after for k in ("steps", "step_rows", "step_tokens")):
        steps = health_after["steps"] - health_before["steps"]
        result["server_steps"] = steps
        if steps > 0:
            result["rows_per_step"] = round(
                (health_after["step_rows"] - health_before["step_rows"]) / steps, 2)
            result["tokens_per_step"] = round(
                (health_after["step_tokens"] - health_before["step_tokens"]) / steps, 2)
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>18}: {v}")
        for e in errors[:5]:
            print("error:", e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

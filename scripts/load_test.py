#!/usr/bin/env python3
"""A bounded load test of `qforge serve` (or any OpenAI-compatible server) on loopback.

N concurrent streams send a fixed number of streaming /v1/completions (or chat) requests in all;
reported: errors, aggregate generated tokens per second, time to first token (TTFT) and
inter-token latency (ITL: the gaps between streamed chunks) at p50 / p99, this client's own CPU
time (on a machine of few cores it competes with the server), and with --pid the server's
resident memory before and after the run and its CPU time per generated token.

  scripts/load_test.py --port 8080 --streams 16 --requests 200 --max-tokens 64 --pid PID

Standard library only (http.client): the measurement adds no dependency and no client overhead
of its own beyond parsing the event stream.
"""
import argparse
import http.client
import json
import os
import statistics
import sys
import threading
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


def percentile(values, p):
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100.0 * (len(s) - 1))))]


def health(args):
    """The server's /health object, or {} (another server, or none there)."""
    try:
        conn = http.client.HTTPConnection(args.host, args.port, timeout=10)
        conn.request("GET", "/health")
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
        return json.loads(body) if resp.status == 200 else {}
    except (OSError, ValueError):
        return {}


def one_request(args, index):
    """One streamed request: (ttft seconds, [inter-chunk gaps], completion tokens)."""
    body = {"max_tokens": args.max_tokens, "stream": True, "temperature": args.temperature,
            "seed": index, "stream_options": {"include_usage": True}}
    if args.chat:
        path = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": f"{args.prompt} ({index})"}]
    else:
        path = "/v1/completions"
        body["prompt"] = f"{args.prompt} ({index})"
    headers = {"Content-Type": "application/json"}
    if args.api_key:
        headers["Authorization"] = "Bearer " + args.api_key
    conn = http.client.HTTPConnection(args.host, args.port, timeout=300)
    t0 = time.perf_counter()
    conn.request("POST", path, json.dumps(body), headers)
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    ttft, last, gaps, tokens = None, None, [], 0
    for raw in resp:
        line = raw.decode("utf-8").strip()
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        if "error" in chunk:
            raise RuntimeError(chunk["error"]["message"])
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
        choices = chunk.get("choices") or []
        has_text = choices and (choices[0].get("text") or
                                (choices[0].get("delta") or {}).get("content"))
        if not has_text:
            continue
        now = time.perf_counter()
        if ttft is None:
            ttft = now - t0
        else:
            gaps.append(now - last)
        last = now
    conn.close()
    return ttft if ttft is not None else time.perf_counter() - t0, gaps, tokens


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
    args = ap.parse_args()

    health_before = health(args)
    rss_before = rss_kib(args.pid) if args.pid else 0
    cpu_before = cpu_seconds(args.pid) if args.pid else 0.0
    lock = threading.Lock()
    next_index = [0]
    ttfts, gaps, tokens, errors = [], [], [0], []

    def worker():
        while True:
            with lock:
                if next_index[0] >= args.requests:
                    return
                i = next_index[0]
                next_index[0] += 1
            try:
                t, g, n = one_request(args, i)
                with lock:
                    ttfts.append(t)
                    gaps.extend(g)
                    tokens[0] += n
            except Exception as e:  # counted and shown, the run goes on
                with lock:
                    errors.append(str(e))

    client_before = os.times()
    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(args.streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    client_after = os.times()
    client_cpu = (client_after.user - client_before.user) + (client_after.system -
                                                            client_before.system)
    rss_after = rss_kib(args.pid) if args.pid else 0
    cpu_used = cpu_seconds(args.pid) - cpu_before if args.pid else 0.0

    result = {
        "streams": args.streams, "requests": args.requests, "errors": len(errors),
        "seconds": round(wall, 3), "completion_tokens": tokens[0],
        "tokens_per_s": round(tokens[0] / wall, 2) if wall > 0 else 0.0,
        "ttft_p50_ms": round(1000 * percentile(ttfts, 50), 1),
        "ttft_p99_ms": round(1000 * percentile(ttfts, 99), 1),
        "itl_p50_ms": round(1000 * percentile(gaps, 50), 1),
        "itl_p99_ms": round(1000 * percentile(gaps, 99), 1),
        "client_cpu_s": round(client_cpu, 2),
    }
    if args.pid:
        result["rss_before_mib"] = round(rss_before / 1024, 1)
        result["rss_after_mib"] = round(rss_after / 1024, 1)
        # CPU time per generated token: how much work batching saves, even on a loaded machine
        # where wall-clock throughput depends on what else runs.
        result["server_cpu_s"] = round(cpu_used, 2)
        result["cpu_ms_per_token"] = round(1000 * cpu_used / max(tokens[0], 1), 2)
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

"""For the end-to-end scripts here: `qforge serve` as a child process on a free loopback port, and
the checks' failures collected and reported."""
import socket
import subprocess
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(qforge, model, *extra):
    """(process, port) once the server listens; its output collects on the process's stdout."""
    port = free_port()
    proc = subprocess.Popen(
        [qforge, "serve", model, "--port", str(port), "--threads", "2", "--ctx", "256", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 30
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("qforge serve exited: " + proc.stdout.read())
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("qforge serve did not start listening")


class Checks:
    """Failed checks, listed at the end: report() prints them and the script's verdict, and
    gives its exit status (0 when every check passed)."""

    def __init__(self):
        self.failures = []

    def __call__(self, cond, what):
        if not cond:
            self.failures.append(what)

    def report(self, name, *extra):
        for f in self.failures:
            print("FAIL:", f)
        print(f"{name}:", "ok" if not self.failures else f"{len(self.failures)} failures", *extra)
        return 1 if self.failures else 0

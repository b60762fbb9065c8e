"""The real `pydecode serve` in a subprocess on a free loopback port, for the server's tests."""
import os
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

MODEL = "smollm2-135m"
TIMEOUT = 120


class Server:
    """`pydecode serve` in a subprocess: its URL read from its first line, its stderr kept."""

    def __init__(self, *args, cmd=None):
        cmd = cmd or [sys.executable, "-m", "pydecode", "serve", MODEL, "--port", "0", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.lines: list[str] = []
        self.url = None
        got = threading.Event()

        def drain():
            for line in self.proc.stderr:
                self.lines.append(line)
                m = re.search(r"listening on (http://\S+)", line)
                if m and self.url is None:
                    self.url = m.group(1)
                    got.set()
            got.set()

        threading.Thread(target=drain, daemon=True).start()
        if not got.wait(60) or self.url is None:
            self.proc.kill()
            raise RuntimeError("the server did not start:\n" + "".join(self.lines))

    def health(self):
        r = httpx.get(self.url + "/health", timeout=10)
        return r.status_code, r.json()

    def wait_ready(self, timeout=90):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.health()[0] == 200:
                return self
            time.sleep(0.05)
        raise RuntimeError("the server did not become ready:\n" + "".join(self.lines))

    def client(self, key="none", **kw):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=TIMEOUT, **kw)

    def metrics(self, headers=None) -> dict:
        text = httpx.get(self.url + "/metrics", headers=headers, timeout=10).text
        out = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    def stop(self, sig=signal.SIGTERM, timeout=15) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


def gauge(metrics: dict, name: str) -> float:
    return metrics[(name, ())]

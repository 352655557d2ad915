"""A real vLLM OpenAI-compatible server (``python -m vllm.entrypoints.openai.api_server``, vLLM's CPU
build) on loopback, for the openai engine's tests: started in its own session, killed with SIGKILL (the
whole session) to play a crashed model server, and started again on the same port."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.integration.fleet import free_port
from tests.vllm.helpers import assert_no_survivors

#: the name the server serves the tiny random Llama under (= srdq's --model, so the tokenizer resolves)
SERVED = "tiny-random-llama"


class VLLMServer:
    def __init__(
        self, model_dir: Path, log_dir: Path, *, served: str = SERVED, extra_args: tuple[str, ...] = ()
    ) -> None:
        self.model_dir = model_dir
        self.log_dir = log_dir
        self.served = served
        self.extra_args = tuple(extra_args)  # e.g. ("--runner", "pooling") for a reward model
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.served,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            "float32",
            "--max-model-len",
            "2048",
            "--seed",
            "0",
            "--enforce-eager",
            "--enable-prefix-caching",
            # as the in-process engine on the CPU build (vllm_engine.cpu_prefill_kwargs / memory_kwargs)
            "--no-enable-chunked-prefill",
            "--max-num-batched-tokens",
            "8192",
            "--kv-cache-memory-bytes",
            str(1 << 30),
            *self.extra_args,
        ]

    def start(self, timeout: float = 300.0) -> None:
        self.starts += 1
        log = open(self.log_dir / f"vllm-server-{self.starts}.log", "w")  # noqa: SIM115 - lives with the process
        env = {
            **os.environ,
            "VLLM_LOGGING_LEVEL": "WARNING",
            "TOKENIZERS_PARALLELISM": "false",
            # vLLM's own step limit: this process may carry srdq's hour (allow_slow_steps, set when the tier's
            # in-process engine started), and a stuck step of a tiny model must end the request, not wait
            "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "300",
        }
        self.proc = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"vLLM server exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/models", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"vLLM server not ready within {timeout} s: {self.log_tail()}")
            time.sleep(1.0)

    def kill(self) -> None:
        """SIGKILL the server and every process of its session (a crashed model server)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        assert_no_survivors(self.proc.pid)
        self.proc = None

    def log_tail(self, n: int = 3000) -> str:
        path = self.log_dir / f"vllm-server-{self.starts}.log"
        return path.read_text(errors="replace")[-n:] if path.exists() else ""

"""A server the tests run as a child process (redis-server, nats-server): started and waited
for until it answers, stopped, killed, paused and resumed like a machine that hangs.

Subclasses say how to start the server (``_command``), how to tell that it answers
(``_answers``) and how to stop it cleanly (``_stop_cleanly``, SIGTERM by default).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Self


def free_port() -> int:
    """A TCP port nothing listens on now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ChildServer:
    """One server process; ``what`` names it in errors, ``directory`` is its working directory
    (its log is ``log_name`` there)."""

    what = "server"
    log_name = "server.log"

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _answers(self) -> bool:
        raise NotImplementedError

    def _stop_cleanly(self) -> None:
        assert self.proc is not None
        self.proc.terminate()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout_s: float = 30.0) -> Self:
        """Start the server (its output to its log) and wait until it answers."""
        self.launch()
        self.wait_until_answering(timeout_s)
        return self

    def launch(self) -> None:
        """Start the server without waiting for it (servers that wait for each other)."""
        if self.running:
            raise RuntimeError(f"{self.what} is already running")
        with open(self.directory / self.log_name, "ab") as log:
            self.proc = subprocess.Popen(self._command(), cwd=self.directory,
                                         stdout=log, stderr=subprocess.STDOUT)

    def wait_until_answering(self, timeout_s: float = 30.0) -> None:
        """Return once the launched server answers; RuntimeError if it exits, TimeoutError
        (and SIGKILL) if it does not answer within ``timeout_s``."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while not self._answers():
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.what} exited with code {self.proc.returncode}; see "
                                   f"{self.directory / self.log_name}")
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"{self.what} did not answer within {timeout_s} s")
            time.sleep(0.02)

    def stop(self, timeout_s: float = 10.0) -> None:
        """A clean stop (``_stop_cleanly``), SIGKILL if stuck; harmless when not running."""
        if not self.running:
            return
        assert self.proc is not None
        self.resume()
        self._stop_cleanly()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL: a crash, or a machine lost (its directory stays for a :meth:`start`)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.paused = False

    def pause(self) -> None:
        """SIGSTOP: connections stay open, nothing is answered (a server that hangs); returns
        once the process is stopped (Linux says so)."""
        assert self.proc is not None and self.running
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True
        stat = Path(f"/proc/{self.proc.pid}/stat")
        deadline = time.monotonic() + 5
        while stat.exists() and stat.read_text().rpartition(")")[2].split()[0] != "T":
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.what} did not stop on SIGSTOP")
            time.sleep(0.005)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause` (harmless when not paused)."""
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def restart(self, down_s: float = 0.0, *, kill: bool = False) -> None:
        """Stop (cleanly, or SIGKILL with ``kill``), stay down ``down_s`` s, start again."""
        if kill:
            self.kill()
        else:
            self.stop()
        if down_s > 0:
            time.sleep(down_s)
        self.start()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

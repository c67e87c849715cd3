"""The fork server: a fresh pytest process that collects, then forks one child per test.

Started from a new interpreter (not forked from the pytest process, which may
have started Metal or CUDA already), it parses the same command line in the
same folder, collects the same tests, and then, instead of running them, waits
for node ids on a pipe. For each it forks a child that runs the test
(:mod:`.child`) and answers with the child's pid, then with its ``waitpid``
status. Nothing in it touches a device unless the suite's own collection does,
so each child starts Metal or CUDA for itself, as a spawned process would,
without paying for interpreter start-up, imports and collection each time.
A child forked after its parent used Metal inherits dead GPU-driver
connections (pytorch#178037, Lightning#21345), so the server is handed what
the pytest process read of the device (MPS available, the Mac's facts, the
probe's result: :func:`pytest_mps.backend.read_answers`) and answers from
them, ``torch.backends.mps.is_available()`` included; each child asks again.

The server's own output (pytest's header and collection) goes to a log file;
it never runs ``pytest_sessionfinish``, so it writes no junit file, cache or
benchmark storage.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
from typing import Any

import pytest

from pytest_mps import backend
from pytest_mps.isolation import child

#: How the server gets its settings; taken out of its environment at once.
SERVER_VARIABLE = "PYTEST_MPS_ISOLATION_SERVER"

#: True in the server process: its isolation plugin starts no server of its own.
serving: list[bool] = [False]


class ServerGone(Exception):
    """The server exited or answered nonsense; the message says what it left."""


class Client:
    """The pytest process's end: starts the server, asks for children, waits."""

    def __init__(
        self, config: pytest.Config, inline: bool = False, only: str | None = None
    ) -> None:
        #: a spawned child: the server runs one test itself, without forking
        self.inline = inline
        self.folder = tempfile.mkdtemp(prefix="pytest-mps-server-")
        self.log = os.path.join(self.folder, "server.log")
        requests_read, self._requests = os.pipe()
        self._replies, replies_write = os.pipe()
        spec = {
            "args": list(config.invocation_params.args),
            "requests": requests_read,
            "replies": replies_write,
            "log": self.log,
            "basetemp": _basetemp(config),
            "inline": inline,
            "only": only,
            # what this process read of the device: the server touches no Metal
            "answers": backend.read_answers(),
        }
        env = dict(os.environ, **{SERVER_VARIABLE: json.dumps(spec)})
        # torch.cuda.is_available() asks the CUDA driver by default, which
        # poisons every later fork for CUDA ("Cannot re-initialize CUDA in
        # forked subprocess") without starting CUDA; asking NVML instead is
        # PyTorch's documented fork-safe check (torch.cuda.is_available's
        # docstring). The server's collection calls it (pytest-mps's --device
        # resolution, a suite's skipif).
        env.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from pytest_mps.isolation.server import main; main()",
            ],
            cwd=str(config.invocation_params.dir),
            env=env,
            pass_fds=(requests_read, replies_write),
            stdin=subprocess.DEVNULL,
        )
        os.close(requests_read)
        os.close(replies_write)
        self._buffer = b""
        self.ready = False
        #: why the server's children cannot use the device, once it said so
        self.broken: str | None = None

    def _reply(self, timeout: float | None) -> dict[str, Any] | None:
        """The next answer, or None when ``timeout`` passes first."""
        while b"\n" not in self._buffer:
            readable, _, _ = select.select([self._replies], [], [], timeout)
            if not readable:
                return None
            chunk = os.read(self._replies, 65536)
            if not chunk:
                raise ServerGone(self._gone())
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        data: dict[str, Any] = json.loads(line)
        if "error" in data:
            raise ServerGone(data["error"])
        return data

    def _gone(self) -> str:
        code = self.process.wait()
        try:
            with open(self.log, encoding="utf-8", errors="replace") as file:
                tail = file.read()[-3000:]
        except OSError:
            tail = ""
        return f"the isolation server exited with code {code}; its log ends:\n{tail}"

    def start(self, nodeid: str, folder: str) -> int:
        """Fork a child running ``nodeid``, writing to ``folder``; its pid."""
        if not self.ready:
            ready = self._reply(None)  # {"ready": n}, once collection is done
            self.ready = True
            self.broken = None if ready is None else ready.get("broken")
        if self.broken:
            raise ServerGone(self.broken)
        request = json.dumps({"nodeid": nodeid, "folder": folder}) + "\n"
        try:
            os.write(self._requests, request.encode())
        except BrokenPipeError:
            raise ServerGone(self._gone()) from None
        reply = self._reply(None)
        assert reply is not None
        return int(reply["pid"])

    def wait(self, timeout: float | None) -> int | None:
        """The child's ``waitpid`` status, or None when ``timeout`` passes first."""
        try:
            reply = self._reply(timeout)
        except ServerGone:
            if not self.inline:
                raise
            # the spawned process was the child: its own end is the status
            code = self.process.wait()
            return -code if code < 0 else code << 8
        return None if reply is None else int(reply["status"])

    def close(self) -> None:
        """Stop the server (closing its pipe ends its loop) and remove its files."""
        import shutil

        os.close(self._requests)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._replies)
        shutil.rmtree(self.folder, ignore_errors=True)


def _basetemp(config: pytest.Config) -> str | None:
    # the children's tmp_path under the session's own base, as pytest-xdist's
    # workers do; pytest empties a --basetemp it is given, so a folder of its own
    factory = getattr(config, "_tmp_path_factory", None)
    if factory is None:
        return None
    return str(factory.getbasetemp() / f"isolated-{os.getpid()}")


class ServerPlugin:
    """The server's hooks: a run that collects and then serves, never runs."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec

    @pytest.hookimpl(tryfirst=True)
    def pytest_cmdline_main(self, config: pytest.Config) -> None:
        """Turn off what belongs to the session: distribution, debugger, files."""
        # as pytest-xdist's workers do: no distribution, no debugger, and no
        # files that belong to the session (junit, our reports)
        option = config.option
        for name, value in (
            ("dist", "no"),
            ("numprocesses", None),
            ("maxprocesses", None),
            ("looponfail", False),
            ("usepdb", False),
            ("xmlpath", None),
            ("mps_report", None),
        ):
            if hasattr(option, name):
                setattr(option, name, value)
        if self.spec.get("basetemp"):
            option.basetemp = self.spec["basetemp"]
        if self.spec.get("only"):
            config.args = [self.spec["only"]]  # a spawned child collects its test

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        """Serve: fork a child per node id asked for, until the pipe closes."""
        items = {item.nodeid: item for item in session.items}
        child.warm()
        requests = os.fdopen(self.spec["requests"], "r", encoding="utf-8")
        replies = os.fdopen(self.spec["replies"], "w", encoding="utf-8", buffering=1)
        ready: dict[str, Any] = {"ready": len(items)}
        if not self.spec.get("inline"):
            broken = _device_started()
            if broken:
                ready["broken"] = broken
        replies.write(json.dumps(ready) + "\n")
        _replies_of[0] = replies
        for line in requests:
            request = json.loads(line)
            item = items.get(request["nodeid"])
            if item is None:
                replies.write(
                    json.dumps(
                        {
                            "error": f"{request['nodeid']} was not collected by the "
                            f"isolation server (its log: {self.spec['log']})"
                        }
                    )
                    + "\n"
                )
                continue
            if self.spec.get("inline"):
                replies.write(json.dumps({"pid": os.getpid()}) + "\n")
                _child_main(item, request["folder"], inline=True)
            pid = os.fork()
            if pid == 0:
                _child_main(item, request["folder"])
            replies.write(json.dumps({"pid": pid}) + "\n")
            _, status = os.waitpid(pid, 0)
            replies.write(json.dumps({"status": status}) + "\n")
        os._exit(0)


def _device_started() -> str | None:
    """Why children forked from here cannot use the device, or None.

    CUDA refuses a child forked after CUDA started in its parent ("Cannot
    re-initialize CUDA in forked subprocess"); the server must not have
    started it. (Metal has no such flag to read.)
    """
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return (
        "CUDA was started in the isolation's fork server while it collected the "
        "tests (a CUDA tensor made at import or collection time, a conftest's "
        "torch.cuda.current_device()), so no child forked from it can use CUDA; "
        "run with --mps-isolate-start=spawn, or make CUDA start inside the tests"
    )


def _child_main(item: pytest.Item, folder: str, inline: bool = False) -> None:
    """Run one test here (a forked child, or the spawned server itself)."""

    def say_done() -> None:
        # a spawned server is the child: its parent waits for this line
        print(json.dumps({"status": 0}), file=_replies_of[0], flush=True)

    child.run_then_exit(
        item, child.Paths.in_folder(folder), say_done if inline else None
    )


#: The reply pipe of an inline (spawned) server, for its one status line.
_replies_of: list[Any] = [None]


def main() -> None:
    """The server process's entry: pytest on the same command line, serving."""
    spec = json.loads(os.environ.pop(SERVER_VARIABLE))
    serving[0] = True
    backend.hold(spec.get("answers") or {})
    log = os.open(spec["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    sys.exit(pytest.main(spec["args"], plugins=[ServerPlugin(spec)]))

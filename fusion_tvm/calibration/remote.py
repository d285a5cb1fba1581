"""Calibration of a device behind TVM RPC.

Kernels are built here for the remote target, exported with ``export_library``, uploaded
and timed there with ``time_evaluator``:

>>> session = fusion_tvm.calibration.remote.connect("10.0.0.7", 9090)
>>> spec = fusion_tvm.calibration.calibrate("epyc-znver4-2c", session=session)

With a tracker, ``connect(host, port, key="board")`` asks it for a device of that key.
:class:`LocalServer` starts a loopback server (tests, or a second process on this machine).
"""

from __future__ import annotations

import contextlib
import socket

import numpy as np

from ..hardware import HardwareSpec
from ._timing import RemoteRunner, TimingConfig


def connect(host: str, port: int, key: str = "", tracker: bool = False, timeout: int = 0):
    """An RPC session: straight to a server, or through a tracker when ``tracker``."""
    from tvm import rpc

    if tracker:
        return rpc.connect_tracker(host, port).request(key, session_timeout=timeout)
    return rpc.connect(host, port, key=key, session_timeout=timeout)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class LocalServer:
    """A TVM RPC server on the loopback interface, as a context manager.

    The server runs in a child process (``tvm.rpc.Server`` forks its own); leaving the
    context terminates it.
    """

    def __init__(self, host: str = "127.0.0.1", port: int | None = None):
        self.host = host
        self.port = port
        self.server = None

    def __enter__(self) -> LocalServer:
        from tvm import rpc

        port = self.port or free_port(self.host)
        self.server = rpc.Server(host=self.host, port=port, port_end=port + 50, silent=True)
        self.port = self.server.port
        return self

    def connect(self):
        return connect(self.host, self.port)

    def __exit__(self, *exc) -> None:
        if self.server is not None:
            self.server.terminate()
            self.server = None


def remote_runner(session, hw: HardwareSpec, thorough: bool = False) -> RemoteRunner:
    """A runner timing on ``session``'s CPU for the target of ``hw``."""
    import tvm

    timing = TimingConfig.thorough() if thorough else TimingConfig.quick()
    return RemoteRunner(session, tvm.target.Target(dict(hw.target)), timing)


def benchmark_kernel(session, hw: HardwareSpec, func) -> float:
    """Median seconds of one PrimFunc on the remote device (random inputs)."""
    from .kernels import time_kernel

    runner = remote_runner(session, hw)
    try:
        return time_kernel(runner, func)
    finally:
        runner.close()


def echo(session, array: np.ndarray) -> np.ndarray:
    """Round-trip an array through the remote device (a connectivity check)."""
    import tvm

    dev = session.cpu(0)
    return tvm.runtime.tensor(array, dev).numpy()

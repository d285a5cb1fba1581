"""Calibration: measure a device and write the :class:`HardwareSpec` the cost model uses.

>>> spec = fusion_tvm.calibration.calibrate("host")          # < 1 minute
>>> Path("host.json").write_text(json.dumps(spec.to_json()))
>>> cm = fusion_tvm.compile(model, hw="host.json")

``fusion-tvm hw calibrate spec.json [--thorough] [--rpc HOST:PORT]`` does the same from the
command line (options first need a ``--``: ``fusion-tvm hw calibrate -- --thorough -o x.json``).

The measurements (``micro``) are memory-level bandwidths, the Relax VM's per-kernel overhead
and each schedule rule's efficiency (fraction of the roofline reached); ``remote`` runs them on
a device behind TVM RPC; ``report`` compares the cost model's per-kernel predictions with
measured times over the model zoo.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from ..hardware import HardwareSpec
from ..presets import get_hardware
from ._timing import RemoteRunner, Runner, TimingConfig
from .micro import CalibrationResult, run_calibration

__all__ = ["CalibrationResult", "TimingConfig", "calibrate", "calibrate_full", "cli_main",
           "make_runner"]


def make_runner(hw: HardwareSpec, target: str = "llvm", thorough: bool = False,
                session=None, timing: TimingConfig | None = None) -> Runner:
    """A local runner, or a remote one over ``session`` (a ``tvm.rpc`` session); ``timing``
    overrides the quick / thorough repetitions."""
    import tvm

    if target != "llvm":
        raise ValueError(f"calibration supports the llvm target, not '{target}'")
    tgt = tvm.target.Target(dict(hw.target))
    timing = timing or (TimingConfig.thorough() if thorough else TimingConfig.quick())
    return RemoteRunner(session, tgt, timing) if session is not None else Runner(tgt, timing)


def calibrate_full(hw: str | HardwareSpec = "host", target: str = "llvm", thorough: bool = False,
                   session=None, log=None, rules: bool = True,
                   transcendental: bool = False,
                   timing: TimingConfig | None = None) -> CalibrationResult:
    """:func:`calibrate` returning every measurement as well as the spec (``timing``: time
    with these repetitions, e.g. the ones the kernels to predict are timed with)."""
    base = get_hardware(hw)
    runner = make_runner(base, target, thorough, session, timing)
    try:
        return run_calibration(runner, base, thorough, log, rules, transcendental)
    finally:
        if isinstance(runner, RemoteRunner):
            runner.close()


def calibrate(hw: str | HardwareSpec = "host", target: str = "llvm", thorough: bool = False,
              session=None) -> HardwareSpec:
    """Measure the device and return a calibrated copy of the spec ``hw``.

    Parameters
    ----------
    hw : str or HardwareSpec
        The preset (or spec) to start from: capacities, cores and peak FLOP/s are kept;
        bandwidths, launch overhead and rule efficiencies are measured.
    target : str
        ``"llvm"`` (CPU).
    thorough : bool
        More sizes and repetitions (a few minutes instead of under one).
    session : tvm.rpc.RPCSession, optional
        Measure a remote device: kernels are built here, uploaded and timed there.

    Returns
    -------
    HardwareSpec
        Named ``<name>-calibrated``; ``to_json()`` it to a file for ``get_hardware(path)``.
    """
    return calibrate_full(hw, target, thorough, session).spec


def cli_main(argv: Sequence[str]) -> int:
    """``fusion-tvm hw calibrate``: measure, print, write the spec JSON."""
    p = argparse.ArgumentParser(prog="fusion-tvm hw calibrate",
                                description="measure this machine into a hardware spec")
    p.add_argument("spec", nargs="?", help="write the calibrated spec JSON here (as -o)")
    p.add_argument("--hw", default="host", help="preset or spec to start from (default host)")
    p.add_argument("-o", "--output", help="write the calibrated spec JSON here")
    p.add_argument("--thorough", action="store_true", help="more sizes and repetitions")
    p.add_argument("--rpc", metavar="HOST:PORT", help="measure a device behind a TVM RPC server")
    p.add_argument("--details", metavar="PATH", help="write every measurement as JSON")
    p.add_argument("--transcendental", action="store_true",
                   help="also replace the transcendental peak by the measured throughput")
    argv = list(argv)
    if argv[:1] == ["--"]:  # `fusion-tvm hw calibrate -- --thorough`
        argv = argv[1:]
    args = p.parse_args(argv)
    args.output = args.output or args.spec
    session = None
    if args.rpc:
        from .remote import connect

        host, _, port = args.rpc.rpartition(":")
        session = connect(host or "127.0.0.1", int(port))
    result = calibrate_full(args.hw, thorough=args.thorough, session=session,
                            log=lambda m: print(m, file=sys.stderr),
                            transcendental=args.transcendental)
    text = json.dumps(result.spec.to_json(), indent=2)
    if args.output:
        Path(args.output).write_text(text + "\n")
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        print(text)
    if args.details:
        Path(args.details).write_text(json.dumps(result.to_json(), indent=1, default=str) + "\n")
    return 0

"""TVM's CPU thread pool sized to the cores this process may use.

Unless told otherwise (``TVM_NUM_THREADS`` or ``OMP_NUM_THREADS``), TVM's runtime starts
half of ``hardware_concurrency`` workers on x86, assuming two hyper-threads per core: on a
machine without SMT (a 2-core VM) it runs every parallel kernel on one core while the cost
model and the schedules count two. :func:`use_all_cores` sizes the pool to the physical
cores in this process's affinity mask, once, before a fusion_tvm kernel runs.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

_SYS_CPU = Path("/sys/devices/system/cpu")


def physical_cores() -> int:
    """Distinct physical cores among the CPUs this process may run on."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, (os.cpu_count() or 2) // 2)
    cores = set()
    for cpu in cpus:
        topo = _SYS_CPU / f"cpu{cpu}" / "topology"
        try:
            cores.add(((topo / "physical_package_id").read_text().strip(),
                       (topo / "core_id").read_text().strip()))
        except OSError:
            return len(cpus)
    return max(1, len(cores))


@functools.cache
def use_all_cores() -> int:
    """Size TVM's thread pool to :func:`physical_cores` unless the user chose a count.

    Returns the number of threads TVM will use. Idempotent; a user's ``TVM_NUM_THREADS``
    or ``OMP_NUM_THREADS`` is left alone.
    """
    import tvm

    chosen = os.environ.get("TVM_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS")
    if chosen:
        try:
            return max(1, int(chosen))
        except ValueError:
            return 1
    n = physical_cores()
    os.environ["TVM_NUM_THREADS"] = str(n)
    # The pool may already run (a kernel built and run at compile time): resize it too.
    tvm.get_global_func("runtime.config_threadpool")(1, n)
    logger.debug("TVM thread pool: %d threads", n)
    return n

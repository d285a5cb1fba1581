"""SortShapeFuncStores: emit the stores of VMShapeLower's shape functions in slot order.

``VMShapeLower`` computes derived symbolic dims (``n * 576``, ``n * 96``) in a host PrimFunc
of ``H[slot] = f(H[var slots])`` stores. It orders them by walking an ``unordered_map`` keyed
by ``StructuralHash`` of the expressions, and free TIR variables hash by address, so the
order follows where the allocator put the variables: two builds of the same model emit the
same stores in different orders, and the exported ``.so`` bytes differ (seen on random
graphs with symbolic dims, e.g. fuzz seeds 1, 4, 11; plan and VM bytecode identical). The
stores of one shape function read only variable slots, which no store of that function
writes, so any order computes the same heap; sorting them by slot makes the artefact
byte-identical. Runs after ``VMShapeLower``.
"""

from __future__ import annotations

import tvm
from tvm import tirx
from tvm.ir.expr import TensorLoad
from tvm.tirx.stmt import BufferStore, SeqStmt

# Expression fields that hold sub-expressions (binary ops, casts, selects, calls).
_FIELDS = ("a", "b", "value", "condition", "true_value", "false_value")


def _loaded_slots(expr, buffer, out: set[int]) -> bool:
    """Add the constant heap indices ``expr`` loads from ``buffer`` to ``out``; False when
    ``expr`` holds something this walk does not understand (then nothing is reordered)."""
    if isinstance(expr, (tirx.IntImm, tirx.FloatImm, tirx.Var)):
        return True
    if isinstance(expr, TensorLoad):  # a buffer load
        if not expr.source.same_as(buffer):
            return True
        if len(expr.indices) != 1 or not isinstance(expr.indices[0], tirx.IntImm):
            return False
        out.add(int(expr.indices[0]))
        return True
    if isinstance(expr, tvm.ir.Call):
        return all(_loaded_slots(arg, buffer, out) for arg in expr.args)
    children = [getattr(expr, f) for f in _FIELDS if hasattr(expr, f)]
    if not children:
        return False
    return all(_loaded_slots(c, buffer, out) for c in children)


def sort_stores(body):
    """``body`` with its stores in slot order, or ``body`` itself when it is not a sequence
    of independent constant-index stores into one buffer."""
    if not isinstance(body, SeqStmt):
        return body
    stores = list(body.seq)
    if len(stores) < 2 or not all(isinstance(s, BufferStore) for s in stores):
        return body
    buffer = stores[0].buffer
    written, read = [], set()
    for store in stores:
        if (not store.buffer.same_as(buffer) or len(store.indices) != 1
                or not isinstance(store.indices[0], tirx.IntImm)):
            return body
        written.append(int(store.indices[0]))
        if not _loaded_slots(store.value, buffer, read):
            return body
    if read & set(written) or len(set(written)) != len(written):
        return body  # a store feeds another: its order matters
    order = sorted(range(len(stores)), key=written.__getitem__)
    if order == list(range(len(stores))):
        return body
    return SeqStmt([stores[i] for i in order])


@tvm.transform.module_pass(opt_level=0, name="SortShapeFuncStores")
class SortShapeFuncStores:
    """Sort the independent heap stores of every host shape function by slot."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        """Return ``mod`` with the shape functions' stores in slot order."""
        updates = {}
        for gv, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc) or len(func.params) != 1:
                continue
            body = sort_stores(func.body)
            if not body.same_as(func.body):
                updates[gv] = func.with_body(body)
        for gv, func in updates.items():
            mod.update_func(gv, func)
        return mod

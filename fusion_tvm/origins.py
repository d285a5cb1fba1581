"""Which ONNX nodes each Relax binding computes, kept through the passes that rewrite them.

The importer knows which bindings each ONNX node emitted (:func:`import_origins`). The
passes before fusion then fold, decompose, re-layout and legalize those bindings, and TVM
keeps no trace of where a binding came from (spans are dropped by LegalizeOps, names are
reused: two ``lv5`` in one block after FoldBatchnormToConv2D). So the map is carried pass by
pass (:class:`OriginTracker`, a pass instrument) by :func:`carry`, which matches each binding
after a pass to the ones before it:

1. the same variable (most passes keep the var of a binding they only retype or relower);
2. else a removed binding of the same name, or whose name it extends (``lv5`` ->
   ``lv5_nchwc``), the candidate whose inputs come from the same ONNX nodes first;
3. a layout conversion a pass inserts (``R.layout_transform``, or a PrimFunc copying one
   tensor into a same-sized one) computes no ONNX node: it has no origin, and when it took
   the name of the op it converts, that op's origin goes to the binding it copies;
4. else the removed bindings that lay between the same neighbours (a BatchNorm folded into
   its conv: the new conv and bias add stand for the conv and the BatchNorm).

A binding no rule reaches has no origin (an empty tuple), which is what the plan shows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence

import tvm
from tvm import relax, tirx

from .tir_analysis import analyze_primfunc

#: Binding var -> names of the ONNX nodes it computes (empty: none).
Origins = dict[relax.Var, tuple[str, ...]]

_LAYOUT_TRANSFORM = tvm.ir.Op.get("relax.layout_transform")
_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


# ------------------------------------------------------------------------------- importing
def import_origins(func: relax.Function,
                   nodes: Iterable[tuple[str, Sequence[object]]]) -> Origins:
    """The bindings each ONNX node's converter made.

    ``nodes``: the ONNX nodes in graph order, each as its name and the Relax values of its
    outputs (a var, or a call the importer binds where it is first used). A node owns the
    bindings of its outputs and what they are computed from, up to other nodes' outputs;
    a binding that only renames another (``gv = lv9``) has its origin. Bindings no output
    leads to (the unused fields of a BatchNormalization's tuple) have none.
    """
    bindings = _bindings(func)
    by_var = {b.var: b for b in bindings}
    by_value: dict[relax.Expr, list[relax.Var]] = {}
    for b in bindings:
        if isinstance(b, relax.VarBinding):
            by_value.setdefault(b.value, []).append(b.var)
    owner: dict[relax.Var, int] = {}  # output var -> index of the first node producing it
    outputs: list[list[relax.Var]] = []
    for k, (_, values) in enumerate(nodes):
        mine = []
        for v in _exprs_in(values):
            for var in [v] if isinstance(v, relax.Var) else by_value.get(v, []):
                if var in by_var and owner.setdefault(var, k) == k:
                    mine.append(var)
        outputs.append(mine)
    out: Origins = {}
    for k, (name, _) in enumerate(nodes):
        stack = list(outputs[k])
        while stack:
            var = stack.pop()
            if var in out or owner.get(var, k) != k:
                continue
            out[var] = (name,)
            stack.extend(v for v in _used(by_var[var]) if v in by_var)
    for b in bindings:
        if b.var not in out and isinstance(b, relax.VarBinding) \
                and isinstance(b.value, relax.Var):
            out[b.var] = out.get(b.value, ())
    return out


def _exprs_in(values) -> Iterator[relax.Expr]:
    for v in values:
        if isinstance(v, relax.Tuple):
            yield from _exprs_in(v.fields)
        elif isinstance(v, relax.Expr):
            yield v


# ------------------------------------------------------------------------- through passes
@tvm.ir.instrument.pass_instrument
class OriginTracker:
    """Carries :data:`Origins` through every pass run while it is active (nested passes
    included: the map always refers to the module the last pass returned).

    A failure to match never fails the compile: the tracker stops, keeps no origins and
    says why in ``error``.
    """

    def __init__(self, mod: tvm.IRModule, origins: Mapping[relax.Var, tuple[str, ...]]):
        self.mod = mod
        self.origins: Origins = dict(origins)
        self.error: str | None = None

    def run_after_pass(self, mod, _info):  # noqa: D102
        if self.error is not None or mod.same_as(self.mod) or not _same_model(self.mod, mod):
            return  # nothing changed, or a module a pass builds on the side (FoldConstant's)
        try:
            self.origins = carry(self.mod, mod, self.origins)
        except Exception as err:  # noqa: BLE001 - names are a nicety; the build goes on
            self.error = f"{type(err).__name__}: {err}"
            self.origins = {}
        self.mod = mod

    def result(self, mod: tvm.IRModule) -> Origins:
        """The origins of ``mod``'s bindings (the module the passes returned)."""
        if self.error is None and not mod.same_as(self.mod):
            self.run_after_pass(mod, None)
        return self.origins if self.error is None else {}


@contextlib.contextmanager
def tracking(mod: tvm.IRModule, origins: Mapping | None) -> Iterator[OriginTracker | None]:
    """Run the body's passes under an :class:`OriginTracker` (None when there are no
    origins to carry); the current pass context's settings are kept."""
    if not origins:
        yield None
        return
    tracker = OriginTracker(mod, origins)
    cur = tvm.transform.PassContext.current()
    ctx = tvm.transform.PassContext(
        opt_level=cur.opt_level, required_pass=list(cur.required_pass),
        disabled_pass=list(cur.disabled_pass), config=dict(cur.config),
        instruments=[*cur.instruments, tracker])
    with ctx:
        yield tracker


def carry(old: tvm.IRModule, new: tvm.IRModule,
          origins: Mapping[relax.Var, tuple[str, ...]]) -> Origins:
    """The origins of ``new``'s bindings, from those of ``old`` (the module before a pass);
    see the module docstring for the rules."""
    out: Origins = {}
    if not origins:
        return out
    old_funcs = {gv.name_hint: f for gv, f in old.functions.items()
                 if isinstance(f, relax.Function)}
    for gv, func in new.functions.items():
        before = old_funcs.get(gv.name_hint)
        if not isinstance(func, relax.Function) or before is None:
            continue
        if func.same_as(before):
            out.update((b.var, origins[b.var]) for b in _bindings(func) if b.var in origins)
            continue
        out.update(_Matcher(before, func, origins, new).run())
    return out


class _Matcher:
    """Matches the bindings of one function after a pass to those before it."""

    def __init__(self, old: relax.Function, new: relax.Function, origins, mod: tvm.IRModule):
        self.old, self.new = _bindings(old), _bindings(new)
        self.mod = mod
        self.origins = origins
        self.old_of = {b.var: b for b in self.old}
        self.new_of = {b.var: b for b in self.new}
        self.old_users = _users(self.old)
        self.new_users = _users(self.new)
        self.out: Origins = {}
        self.counterpart: dict[relax.Var, relax.Var] = {}  # new var -> old var
        self._src_memo: dict[tuple[bool, relax.Var], frozenset] = {}
        self.old_params = {v.name: v for b in self.old for v in _used(b) if v not in self.old_of}

    def run(self) -> Origins:
        removed = [b for b in self.old if b.var not in self.new_of]
        by_name: dict[str, list[relax.Binding]] = {}
        for b in removed:
            by_name.setdefault(b.var.name, []).append(b)
        taken: set[relax.Var] = set()
        for b in self.new:
            if b.var in self.old_of:  # rule 1: the same var
                self.counterpart[b.var] = b.var
                self.out[b.var] = self.origins.get(b.var, ())
                continue
            match = self._by_name(b, by_name, taken)
            if match is not None:  # rule 2
                self.counterpart[b.var] = match.var
                self.out[b.var] = self.origins.get(match.var, ())
        # ops whose binding survives as plumbing only (a BatchNorm's tuple rebuilt from its
        # decomposition, a bias add now a field of a split): their work moved to new ops
        self.hollowed = {old for var, old in self.counterpart.items()
                         if _computes(self.old_of[old]) and not _computes(self.new_of[var])}
        for b in self.new:  # rule 3: layout conversions a pass inserted
            if b.var not in self.old_of and self._is_layout_copy(b):
                self._move_from_copy(b)
        for b in self.new:  # rule 4: what lay between the same neighbours
            if b.var not in self.out:
                self.out[b.var] = self._between(b, removed)
        return self.out

    # -- rule 2
    def _by_name(self, b, by_name, taken) -> relax.Binding | None:
        """The removed binding ``b`` took the name of: the same name, and inputs from the
        same places or a conversion of what it computed (a fresh ``lv35`` a rewrite emits
        reads something else than the ``lv35`` it replaced), else a name ``b``'s extends
        (``lv5_nchwc``). Among several, the closest inputs, then the same operator, then
        the first not taken yet."""
        name = b.var.name
        mine = self._sources(b.var, new=True)
        converts = {self.out.get(v, ()) for v in _used(b)} - {()}
        cands = [c for c in by_name.get(name, []) if mine & self._sources(c.var, new=False)
                 or self.origins.get(c.var, ()) in converts]
        exact = bool(cands)
        if not exact:
            bases = [n for n in by_name if name.startswith(n + "_")]
            cands = by_name[max(bases, key=len)] if bases else []
        if not cands:
            return None

        def score(c):
            return (len(mine & self._sources(c.var, new=False)), _same_op(c, b),
                    c.var not in taken)

        best = max(score(c) for c in cands)
        pick = next(c for c in cands if score(c) == best)
        if exact:
            taken.add(pick.var)
        return pick

    def _sources(self, var: relax.Var, new: bool, depth: int = 4) -> frozenset:
        """What a binding reads, as stable keys: the ONNX nodes of its inputs (through
        inputs without one), and parameters by name."""
        key = (new, var)
        if key in self._src_memo:
            return self._src_memo[key]
        table = self.new_of if new else self.old_of
        origins = self.out if new else self.origins
        found: set = set()
        binding = table.get(var)
        if binding is not None:
            for v in _used(binding):
                if v not in table:
                    found.add(("param", v.name))
                elif origins.get(v):
                    found.update(("onnx", n) for n in origins[v])
                elif depth:
                    found |= self._sources(v, new, depth - 1)
        result = frozenset(found)
        self._src_memo[key] = result
        return result

    # -- rule 3
    def _is_layout_copy(self, b: relax.Binding) -> bool:
        value = b.value if isinstance(b, relax.VarBinding) else None
        if not isinstance(value, relax.Call):
            return False
        if value.op.same_as(_LAYOUT_TRANSFORM):
            return True
        if not value.op.same_as(_CALL_TIR):
            return False
        func = self.mod[value.args[0]] if isinstance(value.args[0], tvm.ir.GlobalVar) else None
        args = value.args[1].fields if isinstance(value.args[1], relax.Tuple) else []
        if not isinstance(func, tirx.PrimFunc) or len(args) != 1 or len(func.params) != 2:
            return False
        info = analyze_primfunc(func)
        if not info.blocks or any(blk.num_reduce_axes or any(blk.ops.values())
                                  for blk in info.blocks):
            return False
        sizes = [_size(shape) for shape in info.param_shapes]
        return None not in sizes and tvm.sym.Analyzer().can_prove_equal(*sizes)

    def _move_from_copy(self, b: relax.Binding) -> None:
        named = self.out.pop(b.var, ())
        self.out[b.var] = ()
        source = next(iter(_used(b)), None)
        producer = self.new_of.get(source) if source is not None else None
        if not named or producer is None or producer.var in self.old_of:
            return
        if not self.out.get(producer.var) and not self._is_layout_copy(producer):
            self.out[producer.var] = named

    # -- rule 4
    def _between(self, b: relax.Binding, removed: list[relax.Binding]) -> tuple[str, ...]:
        matched = set(self.counterpart.values())
        free = {r.var for r in removed if r.var not in matched} | self.hollowed
        up = self._anchors(b.var, upward=True)
        down = self._anchors(b.var, upward=False)
        after = _reach(up, lambda v: self.old_users.get(v, ()), free) if up else None
        before = _reach(down, lambda v: _used(self.old_of[v]) if v in self.old_of else (),
                        free) if down else None
        hit = after & before if after is not None and before is not None \
            else after or before or set()
        hit |= down & self.hollowed  # the op it feeds was taken apart
        if not hit:  # or rewritten in place: x**3 as (x * x) * x
            hit = {v for v in down if v in self.new_of
                   and not _same_op(self.old_of[v], self.new_of[v])}
        names: list[str] = []
        for r in self.old:
            if r.var in hit:
                names.extend(n for n in self.origins.get(r.var, ()) if n not in names)
        return tuple(names)

    def _anchors(self, var: relax.Var, upward: bool) -> set[relax.Var]:
        """The nearest old vars around ``var`` in the new function: matched bindings'
        counterparts (and parameters, upward), found through unmatched bindings."""
        anchors: set[relax.Var] = set()
        seen = {var}
        stack = [var]
        while stack:
            v = stack.pop()
            nxt = _used(self.new_of[v]) if upward and v in self.new_of else \
                self.new_users.get(v, ()) if not upward else ()
            for w in nxt:
                if w in seen:
                    continue
                seen.add(w)
                if w in self.counterpart:
                    anchors.add(self.counterpart[w])
                elif w not in self.new_of:
                    if w.name in self.old_params:
                        anchors.add(self.old_params[w.name])
                else:
                    stack.append(w)
        return anchors


def _same_op(a: relax.Binding, b: relax.Binding) -> bool:
    va, vb = getattr(a, "value", None), getattr(b, "value", None)
    if isinstance(va, relax.Call) and isinstance(vb, relax.Call):
        return bool(va.op.same_as(vb.op))
    return type(va) is type(vb)


def _computes(binding: relax.Binding) -> bool:
    """Whether a binding computes (a call), rather than plumbs (a tuple, a field, a var)."""
    return isinstance(getattr(binding, "value", None), relax.Call)


def _reach(start: set, step, within: set) -> set:
    """Vars in ``within`` reachable from ``start`` by ``step``, through ``within`` only."""
    seen: set = set()
    stack = list(start)
    while stack:
        for w in step(stack.pop()):
            if w in within and w not in seen:
                seen.add(w)
                stack.append(w)
    return seen


def _same_model(old: tvm.IRModule, new: tvm.IRModule) -> bool:
    """Whether ``new`` is ``old`` after a pass: their Relax functions' names and
    parameter names agree."""
    def signature(mod):
        return {gv.name_hint: tuple(p.name for p in f.params)
                for gv, f in mod.functions.items() if isinstance(f, relax.Function)}

    return bool(signature(new)) and signature(new) == signature(old)


def _bindings(func: relax.Function) -> list[relax.Binding]:
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        return []
    return [b for block in body.blocks for b in block.bindings]


def _used(binding: relax.Binding) -> list[relax.Var]:
    value = binding.value
    return list(relax.analysis.free_vars(value)) if isinstance(value, relax.Expr) else []


def _users(bindings: list[relax.Binding]) -> dict[relax.Var, list[relax.Var]]:
    users: dict[relax.Var, list[relax.Var]] = {}
    for b in bindings:
        for v in _used(b):
            users.setdefault(v, []).append(b.var)
    return users


def _size(shape) -> tirx.PrimExpr | None:
    """The number of elements of a buffer shape (symbolic where its dims are)."""
    if not shape:
        return None
    size = tirx.const(1, "int64")
    for d in shape:
        size = size * tirx.Cast("int64", d) if not isinstance(d, int) else size * d
    return size

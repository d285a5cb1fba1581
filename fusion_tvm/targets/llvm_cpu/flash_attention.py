"""FlashAttention rule: ``softmax(score(Q K^T)) V`` with an online softmax, on CPU.

The fused attention PrimFunc is matched to its :class:`~fusion_tvm.online_softmax.
AttentionForm` and replaced by an equivalent kernel written out loop by loop (TIR
schedule primitives cannot turn a softmax into its running-max form). One parallel loop
runs over (batch dims, tiles of ``row_groups x ROW_BLOCK`` query rows). For each block of
``key_vectors`` SIMD vectors of keys, each group of ``ROW_BLOCK`` rows of the tile

* computes its ``ROW_BLOCK x key_block`` scores in register tiles (every K^T vector loaded
  serves all rows), then the score function (scale, mask) and the block's row max;
* rescales its running sum and output accumulators by ``exp(m_old - m_new)`` and turns
  the scores into exponentials, summing them (vector partials halved to one lane);
* adds ``p V`` into ``ROW_BLOCK x col_tile`` vector accumulators.

The K / V block (``key_block x (dk + dv)``) is read by every group of the tile while it is
in cache; only one block of scores and the tile's accumulators exist, whatever the
sequence length (the row-wise rule, :mod:`.attention`, holds whole ``ROW_BLOCK x S``
rows). A partial last block of keys reads clamped indices and gives the extra keys a
``-inf`` score; a partial last tile of query rows recomputes the last row (same values,
written twice): no vector loop carries a guard. K and V are read in place when their
loads are contiguous along the key / column, else copied once, before the row loop,
into ``[batch..., dk, S]`` / ``[batch..., S, dv]``. The blocks after ``P V`` (an output
transpose) are moved into the row loop.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.ir.expr import TensorLoad
from tvm.s_tir.schedule import ScheduleError

from ...hardware import HardwareSpec
from ...online_softmax import AttentionForm, match_attention
from ...tir_expr import free_vars, substitute
from ..base import ScheduleRule
from ..tir_writer import AttentionWriter, block_name, seq, static_int
from ._util import lanes, parallel_vectorize
from .attention import attention_parallel_pays
from .row_schedule import vectorize_row

#: Query rows of one register tile: each K^T / V vector loaded serves all of them.
ROW_BLOCK = 4
#: Register-tile row groups per parallel tile: they share each K / V block in cache.
ROW_GROUPS = 4
#: SIMD vectors of keys per block of the online softmax.
KEY_VECTORS = 8
#: SIMD vectors of score (and output) columns in one register tile ...
TILE_VECTORS = 4
#: ... and at most (a remainder block of keys takes what divides it).
TILE_VECTORS_MAX = 6

_SERIAL, _VEC, _UNROLL = tirx.ForKind.SERIAL, tirx.ForKind.VECTORIZED, tirx.ForKind.UNROLLED


class FlashAttention(ScheduleRule):
    """Online-softmax attention: blocks of keys, running max / sum / output in cache."""

    name = "flash_attention"

    def __init__(self, key_vectors: int = KEY_VECTORS, row_groups: int = ROW_GROUPS):
        self.key_vectors = key_vectors
        self.row_groups = row_groups

    def apply(
        self, func: tirx.PrimFunc, target: tvm.target.Target, hw: HardwareSpec
    ) -> s_tir.Schedule | None:
        form = match_attention(func)
        if form is None:
            return None
        kernel = _Kernel(form, lanes(hw, 32), hw.num_vector_registers, self.key_vectors,
                         self.row_groups)
        sch = s_tir.Schedule(kernel.build())
        loops = sch.get_loops(sch.get_sblock(_Kernel.CORE))
        row = sch.fuse(*loops) if len(loops) > 1 else loops[0]
        if attention_parallel_pays(hw, func, form.static_rows):
            sch.parallel(row)
        for name in kernel.epilogue_names:
            block = sch.get_sblock(name)
            try:
                sch.reverse_compute_at(block, row, preserve_unit_loops=True)
                vectorize_row(sch, block, kernel.width)
            except ScheduleError:
                parallel_vectorize(sch, block, hw)
        for name in kernel.staged_names:
            parallel_vectorize(sch, sch.get_sblock(name), hw)
        return sch


def _contiguous(term, var) -> bool:
    """Whether ``term`` is a plain load whose last index is ``var`` and no other uses it."""
    if not isinstance(term, TensorLoad):
        return False
    *lead, last = term.indices
    return last.same_as(var) and not any(var in free_vars(i) for i in lead)


class _Kernel(AttentionWriter):
    """Writes the online-softmax PrimFunc of one :class:`AttentionForm`."""

    CORE = "flash_attention"

    def __init__(self, form: AttentionForm, width: int, registers: int, key_vectors: int,
                 row_groups: int):
        super().__init__(form)
        self.width = width
        sq = static_int(self.sq)
        self.rb = ROW_BLOCK
        groups = row_groups
        if sq is not None:  # fewest recomputed rows in the last tile, then the widest tile
            groups = min(range(1, row_groups + 1),
                         key=lambda g: (-(-sq // (self.rb * g)) * self.rb * g - sq, -g))
        self.groups = groups
        self.tile_rows = self.rb * groups
        self.clamp_rows = sq is None or sq % self.tile_rows != 0
        # A register tile: rb x t accumulators, t loaded vectors and one broadcast.
        self.tile_vectors = max(1, min(TILE_VECTORS_MAX, (registers - 2) // (self.rb + 1)))
        self.tile = width * min(TILE_VECTORS, self.tile_vectors)
        self.kb = max(self.tile, width * key_vectors // self.tile * self.tile)
        self.col_tile = self._tile_for(self.dv) if self.dv % width == 0 else self.dv
        self.root_allocs: list = []
        self.staged: list = []
        self.staged_names: list[str] = []
        self.padded_keys = False
        self.epilogue_names = [n for n in map(block_name, form.epilogue) if n]
        f32 = self.dtype
        self.scores = tirx.decl_buffer([self.rb, self.kb], f32, "scores", scope="local")
        self.m_run = tirx.decl_buffer([self.tile_rows], f32, "m_run", scope="local")
        self.l_run = tirx.decl_buffer([self.tile_rows], f32, "l_run", scope="local")
        self.acc = tirx.decl_buffer([self.tile_rows, self.dv], f32, "acc_o", scope="local")
        self.part = tirx.decl_buffer([width], f32, "part", scope="local")
        self.scal = tirx.decl_buffer([2], f32, "scal", scope="local")
        self.bvars = [tirx.Var(f"vb{k}", self.ity) for k in range(len(self.batch))]
        self.vq = tirx.Var("vq", self.ity)

    def _tile_for(self, cols: int) -> int:
        """Columns of the widest register tile (at most ``tile_vectors`` vectors) that
        divides ``cols`` (a multiple of the vector width)."""
        vectors = cols // self.width
        t = max(k for k in range(1, min(self.tile_vectors, vectors) + 1) if vectors % k == 0)
        return t * self.width

    def vec(self, name: str, extent, body_fn):
        """A vector loop of ``extent`` lanes as an unrolled loop of one-register vectors
        where it spans several: LLVM legalises a 48- or 96-lane vector (a remainder block
        of 3 or 6 vectors) element by element through the stack (TinyViT's 49-key windows
        ran at 31 GFLOP/s)."""
        w, n = self.width, static_int(extent)
        if n is not None and n > w and n % w == 0:
            return self.loop(f"{name}o", n // w, lambda o: self.loop(
                name, w, lambda i: body_fn(o * self.c(w) + i), _VEC), _UNROLL)
        return self.loop(name, extent, body_fn, _VEC)

    def segments(self) -> list[tuple]:
        """The key blocks as ``(count, columns, masked)`` runs, in order: blocks of ``kb``
        keys, of one register tile, of the remaining whole vectors (one block when static),
        and a masked block of one vector for the last partial vector."""
        sk, kb, tile, w, c = self.sk, self.kb, self.tile, self.width, self.c
        static = static_int(sk)
        if static is not None:
            rest = static % tile
            runs = [(static // kb, kb, False), (static % kb // tile, tile, False),
                    (1 if rest >= w else 0, rest // w * w, False),
                    (1 if rest % w else 0, w, True)]
            return [(c(n), cols, m) for n, cols, m in runs if n > 0]
        fm, fd = tirx.floormod, tirx.floordiv
        return [(fd(sk, c(kb)), kb, False), (fd(fm(sk, c(kb)), c(tile)), tile, False),
                (fd(fm(sk, c(tile)), c(w)), w, False), (fm(sk, c(w)) > c(0), w, True)]

    # -------------------------------------------------------------------------- helpers
    def row_vars(self, row):
        """Canonical row var -> index for tile row ``row`` (clamped to the last row)."""
        q = self.vq * self.c(self.tile_rows) + row
        if self.clamp_rows:
            q = tirx.Min(q, self.sq - self.c(1))
        return {**dict(zip(self.batch, self.bvars, strict=True)), self.query: q}

    # ------------------------------------------------------------------------- operands
    def _stage(self, name: str, term, extents: list, order: list, pad=None):
        """A root block copying ``term`` into a new ``[batch..., *extents]`` buffer;
        ``pad = (axis, extent)`` zero-fills that axis from ``extent`` on (the buffer is
        ``extents`` long there, ``term`` read clamped)."""
        c = self.c
        shape = [c(e) if isinstance(e, int) else e for e in (*self.batch_ext, *extents)]
        buf = tirx.decl_buffer(shape, self.dtype, name)
        self.root_allocs.append(buf)
        ivars = [tirx.Var(f"v{k}", self.ity) for k in range(len(shape))]
        ivs = self.iter_vars(shape, ivars)
        mapping = dict(zip([*self.batch, *order], ivars, strict=True))
        if pad is None:
            value = substitute(term, mapping)
        else:
            axis, valid = pad
            var = ivars[len(self.batch) + axis]
            clamped = {**mapping, order[axis]: tirx.Min(var, valid - c(1))}
            value = tirx.if_then_else(var < valid, substitute(term, clamped), self.f(0.0))
        block = s_tir.SBlock(ivs, [], [], name, tirx.BufferStore(buf, value, ivars))
        self.staged.append((block, shape))
        self.staged_names.append(name)
        return buf

    def operands(self):
        """``k_load(j, k, masked)`` and ``v_load(j, d)`` at the current batch indices.

        K is read in place when it is contiguous along the keys (clamped in a masked block);
        else copied once into ``[batch..., dk, S]`` padded with zeros to whole vectors, so
        a masked block reads it unclamped (clamped lanes would be gathers)."""
        form, bmap, c = self.form, dict(zip(self.batch, self.bvars, strict=True)), self.c
        if _contiguous(form.k_term, form.key):
            def k_load(j, k, masked):
                j = tirx.Min(j, self.sk - c(1)) if masked else j
                return substitute(form.k_term, {**bmap, form.key: j, form.red: k})
        else:
            w = c(self.width)
            padded = tirx.floordiv(self.sk + w - c(1), w) * w
            static = static_int(self.sk)
            if static is not None:
                padded = c(-(-static // self.width) * self.width)
            kt = self._stage("flash_kt", form.k_term, [self.dk, padded], [form.red, form.key],
                             pad=(1, self.sk))

            def k_load(j, k, masked):
                return self.ld(kt, [*self.bvars, k, j])
        if _contiguous(form.v_term, form.col):
            def v_load(j, d):
                return substitute(form.v_term, {**bmap, form.key: j, form.col: d})
        else:
            vv = self._stage("flash_v", form.v_term, [self.sk, self.dv], [form.key, form.col])

            def v_load(j, d):
                return self.ld(vv, [*self.bvars, j, d])
        return k_load, v_load

    # ---------------------------------------------------------------------- the kernel
    def _halve(self, op):
        """``part[0] = op`` over all lanes of ``part``, halving the vector each step."""
        steps, half = [], self.width // 2
        while half >= 1:
            steps.append(self.loop("w", half, lambda w, h=half: self.st(
                self.part, op(self.ld(self.part, [w]), self.ld(self.part, [w + self.c(h)])),
                [w]), _VEC if half > 1 else _SERIAL))
            half //= 2
        return seq(*steps)

    def _lanes(self, cols: int, init, lane_fn):
        """``part = init``, then ``lane_fn(jj, w)`` over every vector of ``cols`` keys."""
        w_ = self.width
        fill = self.loop("w", w_, lambda w: self.st(self.part, init, [w]), _VEC)
        body = self.loop("cv", cols // w_, lambda cv: self.loop(
            "w", w_, lambda w: lane_fn(cv * self.c(w_) + w, w), _VEC))
        return seq(fill, body)

    def _group(self, g, j0, cols: int, masked: bool, k_load, v_load):
        """One register-tile group of rows against the ``cols`` keys from ``j0``."""
        form, ld, st, c = self.form, self.ld, self.st, self.c
        rb, sc, part, scal = self.rb, self.scores, self.part, self.scal
        neg_inf = self.f(float("-inf"))
        score_tile = self._tile_for(cols)

        def key(jj):
            return tirx.Min(j0 + jj, self.sk - c(1)) if masked else j0 + jj

        def trow(rr):
            return g * c(rb) + rr

        zero = self.loop("rr", rb, lambda rr: self.vec(
            "jj", cols, lambda jj: st(sc, self.f(0.0), [rr, jj])))

        def qk_tile(ct):
            def per_k(kk):
                def per_row(rr):
                    def per_col(jv):
                        jj = ct * c(score_tile) + jv
                        q = substitute(form.q_term, {**self.row_vars(trow(rr)), form.red: kk})
                        return st(sc, ld(sc, [rr, jj]) + q * k_load(j0 + jj, kk, masked),
                                  [rr, jj])
                    return self.vec("jv", score_tile, per_col)
                return self.loop("rr", rb, per_row, _UNROLL)
            return self.loop("kk", self.dk, per_k)
        qk = self.loop("ct", cols // score_tile, qk_tile)

        def softmax_row(rr):
            t = trow(rr)

            def score_lane(jj, w):
                s = substitute(form.score, {**self.row_vars(t), form.key: key(jj),
                                            form.acc: ld(sc, [rr, jj])})
                if masked:
                    s = tirx.Select(j0 + jj < self.sk, s, neg_inf)
                return seq(st(sc, s, [rr, jj]),
                            st(part, tirx.Max(ld(part, [w]), ld(sc, [rr, jj])), [w]))

            def exp_lane(jj, w):
                p = form.exp(ld(sc, [rr, jj]) - ld(self.m_run, [t]))
                return seq(st(sc, p, [rr, jj]), st(part, ld(part, [w]) + ld(sc, [rr, jj]), [w]))
            # scal[0]: the new running max; scal[1]: exp(m_old - m_new)
            rescale = seq(
                st(scal, tirx.Max(ld(self.m_run, [t]), ld(part, [c(0)])), [c(0)]),
                st(scal, form.exp(ld(self.m_run, [t]) - ld(scal, [c(0)])), [c(1)]),
                st(self.m_run, ld(scal, [c(0)]), [t]),
            )
            update = seq(
                st(self.l_run, ld(self.l_run, [t]) * ld(scal, [c(1)]) + ld(part, [c(0)]), [t]),
                self.vec("d", self.dv, lambda d: st(
                    self.acc, ld(self.acc, [t, d]) * ld(scal, [c(1)]), [t, d])),
            )
            return seq(self._lanes(cols, neg_inf, score_lane), self._halve(tirx.Max), rescale,
                        self._lanes(cols, self.f(0.0), exp_lane), self._halve(tirx.Add), update)
        softmax = self.loop("rr", rb, softmax_row)

        def pv_tile(dc):
            def per_key(jj):
                def per_row(rr):
                    def per_col(dd):
                        d = dc * c(self.col_tile) + dd
                        return st(self.acc, ld(self.acc, [trow(rr), d]) +
                                  ld(sc, [rr, jj]) * v_load(key(jj), d), [trow(rr), d])
                    return self.vec("dd", self.col_tile, per_col)
                return self.loop("rr", rb, per_row, _UNROLL)
            return self.loop("jj", cols, per_key)
        pv = self.loop("dc", self.dv // self.col_tile, pv_tile)
        return seq(zero, qk, softmax, pv)

    def _core_body(self):
        form, ld, st, c = self.form, self.ld, self.st, self.c
        k_load, v_load = self.operands()
        init = self.loop("t", self.tile_rows, lambda t: seq(
            st(self.m_run, form.max_init, [t]), st(self.l_run, self.f(0.0), [t]),
            self.vec("d", self.dv, lambda d: st(self.acc, self.f(0.0), [t, d]))))
        runs, base = [], c(0)
        for count, cols, masked in self.segments():
            def block(b, start=base, cols=cols, masked=masked):
                j0 = start + b * c(cols)
                return self.loop("g", self.groups, lambda g: self._group(
                    g, j0, cols, masked, k_load, v_load))
            if masked:  # at most one, when the last vector is partial
                runs.append(tirx.IfThenElse(count, block(c(0)), None)
                            if not isinstance(count, tirx.IntImm) else block(c(0)))
                continue
            runs.append(self.loop("kb", count, block))
            base = base + count * c(cols)

        def write_row(t):
            def col(d):
                index = [substitute(i, {**self.row_vars(t), form.col: d})
                         for i in form.out_indices]
                return st(form.out, ld(self.acc, [t, d]) * ld(self.scal, [c(0)]), index)
            inv = st(self.scal, self.f(1.0) / ld(self.l_run, [t]), [c(0)])
            return seq(inv, self.vec("d", self.dv, col))
        return seq(init, *runs, self.loop("t", self.tile_rows, write_row))

    def build(self) -> tirx.PrimFunc:
        """The kernel: staged operands, the row loop, the original epilogue."""
        c, form = self.c, self.form
        body = self._core_body()
        nq = tirx.floordiv(self.sq + c(self.tile_rows - 1), c(self.tile_rows))
        extents = [*self.batch_ext, nq]
        ivs = self.iter_vars(extents, [*self.bvars, self.vq])
        local = [self.scores, self.m_run, self.l_run, self.acc, self.part, self.scal]
        core = s_tir.SBlock(ivs, [], [], self.CORE, body, alloc_buffers=local)
        buffers = {b: b for b in [*form.func.params, *form.allocs, *self.root_allocs]}
        nests = [self.nest(blk, shape, buffers) for blk, shape in self.staged]
        nests.append(self.nest(core, extents, buffers))
        root = s_tir.SBlock([], [], [], "root", seq(*nests, *form.epilogue),
                            alloc_buffers=[*form.allocs, *self.root_allocs])
        return form.func.with_body(s_tir.SBlockRealize([], True, root))

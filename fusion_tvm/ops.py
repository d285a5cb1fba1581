"""Op kinds: the only place that names kinds of work; everything else uses these enums."""

import enum


class OpClass(str, enum.Enum):
    """Throughput classes of work; peak FLOP/s is given per class."""

    MATMUL = "matmul"  # dense / batch-matmul / conv (im2col-like, FMA-bound)
    CONV = "conv"
    ELEMENTWISE = "elementwise"  # one arithmetic op per element
    REDUCTION = "reduction"
    TRANSCENDENTAL = "transcendental"  # exp / tanh / erf / sqrt per element


class PatternKind(enum.IntEnum):
    """TVM's ``OpPatternKind`` as annotated by ``AnnotateTIROpPattern``."""

    ELEMWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    COMM_REDUCE = 3
    OUT_EWISE_FUSABLE = 4
    TUPLE = 7
    OPAQUE = 8

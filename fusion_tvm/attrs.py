"""Attribute names fusion_tvm writes on PrimFuncs: one place, read by passes and rules."""

#: The schedule rule that scheduled a PrimFunc.
RULE_ATTR = "fusion_tvm.rule"
#: TVM's mark of a scheduled PrimFunc (later schedulers leave it alone).
SCHEDULED_ATTR = "tirx.is_scheduled"
#: The tuned knob values a PrimFunc was scheduled with.
KNOBS_ATTR = "fusion_tvm.knobs"
#: Indices of a PrimFunc's parameters that are compile-time constants at every call site.
CONSTANT_PARAMS_ATTR = "fusion_tvm.constant_params"
#: Marks a block that only repacks a constant parameter (run once at compile time).
PREPACK_ATTR = "fusion_tvm.prepack"

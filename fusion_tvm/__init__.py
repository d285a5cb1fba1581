"""fusion_tvm: cost-model-driven operator fusion for Apache TVM Relax."""

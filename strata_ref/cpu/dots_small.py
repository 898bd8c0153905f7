"""ggml-cpu's dots of the float types (F32, F16, BF16) and of the small and
32-value block types (Q1_0, Q2_0, MXFP4, NVFP4, IQ4_NL, TQ1_0, TQ2_0), per
CPU profile: not written yet (the types still run on the oracle's
dequantized weights, `matmul.QMatrix`)."""

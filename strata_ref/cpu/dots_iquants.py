"""ggml-cpu's dots of the 256-value I-quants (IQ2_XXS, IQ2_XS, IQ2_S,
IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, IQ4_XS) with Q8_K activations, per CPU
profile: not written yet (the types still run on the oracle's dequantized
weights, `matmul.QMatrix`)."""

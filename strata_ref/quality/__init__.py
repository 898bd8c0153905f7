"""What a quantization costs, measured with strata-ref's exact arithmetic.

Modules: `prompts` (the default prompt set, prompt files), `variants`
(`FILE`, `FILE@float`, `FILE@TYPE`, `FILE@a8token`), `kl` (KL divergence on
the positions a model generates, with the noise floor), `layers` (crest
factors, per-linear errors, single-layer sensitivity), `charts`
(matplotlib), `report` (text and JSON). See docs/quality.md.
"""

"""GEMM and mat-vec routes as oracles (../shared/spec/kernels.md §§6-11)."""

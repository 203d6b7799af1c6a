"""CuTe DSL kernels. Families: sm80 (mma.sync + cp.async); common holds shared pieces."""

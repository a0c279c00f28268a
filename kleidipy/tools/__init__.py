"""Tools around the library and the runtime, apart from both: tracing, layout pictures, the golden verifier,
llama-bench-style benchmarks, quantization, synthetic models and the emulator report."""

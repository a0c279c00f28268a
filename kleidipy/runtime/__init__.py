"""The LLM runtime, as llama.cpp's CPU backend runs a model: the GGUF container and the model file checked against
its architecture (``gguf_file``, ``model_file``, ``hparams``, ``architecture``, ``architectures/``), the backend
that repacks every weight once for the target's KleidiAI kernels (``backend``), the transformer ops and the
decoder driver (``layers``, ``kv_cache``, ``weights``), tokenizer, chat templates and sampler, the generation
engine (``generate``), the model catalogue and fetcher (``pull``) and load-time tensor checks (``tensor_check``).
It sits above the compiled plan (:mod:`kleidipy.graph`) and the ops both run (:mod:`kleidipy.ops`), as llama.cpp's
model code sits above ggml; its events go to :mod:`kleidipy.observer`."""

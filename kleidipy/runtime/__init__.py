"""The LLM runtime, as llama.cpp's CPU backend runs a model: the GGUF container and the model file checked against
its architecture (``gguf_file``, ``model_file``, ``hparams``, ``architecture``, ``architectures/``), the backend
that repacks every weight once for the target's KleidiAI kernels (``backend``), the transformer ops and the
decoder driver (``layers``, ``kv_cache``, ``weights``), tokenizer, chat templates and sampler, the generation
engine (``generate``), the model catalogue and fetcher (``pull``), load-time tensor checks (``tensor_check``) and
the observer interface (``observer``)."""

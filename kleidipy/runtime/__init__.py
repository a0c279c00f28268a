"""The LLM runtime side: model catalogue and fetcher, GGUF tokenizer, chat templates."""

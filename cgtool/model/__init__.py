"""One Llama-family decoder (Llama, Mistral, Qwen2, Qwen3) and its weight loader."""

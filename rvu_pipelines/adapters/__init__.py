"""LoRA adapters on the agent's own weights (seed 000 E4-E7): train, write, verify, load, gate, measure.

``training`` trains with peft on the de-quantised GGUF; ``files`` writes safetensors + manifest and refuses
bad files before anything is loaded; ``host`` loads / unloads / fuses verified adapters in transformers with
lifecycle events; ``gguf_lora`` + ``models.llama_adapters`` do the same in the agent's llama.cpp runtime.
"""

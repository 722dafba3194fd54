"""Built-in backbones: Dream and LLaDA on native transformers classes, with their samplers."""

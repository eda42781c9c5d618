"""Training of the built-in model lumo-tiny: corpus, tokenizer, trunk + MTP, EAGLE head, export and card."""
